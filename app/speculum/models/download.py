"""Downloading model files from the Hub into the library: resumable, verified, atomic.

Bytes stream into ``<library>/.partial/<repo>/<file>.part`` beside a small JSON that
remembers which version (ETag) they belong to, so a dropped connection is retried
from where it stopped and a restart resumes the same file. Each file is hashed while
it streams and checked against the Hub's LFS sha256. Only when every file of the set
is complete and verified are they moved (an atomic rename on the same disk) into the
library; a cancel removes what this set staged, and nothing half-done is ever listed.

huggingface_hub's own ``hf_hub_download`` is not used for the transfer: its temporary
files are unique per process and deleted on failure, so it cannot resume after a
restart, and it reports progress in 10 MB steps with no way to stop mid-file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import httpx2
from huggingface_hub import constants
from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

from .. import paths
from ..errors import SpeculumError
from .remote import HubRef, RemoteFile, hub_error, offline, request_headers, resolve
from .stamps import read_stamp, write_stamp

MiB = 1 << 20
DISK_MARGIN = 256 * MiB  # never fill the disk to the last byte
PROGRESS_STEP = 1 * MiB
MAX_STALLED_RETRIES = 5  # reconnects in a row that bring no new byte
STAGING = ".partial"


class DownloadCancelled(SpeculumError):
    """The user cancelled: what this download staged is removed."""


class DownloadPaused(SpeculumError):
    """Stopped on request with the partial files kept; the next run resumes them."""


class CancelToken:
    """Ask a running download to stop, from any thread."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.keep_partial = False

    def cancel(self) -> None:
        self.keep_partial = False
        self._event.set()

    def pause(self) -> None:
        self.keep_partial = True
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()


@dataclass(frozen=True)
class FileRequest:
    ref: HubRef
    sha256: str | None = None  # the catalog's hash, used only when the Hub gives none


@dataclass(frozen=True)
class DownloadProgress:
    file: str
    file_index: int  # 1-based
    file_count: int
    file_done: int
    file_total: int
    done: int
    total: int
    speed: float  # bytes per second over the last seconds
    eta: float | None  # seconds left, None while unknown
    phase: str  # "checking", "downloading", "verifying", "done"

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0

    @property
    def file_fraction(self) -> float:
        return self.file_done / self.file_total if self.file_total else 1.0


Progress = Callable[[DownloadProgress], None]
DiskUsage = Callable[[str | os.PathLike], "shutil._ntuple_diskusage"]


def repo_folder(repo: str) -> str:
    return repo.replace("/", "--")


def library_path(ref: HubRef, root: Path) -> Path:
    """Where a Hub file lives in the library: one folder per repo, shards side by side."""
    return root / repo_folder(ref.repo) / ref.filename


def _free_space(where: Path, disk_usage: DiskUsage) -> int:
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return disk_usage(probe).free


def _disk_error(exc: OSError, where: Path) -> SpeculumError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SpeculumError(f"The disk holding {where} is full. The partial download is kept; free some "
                             "space and run the download again to resume it.")
    return SpeculumError(f"Cannot write {where}: {exc.strerror or exc}.")


class _Rate:
    """Speed over a sliding window, so a stall shows at once and a burst does not linger."""

    def __init__(self, window: float = 5.0):
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, moved: int) -> float:
        now = time.monotonic()
        self.samples.append((now, moved))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window:
            self.samples.popleft()
        span = now - self.samples[0][0]
        return (moved - self.samples[0][1]) / span if span > 0 else 0.0


@dataclass
class _Staged:
    request: FileRequest
    remote: RemoteFile
    part: Path
    meta: Path
    have: int = 0  # bytes already staged for this version
    verified: bool = False
    sha256: str | None = None

    @property
    def expected_sha256(self) -> str | None:
        return self.remote.sha256 or self.request.sha256


@dataclass
class _Tracker:
    files: list[_Staged]
    progress: Progress | None
    total: int
    done: int = 0
    moved: int = 0  # bytes transferred by this run, for the speed
    rate: _Rate = field(default_factory=_Rate)
    speed: float = 0.0
    last_emit: int = -PROGRESS_STEP

    def emit(self, index: int, file_done: int, phase: str, force: bool = False) -> None:
        if self.progress is None or (not force and self.done - self.last_emit < PROGRESS_STEP):
            return
        self.last_emit = self.done
        self.speed = self.rate.add(self.moved)
        left = self.total - self.done
        eta = left / self.speed if self.speed > 0 else (0.0 if left == 0 else None)
        staged = self.files[index]
        self.progress(DownloadProgress(staged.remote.ref.filename, index + 1, len(self.files), file_done,
                                       staged.remote.size, self.done, self.total, self.speed, eta, phase))


