"""One window owns the data folder at a time.

Two windows writing the same conversations, settings and library would each overwrite the
other's changes (last write wins, and a deleted conversation comes back). The window takes
an exclusive lock on ``<data folder>/speculum.lock`` and holds it for the life of the
process; the operating system releases it when the process ends, however it ends, so a
crash leaves no stale lock. A second window finds the lock taken, says so and exits
(``ui.app.run_app``). The CLI does not take it: it writes no conversations or settings.
"""

from __future__ import annotations

import os
from pathlib import Path

from .oslock import try_lock

LOCK_NAME = "speculum.lock"
_PID_AT = 0  # the owner's process id is written here; the lock itself covers one byte further on
_LOCK_AT = 64

_held: dict[Path, int] = {}  # folder -> open descriptor, for the life of the process


class FolderInUse(Exception):
    def __init__(self, folder: Path, owner: str):
        self.folder, self.owner = folder, owner
        who = f" (process {owner})" if owner else ""
        super().__init__(f"Speculum is already open{who} and using {folder}. Only one window can use "
                         "its conversations, settings and model library at a time, or one would "
                         "overwrite the other's changes. Switch to that window, or close it and try again.")


def claim(folder: Path) -> None:
    """Own ``folder`` for the rest of this process, or raise FolderInUse naming the owner."""
    folder = Path(folder)
    key = folder.resolve()
    if key in _held:
        return
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if not try_lock(fd, _LOCK_AT):
        try:
            os.lseek(fd, _PID_AT, os.SEEK_SET)
            owner = os.read(fd, 32).split(b"\n")[0].decode("ascii", "replace").strip()
        except OSError:
            owner = ""
        os.close(fd)
        raise FolderInUse(folder, owner if owner.isdigit() else "")
    os.lseek(fd, _PID_AT, os.SEEK_SET)
    os.write(fd, f"{os.getpid()}\n".encode().ljust(_LOCK_AT - 1))
    _held[key] = fd  # never closed: closing would release the lock


def owns(folder: Path) -> bool:
    return Path(folder).resolve() in _held
