"""Downloading model files from the Hub into the library: resumable, verified, atomic.

Bytes stream into ``<library>/.partial/<repo>/<path>.part`` beside a small JSON that
remembers which version (ETag) they belong to, so a dropped connection is retried
from where it stopped and a restart resumes the same file. One download at a time
works on a file, across threads and processes (``filelock``: a lock file beside the
``.part``). A complete file is hashed as it is on disk and checked against the
Hub's LFS sha256. Only when every file of the set is complete and verified are they
moved (an atomic rename on the same disk) into the library; a cancel removes what this
set staged, and nothing half-done is ever listed. Every path is checked to resolve
inside the library, and a file counts as downloaded only when its stamp names the
same repository, path and revision.

huggingface_hub's own ``hf_hub_download`` is not used for the transfer: its temporary
files are unique per process and deleted on failure, so it cannot resume after a
restart, and it reports progress in 10 MB steps with no way to stop mid-file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
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
from ..engine.vocabulary import Word
from ..errors import SpeculumError
from .filelock import CancelRequested, FileLock
from .remote import HubRef, RemoteFile, hub_error, offline, request_headers, resolve
from .stamps import read_stamp, stamp_path, valid_fields, write_stamp

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


class Phase(Word):
    """Where a file of a download stands (a progress report's ``phase``)."""

    CHECKING = "checking"
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"  # hashing what is on disk
    ASSEMBLING = "assembling"  # the offline demo pair, put together from its packages
    DONE = "done"


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
    phase: Phase

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
    landed: Path | None = None  # where it sits in the library, once there
    counted: int = 0  # bytes of this file in the progress total so far

    @property
    def expected_sha256(self) -> str | None:
        return self.remote.sha256 or self.request.sha256

    @property
    def lock(self) -> Path:
        return self.part.with_name(self.part.name + ".lock")


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

    def emit(self, index: int, file_done: int, phase: Phase, force: bool = False) -> None:
        if self.progress is None or (not force and self.done - self.last_emit < PROGRESS_STEP):
            return
        self.last_emit = self.done
        self.speed = self.rate.add(self.moved)
        left = self.total - self.done
        eta = left / self.speed if self.speed > 0 else (0.0 if left == 0 else None)
        staged = self.files[index]
        self.progress(DownloadProgress(staged.remote.ref.filename, index + 1, len(self.files), file_done,
                                       staged.remote.size, self.done, self.total, self.speed, eta, phase))


# ---- where files go ---------------------------------------------------------------------------------


def _inside(path: Path, folder: Path) -> Path:
    """``path`` if it resolves inside ``folder``: a name from the Hub never writes elsewhere."""
    if not path.resolve().is_relative_to(folder.resolve()):
        raise SpeculumError(f"Refusing to write {path}: it lies outside {folder}.")
    return path


def _nested_path(ref: HubRef, root: Path) -> Path:
    """Where a file goes when another file of the same name already sits in its repo's folder."""
    return root / repo_folder(ref.repo) / ref.revision / ref.path


def _names(stamp: dict | None, ref: HubRef) -> bool:
    """Whether a stamp is for exactly this repo, file and revision (stamps before revisions: main)."""
    return (stamp is not None and stamp.get("repo") == ref.repo and stamp.get("path") == ref.path
            and ref.revision in (stamp.get("revision", "main"), stamp.get("commit")))


def _is_copy_of(path: Path, ref: HubRef) -> bool:
    """Whether ``path`` is a verified, unchanged download of exactly this file."""
    return _names(read_stamp(path), ref)


def _present(ref: HubRef, root: Path) -> Path | None:
    for path in (library_path(ref, root), _nested_path(ref, root)):
        if _is_copy_of(path, ref):
            return _inside(path, root)
    return None


def _destination(ref: HubRef, root: Path) -> Path:
    """The repo's folder, unless a different file of that name is there (Q4/model.gguf beside
    Q8/model.gguf): then its own path below the folder, so neither replaces the other."""
    flat = library_path(ref, root)
    ours = _names(paths.read_json_object(stamp_path(flat)), ref)  # a stale copy of this very file
    taken = (flat.exists() or stamp_path(flat).exists()) and not ours
    return _inside(_nested_path(ref, root) if taken else flat, root)


# ---- staging -----------------------------------------------------------------------------------------

_META_FIELDS = {"etag": str, "size": int, "verified": bool, "sha256": str, "mtime_ns": int, "commit": str,
                "repo": str, "path": str}


def _staged(request: FileRequest, remote: RemoteFile, staging: Path) -> _Staged:
    _inside(library_path(remote.ref, staging.parent), staging.parent)  # refused before a byte is fetched
    part = _inside(staging / repo_folder(remote.ref.repo) / (remote.ref.path + ".part"), staging)
    return _Staged(request, remote, part, part.with_name(part.name + ".json"))


def _restage(staged: _Staged) -> None:
    """Read what an earlier run (or another download) left for this file. Call holding its lock."""
    staged.have, staged.verified, staged.sha256 = 0, False, None
    info = paths.read_json_object(staged.meta)  # a file that is not an object is set aside
    if info is not None and not valid_fields(info, _META_FIELDS, required=("etag",)):
        paths.set_aside(staged.meta, "a partial download's record with wrong fields; the file starts over")
        info = None
    try:
        size = staged.part.stat().st_size
    except OSError:
        return
    remote = staged.remote
    if info is None or info["etag"] != remote.etag or size > remote.size:
        # no record of which version these bytes are, a different version on the Hub now, or garbage
        staged.part.unlink(missing_ok=True)
        staged.meta.unlink(missing_ok=True)
        return
    staged.have = size
    if info.get("verified") and size == remote.size and info.get("mtime_ns") == staged.part.stat().st_mtime_ns:
        staged.verified, staged.sha256 = True, info.get("sha256")


def _write_meta(staged: _Staged, **extra) -> None:
    paths.write_json_atomic(staged.meta, {"etag": staged.remote.etag, "commit": staged.remote.commit,
                                          "size": staged.remote.size, "repo": staged.remote.ref.repo,
                                          "path": staged.remote.ref.path, **extra})


def _transfer(staged: _Staged, index: int, tracker: _Tracker, cancel: CancelToken | None) -> None:
    """Fetch the bytes this file still lacks into its .part. Call holding its lock."""
    remote = staged.remote
    staged.part.parent.mkdir(parents=True, exist_ok=True)
    _write_meta(staged)
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
                        staged.counted -= have
                        have = 0
                    for chunk in resp.iter_bytes():
                        if cancel and cancel.requested:
                            raise CancelRequested()
                        if have + len(chunk) > remote.size:
                            raise SpeculumError(f"The server sent more bytes of {remote.ref.filename} than "
                                                "the Hub announced; try again later.")
                        out.write(chunk)
                        have += len(chunk)
                        staged.counted += len(chunk)
                        tracker.done += len(chunk)
                        tracker.moved += len(chunk)
                        tracker.emit(index, have, Phase.DOWNLOADING)
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
    staged.have = have


def _hash_file(path: Path, remote: RemoteFile, report: Callable[[int], None],
               cancel: CancelToken | None) -> tuple[int, str, str | None]:
    """Size, sha256 and (when the Hub gave only that) git blob sha1 of a file as it is on disk."""
    sha256 = hashlib.sha256()
    git = hashlib.sha1(f"blob {remote.size}\0".encode()) if remote.git_sha1 else None
    done = 0
    report(0)
    with open(path, "rb") as f:
        while chunk := f.read(8 * MiB):
            if cancel and cancel.requested:
                raise CancelRequested()
            sha256.update(chunk)
            if git:
                git.update(chunk)
            done += len(chunk)
            if done % (64 * MiB) < 8 * MiB:
                report(done)
    return done, sha256.hexdigest(), git.hexdigest() if git else None


def _matches(remote: RemoteFile, expected_sha256: str | None, size: int, sha256: str, git: str | None,
             need_hash: bool = False) -> bool:
    """``need_hash``: a file of unknown origin is only trusted against a hash, never on its size alone."""
    return size == remote.size and (not expected_sha256 or sha256 == expected_sha256) \
        and (git is None or git == remote.git_sha1) and (bool(expected_sha256 or git) or not need_hash)


def _verify(staged: _Staged, index: int, tracker: _Tracker, cancel: CancelToken | None) -> None:
    """Hash the .part as it is on disk (what joins the library is what was checked). Holding its lock."""
    remote = staged.remote
    size, got, git = _hash_file(staged.part, remote, lambda n: tracker.emit(index, n, Phase.VERIFYING, force=True),
                                cancel)
    if not _matches(remote, staged.expected_sha256, size, got, git):
        staged.part.unlink(missing_ok=True)
        staged.meta.unlink(missing_ok=True)
        raise SpeculumError(f"{remote.ref.filename} from {remote.ref.repo} failed its checksum: its sha256 is "
                            f"{got[:16]}… but the Hub says {(staged.expected_sha256 or remote.etag)[:16]}…. The "
                            "damaged file was deleted and nothing was added; run the download again.")
    staged.verified, staged.sha256 = True, got
    _write_meta(staged, verified=True, sha256=got, mtime_ns=staged.part.stat().st_mtime_ns)


def _reverify(staged: _Staged, index: int, tracker: _Tracker, root: Path, cancel: CancelToken | None) -> Path | None:
    """A file already in the library whose stamp is missing, damaged or stale: if its bytes are the
    Hub's, stamp it again instead of downloading it again. Holding its lock."""
    remote = staged.remote
    for path in (library_path(remote.ref, root), _nested_path(remote.ref, root)):
        try:
            if not path.is_file() or path.stat().st_size != remote.size or read_stamp(path) is not None:
                continue
        except OSError:
            continue
        size, got, git = _hash_file(_inside(path, root), remote,
                                    lambda n: tracker.emit(index, n, Phase.VERIFYING, force=True), cancel)
        if _matches(remote, staged.expected_sha256, size, got, git, need_hash=True):
            write_stamp(path, got, repo=remote.ref.repo, path=remote.ref.path, revision=remote.ref.revision,
                        commit=remote.commit)
            return path
    return None


def _fetch(staged: _Staged, index: int, tracker: _Tracker, root: Path, cancel: CancelToken | None) -> None:
    """Make this file present and verified, in the library or staged; another download of the
    same file (a draft shared by two pairs) is waited for and its result reused."""
    with FileLock(staged.lock, cancel):
        landed = _present(staged.remote.ref, root) or _reverify(staged, index, tracker, root, cancel)
        if landed is not None:
            staged.landed = landed
        else:
            _restage(staged)
            tracker.done += staged.have - staged.counted
            staged.counted = staged.have
            if not staged.verified:
                tracker.emit(index, staged.have, Phase.DOWNLOADING, force=True)
                _transfer(staged, index, tracker, cancel)
                _verify(staged, index, tracker, cancel)
    tracker.done += staged.remote.size - staged.counted
    staged.counted = staged.remote.size
    tracker.emit(index, staged.remote.size, Phase.DONE, force=True)


def _commit(staged: list[_Staged], root: Path, staging: Path, cancel: CancelToken | None) -> list[_Staged]:
    """Move every verified file into the library; returns those that vanished meanwhile (another
    download cancelled them), to fetch again."""
    lost = []
    with FileLock(staging / ".library.lock", cancel):
        for s in staged:
            with FileLock(s.lock, cancel):
                s.landed = _present(s.remote.ref, root)
                if s.landed is not None:
                    continue  # another download put it there
                _restage(s)
                if not s.verified:
                    lost.append(s)
                    continue
                dest = _destination(s.remote.ref, root)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(s.part, dest)
                write_stamp(dest, s.sha256 or "", repo=s.remote.ref.repo, path=s.remote.ref.path,
                            revision=s.remote.ref.revision, commit=s.remote.commit)
                s.meta.unlink(missing_ok=True)
                s.landed = dest
    return lost


def _discard(staged: list[_Staged]) -> None:
    """Remove what a cancelled set staged, except files another download is busy with."""
    for s in staged:
        lock = FileLock(s.lock)
        if lock.acquire(blocking=False):
            try:
                s.part.unlink(missing_ok=True)
                s.meta.unlink(missing_ok=True)
            finally:
                lock.release()


def download(requests: Sequence[FileRequest], root: Path | None = None, *, progress: Progress | None = None,
             cancel: CancelToken | None = None,
             disk_usage: DiskUsage = shutil.disk_usage) -> list[Path]:
    """Fetch a set of Hub files (a pair, or a model's shards) into the library at ``root``.

    Returns their library paths, in order. Files already in the library are not fetched
    again, and need no network; in offline mode that is the only way this succeeds.
    """
    root = Path(root) if root else paths.models_dir()
    staging = root / STAGING
    found = {r.ref: _present(r.ref, root) for r in requests}
    wanted = list({r.ref: r for r in requests if found[r.ref] is None}.values())
    if wanted and offline():
        missing = ", ".join(f"{r.ref.filename} ({r.ref.repo})" for r in wanted)
        raise SpeculumError(f"Offline mode is on (HF_HUB_OFFLINE=1) and these files are not on disk yet: "
                            f"{missing}. Unset HF_HUB_OFFLINE to download them.")
    staged = [_staged(r, resolve(r.ref), staging) for r in wanted]
    for s in staged:  # a first look, unlocked, for the disk space and the progress totals
        info = paths.read_json_object(s.meta)
        if info is not None and info.get("etag") == s.remote.etag:
            with contextlib.suppress(OSError):
                s.have = s.counted = min(s.part.stat().st_size, s.remote.size)

    need = sum(s.remote.size - s.have for s in staged)
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
        pending = staged
        for _ in range(3):
            for s in pending:
                _fetch(s, staged.index(s), tracker, root, cancel)
            pending = _commit(staged, root, staging, cancel)
            if not pending:
                break
        else:
            raise SpeculumError("Another download of the same files kept cancelling them; run the download "
                                "again.")
    except CancelRequested:
        if cancel is not None and cancel.keep_partial:
            raise DownloadPaused(f"Download paused at {tracker.done / 1e9:.2f} of {tracker.total / 1e9:.2f} GB; "
                                 "run it again to resume.") from None
        _discard(staged)
        _prune(staging)
        raise DownloadCancelled("Download cancelled; nothing was added to the library.") from None
    except SpeculumError:
        raise
    except httpx2.HTTPError as exc:  # huggingface_hub's errors are HTTPErrors (and OSErrors): before OSError
        raise hub_error(exc) from None
    except OSError as exc:
        raise _disk_error(exc, staging) from None
    _prune(staging)
    landed = {s.remote.ref: s.landed for s in staged}
    return [found[r.ref] or landed[r.ref] for r in requests]


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
