"""Claude Code, the real agent from npm, against a real `speculum serve` on the demo pair: a
one-tool task (read a file, say what it holds) ends with exit 0, the file's word in the answer,
and no refusal in the server's log.

Claude Code's full first request is ~20k tokens (its system prompt and 24 tools), minutes of
reading on a 2-core CPU; ``--bare`` (no hooks, plugins, CLAUDE.md, background requests),
``--tools Read`` and its own short system prompt keep it near 1k. Installed from npm into a
cache folder on first use; without Node.js the test is skipped and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from serve_process import refusals, serving

pytestmark = pytest.mark.qwen

PACKAGE = "@anthropic-ai/claude-code"
AGENTS = Path(os.environ.get("SPECULUM_AGENTS_DIR", Path.home() / ".cache" / "speculum-dev" / "agents"))
MODEL = "qwen-demo"
KEY = "agent-key-1"
WORD = "papaya"
# The demo target (1.5B) needs the task said plainly: told only to read, it read the file again
# instead of answering; asked for a "secret word", it declined. Its first token is a near tie
# between a call and prose for softer wordings ("Read notes.txt with the Read tool, then ..." gave
# "To" -1.39, a fenced call -1.47, a bare call -1.53, and which of them won changed with the test's
# folder and the date in Claude Code's system prompt: CI's run answered in prose, as this machine
# did in CI's folder).
# These words put a call 1.7 logits ahead of prose in each folder and date tried, more than the
# 0.78 that kernels part rows by.
TASK = "Call the Read tool on notes.txt now. Then tell me which fruit is on the shopping list."
AFTER = ("Until you have read the file, reply with a tool call only, no text. After a tool result, "
         "answer the user in one sentence; do not call a tool again.")


@pytest.fixture(scope="module")
def claude() -> Path:
    npm = shutil.which("npm")
    if shutil.which("node") is None or npm is None:
        pytest.skip("Node.js (node and npm) is not installed here: Claude Code, an npm package, cannot run")
    binary = AGENTS / "node_modules" / ".bin" / "claude"
    if not binary.exists():
        AGENTS.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(AGENTS), PACKAGE],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"npm install {PACKAGE} failed:\n{done.stderr[-3000:]}"
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and "Claude Code" in version.stdout, version.stdout + version.stderr
    return binary


@pytest.fixture(scope="module")
def server(qwen_target_path, qwen_draft_path):
    """`speculum serve --exact` on the demo pair (serve_process.py says why exact)."""
    with serving(qwen_target_path, qwen_draft_path, "--api-key", KEY, "--model-id", MODEL) as served:
        yield served


def test_claude_code_reads_a_file_with_its_tool_and_answers(claude, server, tmp_path):
    url, log = server
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text(f"Shopping list:\n- one {WORD}\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "ANTHROPIC_BASE_URL": url,
           "ANTHROPIC_API_KEY": KEY, "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
           "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    command = [str(claude), "-p", TASK, "--bare", "--tools", "Read", "--allowedTools", "Read", "--model", MODEL,
               "--append-system-prompt", AFTER, "--output-format", "json"]
    start = time.monotonic()
    run = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - start
    served = log.read_text()
    print(f"claude -p took {took:.0f} s\n{run.stdout[-2000:]}\n{served[-3000:]}")
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}\n{served[-3000:]}"
    result = json.loads(run.stdout)
    assert result["is_error"] is False and result["num_turns"] >= 2, result  # the tool was called, its result read
    assert WORD in result["result"].lower(), result
    refused = refusals(log, "/v1/messages")
    assert not refused, refused