def _stage(request: FileRequest, remote: RemoteFile, staging: Path) -> _Staged:
    folder = staging / repo_folder(remote.ref.repo)
    part = folder / (remote.ref.filename + ".part")
    meta = folder / (remote.ref.filename + ".part.json")
    staged = _Staged(request, remote, part, meta)
    try:
        info = json.loads(meta.read_text())
        size = part.stat().st_size
    except (OSError, ValueError):
        return staged
    if info.get("etag") != remote.etag or size > remote.size:
        # a different version on the Hub now, or garbage: start this file over
        part.unlink(missing_ok=True)
        meta.unlink(missing_ok=True)
        return staged
    staged.have = size
    if info.get("verified") and size == remote.size and info.get("mtime_ns") == part.stat().st_mtime_ns:
        staged.verified, staged.sha256 = True, info.get("sha256")
    return staged


def _write_meta(staged: _Staged, **extra) -> None:
    staged.meta.write_text(json.dumps({"etag": staged.remote.etag, "commit": staged.remote.commit,
                                       "size": staged.remote.size, "repo": staged.remote.ref.repo,
                                       "path": staged.remote.ref.path, **extra}))


def _hash_prefix(staged: _Staged, hashers: list, tracker: _Tracker, index: int, cancel: CancelToken | None) -> None:
    """Feed the bytes a previous run left to the hashers, so the final check covers the whole file."""
    with open(staged.part, "rb") as f:
        done = 0
        while chunk := f.read(8 * MiB):
            if cancel and cancel.requested:
                raise _Stop()
            for h in hashers:
                h.update(chunk)
            done += len(chunk)
            tracker.emit(index, done, "checking")


class _Stop(Exception):
    """Internal: the cancel token fired."""


def _transfer(staged: _Staged, index: int, tracker: _Tracker, cancel: CancelToken | None) -> None:
    remote = staged.remote

    def fresh_hashers():
        """sha256, and git's blob sha1 when the Hub gave only that; both over the whole file."""
        sha256 = hashlib.sha256()
        git = hashlib.sha1(f"blob {remote.size}\0".encode()) if remote.git_sha1 else None
        return sha256, git, [h for h in (sha256, git) if h is not None]

    sha256, git, hashers = fresh_hashers()
    staged.part.parent.mkdir(parents=True, exist_ok=True)
    _write_meta(staged)
    if staged.have:
        _hash_prefix(staged, hashers, tracker, index, cancel)
    have = staged.have
    stalled = 0
    with open(staged.part, "ab" if have else "wb") as out:
        while have < remote.size:
            headers = request_headers(remote.url)
            headers["Accept-Encoding"] = "identity"
            if have:
                headers["Range"] = f"bytes={have}-"
            before = have
            try:
                with http_stream_backoff("GET", remote.url, headers=headers,
                                         timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT, retry_on_exceptions=(),
                                         max_retries=3, base_wait_time=0.5, max_wait_time=4) as resp:
                    hf_raise_for_status(resp)
                    if have and resp.status_code == 200:
                        # the server ignored Range: take the whole body from the start
                        out.seek(0)
                        out.truncate()
                        tracker.done -= have
                        have = 0
                        sha256, git, hashers = fresh_hashers()
                    for chunk in resp.iter_bytes():
                        if cancel and cancel.requested:
                            raise _Stop()
                        if have + len(chunk) > remote.size:
                            raise SpeculumError(f"The server sent more bytes of {remote.ref.filename} than "
                                                "the Hub announced; try again later.")
                        out.write(chunk)
                        for h in hashers:
                            h.update(chunk)
                        have += len(chunk)
                        tracker.done += len(chunk)
                        tracker.moved += len(chunk)
                        tracker.emit(index, have, "downloading")
                if have < remote.size:
                    raise httpx2.RemoteProtocolError("the connection closed before the file ended")
            except httpx2.TransportError as exc:
                # a dropped connection: continue from the bytes we have
                out.flush()
                stalled = 0 if have > before else stalled + 1
                if stalled >= MAX_STALLED_RETRIES:
                    raise hub_error(exc, remote.ref) from None
                time.sleep(min(0.25 * 2 ** stalled, 4.0))
        out.flush()
        os.fsync(out.fileno())
    tracker.emit(index, have, "verifying", force=True)
    got = sha256.hexdigest()
    if staged.expected_sha256 and got != staged.expected_sha256 or (git and git.hexdigest() != remote.git_sha1):
        staged.part.unlink(missing_ok=True)
        staged.meta.unlink(missing_ok=True)
        raise SpeculumError(f"{remote.ref.filename} from {remote.ref.repo} failed its checksum: its sha256 is "
                            f"{got[:16]}… but the Hub says {(staged.expected_sha256 or remote.etag)[:16]}…. The "
                            "damaged file was deleted and nothing was added; run the download again.")
    staged.verified, staged.sha256 = True, got
    _write_meta(staged, verified=True, sha256=got, mtime_ns=staged.part.stat().st_mtime_ns)


