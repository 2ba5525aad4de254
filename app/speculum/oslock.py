"""A non-blocking exclusive lock on one byte of an open file, on every OS.

flock on Unix, msvcrt on Windows: either way the system drops the lock when its process
dies, so a crash leaves no stale lock behind. Used by the data folder's owner
(``instance``) and by downloads (``models.filelock.FileLock``).
"""

from __future__ import annotations

import os

try:
    import fcntl
    msvcrt = None
except ImportError:  # Windows
    fcntl = None
    import msvcrt


def try_lock(fd: int, at: int = 0) -> bool:
    """Lock ``fd`` (msvcrt: the byte at ``at``) if no one else holds it; never waits."""
    os.lseek(fd, at, os.SEEK_SET)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:
        return False
    return True


def unlock(fd: int, at: int = 0) -> None:
    os.lseek(fd, at, os.SEEK_SET)
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
