"""`speculum serve` as a user starts it, in a process of its own with its log in a file: what the
real agents' tests (Claude Code, Codex CLI) talk to.

The demo pair with --exact: auto drafts as the timings say, and without the switch the rows of a
verification pass can part from a single step's at a near tie, so an answer could change with the
machine's load or with what the process served before (the 1.5B once answered in prose instead of
calling Read beside a benchmark; Codex's run in the full suite went on calling tools after its
answer). Exact, every answer is plain decoding's, whatever ran before."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx


@contextmanager
def serving(target: Path, draft: Path, *options: str):
    """(url, log file) of a fresh `speculum serve --exact` on ``target`` and ``draft`` (auto mode,
    a fresh data folder, ``options`` added), until the block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
    process = subprocess.Popen(
        [sys.executable, "-m", "speculum.cli", "serve", "--target", str(target), "--draft", str(draft),
         "--ctx", "8192", "--port", str(port), "--exact", *options],
        stdout=log, stderr=log, text=True,
        env={**os.environ, "SPECULUM_DATA_DIR": tempfile.mkdtemp(prefix="speculum-agent-")})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=10).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, Path(log.name).read_text()
            time.sleep(0.5)
        yield url, Path(log.name)
    finally:
        process.terminate()
        process.wait(30)


def refusals(log: Path, path: str) -> list[str]:
    """The server's log lines for requests to ``path`` it answered with a 4xx or 5xx."""
    return re.findall(re.escape(path) + r"\S*: [45]\d\d .*", log.read_text())
