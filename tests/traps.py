"""A file that tells whether anything opened it: a named pipe watched from another process.

Qt opens an image for reading with a blocking open(); on a FIFO that waits for a writer.
The watcher (a separate process: Qt may hold Python's lock while it waits) tries a
non-blocking open for writing every few milliseconds, which succeeds only while a reader
is waiting: it then writes a line to its log and closes, so the reader sees an empty file
and carries on. Nothing hangs, nothing grows, and the test learns of every read.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

WATCH = r"""
import errno, os, sys, time
fifo, log = sys.argv[1], sys.argv[2]
while True:
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: no reader, which is what we hope for
            raise
        time.sleep(0.005)
        continue
    with open(log, "a") as out:
        out.write("opened\n")
    os.close(fd)
    time.sleep(0.05)  # let the reader see end of file before looking again
"""


class FileTrap:
    def __init__(self, folder: Path, name: str = "trap.png"):
        self.path = folder / name
        self.log = folder / (name + ".log")
        os.mkfifo(self.path)
        self.log.write_text("")
        self._watcher = subprocess.Popen([sys.executable, "-c", WATCH, str(self.path), str(self.log)])
        time.sleep(0.1)

    @property
    def opened(self) -> int:
        return len(self.log.read_text().splitlines())

    def close(self) -> None:
        self._watcher.kill()
        self._watcher.wait()