def _present(ref: HubRef, root: Path) -> Path | None:
    path = library_path(ref, root)
    return path if read_stamp(path) else None


def download(requests: Sequence[FileRequest], root: Path | None = None, *, progress: Progress | None = None,
             cancel: CancelToken | None = None,
             disk_usage: DiskUsage = shutil.disk_usage) -> list[Path]:
    """Fetch a set of Hub files (a pair, or a model's shards) into the library at ``root``.

    Returns their library paths, in order. Files already in the library are not fetched
    again, and need no network; in offline mode that is the only way this succeeds.
    """
    root = Path(root) if root else paths.models_dir()
    staging = root / STAGING
    wanted = [r for r in requests if _present(r.ref, root) is None]
    if wanted and offline():
        missing = ", ".join(f"{r.ref.filename} ({r.ref.repo})" for r in wanted)
        raise SpeculumError(f"Offline mode is on (HF_HUB_OFFLINE=1) and these files are not on disk yet: "
                            f"{missing}. Unset HF_HUB_OFFLINE to download them.")
    staged = [_stage(r, resolve(r.ref), staging) for r in wanted]

    need = sum(s.remote.size - s.have for s in staged if not s.verified)
    if staged:
        free = _free_space(staging, disk_usage)
        if need + DISK_MARGIN > free:
            raise SpeculumError(
                f"Not enough disk space in {root}: the download needs {need / 1e9:.2f} GB more and only "
                f"{free / 1e9:.2f} GB are free (Speculum keeps {DISK_MARGIN / 1e9:.2f} GB spare). Free some "
                "space or move the library with SPECULUM_MODELS_DIR.")

    tracker = _Tracker(staged, progress, total=sum(s.remote.size for s in staged),
                       done=sum(s.have for s in staged))
    try:
        for i, s in enumerate(staged):
            if s.verified:
                tracker.emit(i, s.remote.size, "done", force=True)
                continue
            tracker.emit(i, s.have, "downloading", force=True)
            _transfer(s, i, tracker, cancel)
            tracker.emit(i, s.remote.size, "done", force=True)
    except _Stop:
        if cancel is not None and cancel.keep_partial:
            raise DownloadPaused(f"Download paused at {tracker.done / 1e9:.2f} of {tracker.total / 1e9:.2f} GB; "
                                 "run it again to resume.") from None
        for s in staged:
            s.part.unlink(missing_ok=True)
            s.meta.unlink(missing_ok=True)
        _prune(staging)
        raise DownloadCancelled("Download cancelled; nothing was added to the library.") from None
    except SpeculumError:
        raise
    except httpx2.HTTPError as exc:  # huggingface_hub's errors are HTTPErrors (and OSErrors): before OSError
        raise hub_error(exc) from None
    except OSError as exc:
        raise _disk_error(exc, staging) from None

    # Everything is verified: move it into the library. Same disk, so each rename is atomic.
    try:
        for s in staged:
            dest = library_path(s.remote.ref, root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(s.part, dest)
            write_stamp(dest, s.sha256 or "", repo=s.remote.ref.repo, path=s.remote.ref.path,
                        commit=s.remote.commit)
            s.meta.unlink(missing_ok=True)
    except OSError as exc:
        raise _disk_error(exc, root) from None
    _prune(staging)
    return [library_path(r.ref, root) for r in requests]


def _prune(folder: Path) -> None:
    """Remove empty staging folders."""
    if not folder.is_dir():
        return
    for sub in sorted(folder.glob("**/"), key=lambda p: len(p.parts), reverse=True):
        try:
            sub.rmdir()
        except OSError:
            pass


def staged_bytes(root: Path | None = None) -> int:
    """Disk taken by partial downloads waiting to be resumed."""
    root = Path(root) if root else paths.models_dir()
    return sum(p.stat().st_size for p in (root / STAGING).glob("**/*.part") if p.is_file())
