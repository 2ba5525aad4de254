"""Recording an agent session for bench_agent.py: a real agent (Claude Code or Codex CLI, from
npm as tests/test_agent_claude.py and tests/test_agent_codex.py install them) does a small
read-then-edit task against `speculum serve` on the demo pair, through a logging proxy that keeps
every request body (and the answer's tool calls, to mark the turns that edit code). The bodies are
then scrubbed (paths, ids, dates, Claude Code's billing hash as fixed placeholders, the same
placeholder for the same value throughout the session) and saved as JSON under
resources/bench/agents/.

    python scripts/bench_agent.py record --agent claude       (claude-session.json)
    python scripts/bench_agent.py record --agent codex        (codex-session.json)
    python scripts/bench_agent.py record --agent claude-full  (claude-full-first.json: Claude Code's
        default first request, no --bare, no tool limits: saved, not answered)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SESSIONS = REPO / "resources" / "bench" / "agents"
AGENTS = Path(os.environ.get("SPECULUM_AGENTS_DIR", Path.home() / ".cache" / "speculum-dev" / "agents"))
CODEX = Path.home() / ".cache" / "speculum-dev" / "npm" / "bin" / "codex"  # where test_agent_codex installs it
MODEL = "bench"  # bench_peer.speculum_configs' --model-id

# The tasks: read a file, then edit it (an edit turn: the answer writes code), then say so.
SOURCE = ('def greet(name):\n    return "Hello, " + name + "!"\n\n\n'
          'if __name__ == "__main__":\n    print(greet("world"))\n')
CLAUDE_TASK = ('Read greet.py with the Read tool, then use the Edit tool to change the word "Hello" to "Goodbye" '
               "in it.")
CLAUDE_AFTER = "After the edit succeeds, tell the user in one sentence what changed; do not call a tool again."
# Codex offers an unknown model no apply_patch tool (exec_command, write_stdin, request_user_input): it
# edits through the shell. Asked to read the file, then edit it, the 1.5B target read it, then called
# write_stdin again and again (three recordings): here the edit is the task's first command.
CODEX_INSTRUCTIONS = ("You are a coding agent on the user's machine. Run shell commands with the exec_command tool. "
                      "Then answer the user in one sentence from the command's output.\n")
# (Asked which greeting the file holds after the edit, it answered "Goodbye" without running anything.)
CODEX_TASK = "Run `sed -i 's/Hello/Goodbye/' greet.py && wc -c greet.py` and tell me how many bytes greet.py has now."

EDIT_TOOLS = {"Edit", "Write", "MultiEdit", "NotebookEdit", "apply_patch"}
# A shell call that writes a file (Codex may edit through exec_command instead of apply_patch).
WRITES = re.compile(r"sed -i|apply_patch|\btee\b|cat\s*<<|>\s*[\w./]|perl -pi")


def session_file(agent: str) -> Path:
    """Where a recorded session lives: claude-session.json, codex-session.json, claude-full-first.json."""
    return SESSIONS / ("claude-full-first.json" if agent == "claude-full" else f"{agent}-session.json")


# -- scrubbing -------------------------------------------------------------------------------

UUID = re.compile(r"(?<![0-9a-zA-Z])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
                  r"(?![0-9a-zA-Z])")  # (after "session_" too: an underscore is no boundary for \b)
HEX = re.compile(r"(?<![0-9a-fA-F])[0-9a-f]{16,}(?![0-9a-fA-F])")  # request, call and session ids; hashes
DATE = re.compile(r"\b(19|20)\d\d-[01]\d-[0-3]\d\b")
TIME = re.compile(r"\b[0-2]\d:[0-5]\d:[0-5]\d(\.\d+)?\b")
SLASH_DATE = re.compile(r"\b\d{1,2}/\d{1,2}/(19|20)\d\d\b")
BILLING_HASH = re.compile(r"\bcch=[0-9a-zA-Z]+")
TMP = re.compile(r"/tmp/[^\s\"'/\\<>]+")


@dataclass
class Scrubber:
    """Replaces what names this machine, this session or this day with fixed placeholders. One
    scrubber per session: a value met again gets the same placeholder, so a tool call's id still
    matches its result's, and every turn's prefix stays the previous turn's (the prompt cache's)."""
    paths: dict[str, str] = field(default_factory=dict)  # literal path -> placeholder, longest first
    seen: dict[str, str] = field(default_factory=dict)

    def _same(self, value: str, placeholder: str) -> str:
        """``placeholder`` numbered (n: the n-th distinct value of its kind), the same for the same value."""
        if value not in self.seen:
            n = sum(1 for v in self.seen.values() if len(v) == len(placeholder.format(0))) + 1
            self.seen[value] = placeholder.format(n)
        return self.seen[value]

    def text(self, s: str) -> str:
        for path in sorted(self.paths, key=len, reverse=True):
            s = s.replace(path, self.paths[path])
        s = TMP.sub("/tmp/scrubbed", s)
        s = UUID.sub(lambda m: self._same(m.group(0).lower(), "00000000-0000-4000-8000-{:012d}"), s)
        s = HEX.sub(lambda m: self._same(m.group(0), "{:0%dd}" % len(m.group(0))), s)
        s = BILLING_HASH.sub("cch=00000", s)
        s = DATE.sub("2025-01-01", s)
        s = SLASH_DATE.sub("1/1/2025", s)
        return TIME.sub("12:00:00", s)

    def json(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.json(v) for v in value]
        if isinstance(value, dict):
            return {k: self.json(v) for k, v in value.items()}
        return value


# -- what an answer called -------------------------------------------------------------------

def calls_in(sse: str) -> list[tuple[str, str]]:
    """(tool name, arguments) of each call in a streamed answer, Anthropic's or Responses'."""
    calls: list[list[str]] = []
    for line in sse.splitlines():
        if not line.startswith("data: "):
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            continue
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "content_block_start" and event["content_block"].get("type") == "tool_use":
            calls.append([event["content_block"]["name"], ""])
        elif kind == "content_block_delta" and event["delta"].get("type") == "input_json_delta" and calls:
            calls[-1][1] += event["delta"].get("partial_json", "")
        elif kind == "response.output_item.done" and event["item"].get("type") in ("function_call", "custom_tool_call"):
            item = event["item"]
            calls.append([item.get("name", ""), item.get("arguments") or item.get("input") or ""])
    return [(name, arguments) for name, arguments in calls]


def edits(calls: list[tuple[str, str]]) -> bool:
    """Whether an answer's calls write code: an edit tool, or a shell command that writes a file."""
    return any(name in EDIT_TOOLS or WRITES.search(arguments) for name, arguments in calls)


