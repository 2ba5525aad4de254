"""One download per file at a time, across threads and processes: a lock file beside it.

Catalog pairs share drafts: a second download of a file waits for the first and reuses its
result. Waiting gives way to a cancel, so Cancel works while another download has the file.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from ..oslock import msvcrt, try_lock, unlock


class CancelRequested(Exception):
    """The download's cancel token fired: whatever waits or works for it gives way."""


class Cancel(Protocol):
    """What a lock's waiting asks of a cancel token (``download.CancelToken``)."""

    @property
    def requested(self) -> bool: ...


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


class FileLock:
    """One holder at a time, across threads and processes, of what ``path`` guards.

    An OS lock (flock, or msvcrt on Windows) on a lock file: the system drops it when its
    process dies, so a crash leaves no stale lock behind, only a file the next holder reuses.
    Waiting checks the cancel token (``CancelRequested`` when it fired).
    """

    POLL = 0.05

    def __init__(self, path: Path, cancel: Cancel | None = None):
        self.path = path
        self.cancel = cancel
        self._fd: int | None = None
        key = os.path.normcase(os.path.abspath(path))
        with _thread_locks_guard:
            self._thread_lock = _thread_locks.setdefault(key, threading.Lock())

    def _wait(self) -> None:
        if self.cancel is not None and self.cancel.requested:
            raise CancelRequested()
        time.sleep(self.POLL)

    def acquire(self, blocking: bool = True) -> bool:
        while not self._thread_lock.acquire(timeout=self.POLL):
            if not blocking:
                return False
            self._wait()
        try:
            while True:
                fd = None
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                    if try_lock(fd):
                        # the holder before us deletes the file as it lets go: ours must still be the one there
                        if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                            self._fd = fd
                            return True
                        unlock(fd)
                except (FileNotFoundError, PermissionError):
                    pass  # a folder pruned, or (Windows) a lock file being deleted: try again
                if fd is not None:
                    os.close(fd)
                if not blocking:
                    self._thread_lock.release()
                    return False
                self._wait()
        except BaseException:
            self._thread_lock.release()
            raise

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):  # Windows refuses while the file is open: see below
                os.unlink(self.path)  # while still held, so no one locks a file that is going away
            unlock(fd)
            os.close(fd)
            if msvcrt is not None:
                with contextlib.suppress(OSError):  # another process has it open: it stays, harmlessly
                    os.unlink(self.path)
        finally:
            self._thread_lock.release()

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
