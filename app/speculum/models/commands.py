"""`speculum models ...` subcommands: list, download, check, add, remove, install-demo (their options: ``options``)."""

from __future__ import annotations

import json
import sys
import time

from ..errors import SpeculumError
from ..options import ModelsAdd, ModelsCheck, ModelsDownload, ModelsInstallDemo, ModelsList, ModelsRemove


def human_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GB" else f"{n / scale:.0f} {unit}"
    return f"{n:.0f} B"


MTP_DRAFT = "built-in MTP"  # how the text output names the draft of a target that drafts for itself


def draft_label(pair, full: bool = False) -> str:
    """A library pair's draft file (its name, or ``full`` path), or MTP_DRAFT."""
    if pair.draft is None:
        return MTP_DRAFT
    return str(pair.draft.path) if full else pair.draft.path.name


def human_time(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:02d}:{rest % 60:02d}"


class ProgressLine:
    """A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, label: str, out=None):
        self.label = label
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self._last = -1

    def __call__(self, done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if pct == self._last:
            return
        self._last = pct
        if self.tty:
            bar = "#" * (pct // 4)
            self.out.write(f"\r{self.label} [{bar:<25}] {pct:3d}%")
            if pct >= 100:
                self.out.write("\n")
        elif pct % 25 == 0:
            self.out.write(f"{self.label}: {pct}%\n")
        self.out.flush()


class DownloadLine:
    """Per-file and total progress with speed and ETA, for DownloadProgress events."""

    def __init__(self, out=None):
        self.out = out or sys.stderr  # looked up now: tests and pagers swap sys.stderr
        self.tty = self.out.isatty()
        self._last_print = 0.0
        self._last_key: tuple = ()
        self._step = -1  # the tenth of the total last printed (plain lines)

    def __call__(self, p) -> None:
        from .download import Phase  # (here: `speculum models` starts without the download machinery)

        now = time.monotonic()
        key = (p.file_index, p.phase)
        if self.tty:
            if now - self._last_print < 0.1 and key == self._last_key and p.file_done < p.file_total:
                return
            line = (f"\r[{p.file_index}/{p.file_count}] {p.file[:38]:<38} {100 * p.file_fraction:5.1f}%  "
                    f"total {human_bytes(p.done)} / {human_bytes(p.total)} {100 * p.fraction:5.1f}%  "
                    f"{human_bytes(p.speed)}/s  ETA {human_time(p.eta)} ")
            self.out.write(line)
            if p.phase == Phase.DONE:
                self.out.write("\n")
        else:
            # one line per file event, and one per 10% of the total
            step = int(10 * p.fraction)
            if key == self._last_key and step == self._step:
                return
            self._step = step
            self.out.write(f"{p.phase} [{p.file_index}/{p.file_count}] {p.file}: {100 * p.file_fraction:.0f}% "
                           f"(total {100 * p.fraction:.0f}%, {human_bytes(p.speed)}/s, ETA {human_time(p.eta)})\n")
        self._last_print, self._last_key = now, key
        self.out.flush()


def cmd_install_demo(options: ModelsInstallDemo) -> int:
    from . import bundled

    models = list(bundled.BUNDLED.values()) if options.all else list(bundled.DEMO_PAIR)
    for model in models:
        path = bundled.installed_path(model)
        if path is None:
            path = bundled.assemble(model, progress=ProgressLine(f"assembling {model.filename}"))
        print(f"{model.description}: {path}")
    return 0


def cmd_check(options: ModelsCheck) -> int:
    from .remote import HubRef, check_sources, parse_source

    def note(source, header) -> None:
        if isinstance(source, HubRef):
            print(f"read {human_bytes(header.bytes_read)} of the header of {source} over HTTP", file=sys.stderr)

    draft = parse_source(options.draft) if options.draft else None
    verdict = check_sources(parse_source(options.target), draft, on_header=note)
    print(verdict.reason)
    return 0 if verdict.ok else 1


def cmd_list(options: ModelsList) -> int:
    from . import catalog, hardware
    from .download import staged_bytes
    from .library import Library

    pairs = catalog.load()
    machine = hardware.detect()
    library = Library(pairs=pairs)
    best = hardware.recommend(pairs, machine)
    installed = {p.catalog_id for p in library.pairs()}
    if options.json:
        print(json.dumps({
            "machine": {"ram_bytes": machine.ram_bytes, "gpu": machine.gpu_name, "vram_bytes": machine.vram_bytes,
                        "unified": machine.unified},
            "recommended": best.id if best else None,
            "catalog": [{"id": p.id, "name": p.name, "good_at": list(p.good_at), "download_bytes": p.download_size,
                         "memory_gb": p.memory_gb, "fit": hardware.fit(p, machine).value,
                         "installed": p.id in installed, "offline": bool(p.offline),
                         "drafts_with": "mtp" if p.mtp else "model", "memory_note": p.memory_note,
                         "source": p.source} for p in pairs],
            "library": {"folder": str(library.root), "disk_bytes": library.disk_use(),
                        "partial_bytes": staged_bytes(library.root),
                        # draft: the draft file, null for a target that drafts with its own MTP head
                        "pairs": [{"id": p.id, "name": p.name, "target": str(p.target.path),
                                   "draft": None if p.mtp else str(p.draft.path), "bytes": p.size,
                                   "drafts_with": "mtp" if p.mtp else "model"} for p in library.pairs()],
                        "models": [{"name": m.name, "path": str(m.path), "bytes": m.size, "source": m.source}
                                   for m in library.singles()]},
        }, indent=1))
        return 0
    print(f"This machine: {machine.describe()}.")
    print("\nCatalog (✓ fits, ~ tight, ✗ too big; ★ recommended):")
    for p in pairs:
        f = hardware.fit(p, machine)
        star = "★" if best and p.id == best.id else " "
        state = "installed" if p.id in installed else ("offline demo" if p.offline else "")
        if p.mtp:
            state = f"{state}; {MTP_DRAFT}" if state else MTP_DRAFT
        print(f" {star} {f.mark} {p.id:<20} {p.name:<30} {human_bytes(p.download_size):>9}  "
              f"needs {p.memory_gb:4.1f} GB  {', '.join(p.good_at):<20} {state}")
    print(f"\nLibrary in {library.root}:")
    lib_pairs, singles = library.pairs(), library.singles()
    for p in lib_pairs:
        print(f"   pair  {p.id:<30} {human_bytes(p.size):>9}  {p.target.path.name} + {draft_label(p)}")
    for m in singles:
        print(f"   model {m.name:<30} {human_bytes(m.size):>9}  {m.path}")
    if not lib_pairs and not singles:
        print("   nothing yet: 'speculum models download PAIR', or 'speculum models install-demo' offline.")
    partial = staged_bytes(library.root)
    extra = f" ({human_bytes(partial)} of it partial downloads)" if partial else ""
    print(f"   disk use: {human_bytes(library.disk_use())}{extra}")
    return 0


def _run_download(job) -> int:
    """Run a download, turning Ctrl-C into a pause that the next run resumes."""
    from .download import CancelToken

    try:
        return job(CancelToken())
    except KeyboardInterrupt:
        print("\nspeculum: download interrupted; run the same command again to resume.", file=sys.stderr)
        return 130


def cmd_download(options: ModelsDownload) -> int:
    from . import catalog, hardware
    from .library import Library

    pairs = catalog.load()
    pair = catalog.find(options.pair, pairs)
    fit = hardware.fit(pair, hardware.detect())
    if fit is hardware.Fit.TOO_BIG:
        print(f"speculum: warning: {pair.name} needs about {pair.memory_gb:.0f} GB of memory and is too big "
              "for this machine; downloading anyway.", file=sys.stderr)

    def job(cancel) -> int:
        installed = Library(pairs=pairs).install(pair, progress=DownloadLine(), cancel=cancel)
        print(f"{installed.name}: {installed.target.path} + {draft_label(installed, full=True)}")
        return 0
    return _run_download(job)


def cmd_add(options: ModelsAdd) -> int:
    from .library import IncompatiblePair, Library, LibraryPair
    from .remote import HubRef, parse_source

    sources = [parse_source(s) for s in ([options.target] + ([options.draft] if options.draft else []))]
    library = Library()

    def job(cancel) -> int:
        try:
            if isinstance(sources[0], HubRef) or (len(sources) > 1 and isinstance(sources[1], HubRef)):
                if len(sources) > 1 and not all(isinstance(s, HubRef) for s in sources):
                    raise SpeculumError("Give two local files or two Hub files; to mix them, download the Hub "
                                        "one first with 'speculum models add hf:…'.")
                added = library.add_from_hub(*sources, name=options.name, progress=DownloadLine(), cancel=cancel)
            elif len(sources) == 2:
                added = library.add_pair(sources[0], sources[1], options.name)
            else:
                added = library.add_model(sources[0])
        except IncompatiblePair as exc:
            print(exc.compatibility.reason)
            return 1
        if isinstance(added, LibraryPair):
            print(f"Added pair '{added.id}': {added.target.path} + {draft_label(added, full=True)}")
        else:
            print(f"Added model {added.name}: {added.path}")
        return 0
    return _run_download(job)


def cmd_remove(options: ModelsRemove) -> int:
    from .library import Library

    deleted = Library().remove(options.name, delete_files=not options.keep_files)
    freed = ""
    if deleted:
        freed = f"; deleted {len(deleted)} file(s)"
    print(f"Removed '{options.name}' from the library{freed}.")
    return 0