# -- the logging proxy -----------------------------------------------------------------------

class Recorder:
    """A loopback HTTP proxy to the server that keeps each POST to ``path`` with its streamed answer."""

    HOP = {"host", "content-length", "transfer-encoding", "connection", "content-encoding", "accept-encoding"}

    def __init__(self, upstream: str, path: str, answer: bool = True):
        import httpx
        import uvicorn
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        self.turns: list[dict] = []
        self.other: list[str] = []  # requests to other paths, forwarded and named in the note
        client = httpx.AsyncClient(timeout=None)

        async def forward(request):
            body = await request.body()
            keep = request.method == "POST" and request.url.path == path
            if not keep:
                self.other.append(f"{request.method} {request.url.path}")
                if not answer:  # no server behind: only the kept path is heard
                    return JSONResponse({"error": "not recorded"}, 404)
            elif not answer:
                self.turns.append({"body": json.loads(body), "sse": ""})
                return JSONResponse({"type": "error", "error": {"type": "invalid_request_error",
                                                                "message": "recorded, not answered"}}, 400)
            headers = {k: v for k, v in request.headers.items() if k.lower() not in self.HOP}
            sent = client.build_request(request.method, upstream + request.url.path, params=request.query_params,
                                        content=body, headers=headers)
            response = await client.send(sent, stream=True)
            pieces: list[bytes] = []

            async def relay():
                try:
                    async for chunk in response.aiter_bytes():
                        pieces.append(chunk)
                        yield chunk
                finally:
                    await response.aclose()
                    if keep:
                        self.turns.append({"body": json.loads(body), "status": response.status_code,
                                           "sse": b"".join(pieces).decode("utf-8", "replace")})

            return StreamingResponse(relay(), status_code=response.status_code,
                                     headers={k: v for k, v in response.headers.items() if k.lower() not in self.HOP})

        app = Starlette(routes=[Route("/{rest:path}", forward, methods=["GET", "POST", "HEAD", "OPTIONS"])])
        with __import__("socket").socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


# -- the agents ------------------------------------------------------------------------------

def claude_command(task: str, full: bool) -> list[str]:
    binary = AGENTS / "node_modules" / ".bin" / "claude"
    if not binary.exists():
        raise SystemExit(f"Claude Code is not installed at {binary}: run tests/test_agent_claude.py once "
                         "(it installs @anthropic-ai/claude-code from npm)")
    if full:
        return [str(binary), "-p", task, "--model", MODEL, "--output-format", "json"]
    return [str(binary), "-p", task, "--bare", "--tools", "Read,Edit", "--allowedTools", "Read,Edit", "--model", MODEL,
            "--append-system-prompt", CLAUDE_AFTER, "--output-format", "json"]


