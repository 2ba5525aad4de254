"""Real `speculum rpc-worker` processes on 127.0.0.1: ``Worker``, and the ``workers`` fixture (a
pair for a test module, registered in conftest.py)."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import speculum

ENV = {**os.environ, "PYTHONPATH": str(Path(speculum.__file__).parents[1]), "PYTHONIOENCODING": "utf-8"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """One `speculum rpc-worker` process on 127.0.0.1, its stdout lines read on a thread.
    ``endpoint`` is what a client passes as --rpc: the pairing string it printed (secure, the
    default), or HOST:PORT (``insecure``); ``name`` is HOST:PORT either way."""

    def __init__(self, threads: int = 1, insecure: bool = False, data_dir: str | None = None, extra=(),
                 port: int | None = None):
        self.port = port or free_port()  # (a given one: the same worker started again)
        self.name = f"127.0.0.1:{self.port}"
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="speculum-worker-")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "speculum.cli", "rpc-worker", "--port", str(self.port), "--threads", str(threads),
             *(["--insecure"] if insecure else []), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**ENV, "SPECULUM_DATA_DIR": self.data_dir})
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for("listening on", 60)
        self.endpoint = self.wait_for("--rpc ", 10).split("--rpc ")[1].split()[0]

    def _read(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.process.poll() is None, f"worker ended: {self.process.stderr.read()}"
                continue
            if text in line:
                return line
        raise AssertionError(f"worker never printed {text!r}: {''.join(self.output)}")

    def count(self, text: str) -> int:
        return sum(text in line for line in self.output)

    def wait_count(self, text: str, n: int, timeout: float) -> int:
        """The count of lines holding ``text`` once it reaches ``n``, or when ``timeout`` ends:
        llama.cpp's server thread and each connection's thread print on their own time."""
        deadline = time.monotonic() + timeout
        while self.count(text) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.count(text)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # (one a test froze)
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)


@pytest.fixture(scope="module")
def workers():
    pair = [Worker(), Worker()]
    yield pair
    for w in pair:
        w.stop()