def codex_command(url: str, work: Path, instructions: Path, task: str) -> list[str]:
    """tests/test_agent_codex.py's small Codex (one-line instructions, no multi-agent, skills or web
    search), here allowed to write its folder so apply_patch can edit."""
    if not CODEX.exists():
        raise SystemExit(f"Codex CLI is not installed at {CODEX}: run tests/test_agent_codex.py once, or "
                         f"npm install --global --prefix {CODEX.parent.parent} @openai/codex")
    provider = (f'{{name="Speculum", base_url="{url}/v1", wire_api="responses", stream_idle_timeout_ms=1800000}}')
    return [str(CODEX), "exec", "--skip-git-repo-check", "--cd", str(work), "--model", MODEL,
            "--sandbox", "workspace-write", "-c", "model_provider=speculum",
            "-c", f"model_providers.speculum={provider}",
            "-c", f"model_instructions_file={instructions}", "--disable", "multi_agent", "--disable", "goals",
            "--disable", "view_image", "--disable", "skill_search", "-c", "skills.bundled.enabled=false",
            "-c", "web_search=disabled", task]


def record(agent: str, ctx: int, threads: int, out: Path | None) -> Path:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_peer import Server, speculum_configs
    from demo_pair import demo_pair

    full = agent == "claude-full"
    api_path = "/v1/responses" if agent == "codex" else "/v1/messages"
    target, draft = demo_pair(None, None, alone=False)
    root = Path(tempfile.mkdtemp(prefix="bench-agent-record-"))
    work, home = root / "project", root / "home"
    work.mkdir()
    home.mkdir()
    (work / "greet.py").write_text(SOURCE)
    server = None if full else Server(speculum_configs(target, draft, ctx, threads)[0], root)
    if server is not None:
        server.wait_ready()
    proxy = Recorder(server.url if server else "http://127.0.0.1:9", api_path, answer=not full)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "NO_COLOR": "1"}
    if agent == "codex":
        instructions = root / "instructions.md"
        instructions.write_text(CODEX_INSTRUCTIONS)
        env["CODEX_HOME"] = str(home)
        command, task = codex_command(proxy.url, work, instructions, CODEX_TASK), CODEX_TASK
    else:
        env.update(ANTHROPIC_BASE_URL=proxy.url, ANTHROPIC_API_KEY="bench-key", DISABLE_AUTOUPDATER="1",
                   DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                   CLAUDE_CODE_MAX_RETRIES="0")
        command, task = claude_command(CLAUDE_TASK, full), CLAUDE_TASK
    started = time.monotonic()
    try:
        if full:  # the first request is all we keep: the agent is stopped once it is sent
            process = subprocess.Popen(command, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while not proxy.turns and process.poll() is None and time.monotonic() - started < 300:
                time.sleep(0.2)
            process.terminate()
            process.wait(30)
            run_note = "the first request only (the agent stopped once it was sent)"
        else:
            run = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=3000,
                                 stdin=subprocess.DEVNULL)
            print(run.stdout[-3000:], run.stderr[-3000:], sep="\n", file=sys.stderr)
            run_note = f"exit {run.returncode} after {time.monotonic() - started:.0f} s"
    finally:
        proxy.stop()
        if server is not None:
            server.stop()
        for log in root.glob("*.log"):  # the server's own words, before its folder goes
            print(f"{log.name}:\n{log.read_text(errors='replace')[-2000:]}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)
    refused = [t for t in proxy.turns if t.get("status", 200) != 200]
    if refused or not proxy.turns:
        raise SystemExit(f"{agent} sent {len(proxy.turns)} {api_path} requests, {len(refused)} refused: "
                         + "; ".join(t["sse"][:300] for t in refused))
    scrub = Scrubber(paths={str(work): "/home/user/project", str(home): "/home/user", str(root): "/tmp/scrubbed",
                            str(Path.home()): "/home/user", str(REPO): "/home/user/speculum"})
    version = subprocess.run([command[0], "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    turns = []
    for turn in proxy.turns:
        calls = calls_in(turn["sse"])
        turns.append({"edit": edits(calls), "answer_calls": [name for name, _ in calls],
                      "body": scrub.json(turn["body"])})
    session = {"agent": agent, "api": api_path, "client": scrub.text(version), "task": task,
               "recorded": f"{len(turns)} requests " + ("captured by the proxy, not answered" if full else
                                                         f"against speculum serve (auto, demo pair), {run_note}"),
               "other_requests": sorted(set(proxy.other)), "turns": turns}
    out = out or session_file(agent)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(session, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{out}: {len(turns)} turns, edit turns {[i + 1 for i, t in enumerate(turns) if t['edit']]}",
          file=sys.stderr)
    return out
