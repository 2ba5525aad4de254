"""Coding agents' traffic, Speculum against llama.cpp's own llama-server: a recorded agent session
replayed request by request, streamed, through the API the agent spoke.

The sessions (resources/bench/agents/, made by the `record` command, see agent_record.py) hold the
exact request bodies Claude Code sent to /v1/messages and Codex CLI to /v1/responses while doing a
small read-then-edit task against `speculum serve`, scrubbed of paths, ids and dates. Each turn
resends the whole conversation so far, as the agent did: the turns' prompts grow by a tool result
and an answer each, and a server that keeps its prompt cache reads only the new tokens.

Every configuration is a server of its own (bench_peer.py's): `speculum serve` in auto mode with a
fresh data folder, and llama-server (built by scripts/build_llama_server.sh from the vendored
llama.cpp; it serves both APIs itself) plain and with its speculative types: a draft model
(draft-simple), ngram-mod, ngram-cache, the draft model with ngram-mod. Each turn goes to every
configuration before the next turn (the order turns from turn to turn, so the machine's load falls
on all alike); every server gets the same bodies, greedy (temperature 0: the agents send 1 or
none) with max tokens capped (--max-tokens; agents ask 32000), whatever it answered before: the
conversation is the recorded one. Before the first turn the script waits for the fresh Speculum
server to measure auto mode's costs in its idle moments (--settle), which it would otherwise do
beside the other servers' requests, slowing them. llama-server runs as shipped (its default
settings: the comparison a user makes); on a loaded machine its default spin collapses (0.5 tok/s
plain decoding here, docs/notes/issue35-peer.md), and --llama-wait speculum (bench_peer's
SPECULUM_WAIT) gives it Speculum's thread wait, to compare engines rather than thread waits.

Per turn and configuration: the new prompt tokens read (prompt tokens less those the server's
prompt cache gave, from its own usage), time to first token (the first text, tool name or tool
input the client receives), decode tok/s (tokens after the first over the time after the first),
end-to-end tok/s (tokens over the whole request). The summary: Speculum's time to first token
against llama-server's (each configuration, per turn) and Speculum's end-to-end tok/s on edit
turns (those whose recorded answer called an edit tool) against llama-server's best there.

    python scripts/bench_agent.py                    (claude and codex sessions, all configurations)
    python scripts/bench_agent.py --quick            (the first 2 turns, speculum auto and llama-server plain)
    python scripts/bench_agent.py --sessions claude-full   (Claude Code's default first request, ~18.6k
        tokens: --ctx 32768, minutes per server on 2 cores; not in the default run)
    python scripts/bench_agent.py record --agent claude|codex|claude-full
    (add --configs NAME,..., --max-tokens N, --threads N, --ctx N, --llama-server BIN, --json FILE)
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(REPO / "app"))

from agent_record import record, session_file  # noqa: E402
from bench_peer import (PLAIN, SPECULUM_WAIT, Config, Server, build_llama_server,  # noqa: E402
                        llama_server_configs, settled, spec_types, speculum_configs, sse_events)
from bench_peer import Result as PeerResult  # noqa: E402

SPECULUM = "speculum auto"
DEFAULT_SESSIONS = ("claude", "codex")
FULL_CTX = 32768  # Claude Code's default first request (~18.6k tokens) and its answer


@dataclass
class Turn:
    session: str
    index: int  # from 1
    api: str  # the path: /v1/messages or /v1/responses
    edit: bool
    body: dict

    @property
    def row(self) -> str:
        return f"{self.session} {self.index}{' (edit)' if self.edit else ''}"


@dataclass
class Result(PeerResult):
    """One turn's answer, timed as bench_peer times a request (its rates are bench_peer's)."""
    text: str = ""  # (not compared here: the turns replay the recorded conversation)
    calls: tuple[str, ...] = ()  # the tools called, as the client received them (none: a text answer)

    @property
    def received(self) -> str:
        return "call " + ",".join(self.calls) if self.calls else "text"

    @property
    def new_tokens(self) -> int:
        return self.prompt_tokens - (self.cached_tokens or 0)


def load_turns(names: Sequence[str], limit: int | None) -> list[Turn]:
    turns = []
    for name in names:
        path = session_file(name)
        if not path.exists():
            raise SystemExit(f"no recorded session {path}: record it with `bench_agent.py record --agent {name}`")
        session = json.loads(path.read_text(encoding="utf-8"))
        for i, turn in enumerate(session["turns"][:limit]):
            turns.append(Turn(name, i + 1, session["api"], turn["edit"], turn["body"]))
    return turns


def replay_body(turn: Turn, max_tokens: int) -> dict:
    """The recorded body, streamed, greedy, its answer capped at ``max_tokens``."""
    body = {**turn.body, "stream": True, "temperature": 0, "model": "bench"}
    body.pop("top_p", None)
    body.pop("top_k", None)
    if turn.api == "/v1/messages":
        body["max_tokens"] = min(int(body.get("max_tokens") or max_tokens), max_tokens)
    else:
        body["max_output_tokens"] = min(int(body.get("max_output_tokens") or max_tokens), max_tokens)
    return body


FIRST_OUTPUT = {"text_delta", "input_json_delta", "response.output_text.delta",
                "response.function_call_arguments.delta"}


def called(event: dict) -> str | None:
    """The tool's name where an event opens a call: Anthropic's tool_use block, Responses' function_call
    item. (A call the server did not read as one reaches the client as text, and is counted so.)"""
    kind = event.get("type")
    block = (event.get("content_block") if kind == "content_block_start"
             else event.get("item") if kind == "response.output_item.added" else None)
    if isinstance(block, dict) and block.get("type") in ("tool_use", "function_call"):
        return str(block.get("name"))
    return None


def is_output(event: dict) -> bool:
    """Whether an event carries the model's first output: text, a tool's name or its input."""
    if event.get("type") == "content_block_delta":
        return event.get("delta", {}).get("type") in FIRST_OUTPUT
    return event.get("type") in FIRST_OUTPUT or called(event) is not None


def usage_of(event: dict, usage: dict) -> dict:
    """The usage an event carries, merged into what earlier events said (Anthropic's message_start
    holds the prompt's counts at llama-server, its message_delta the final ones at Speculum)."""
    found = (event.get("message") or {}).get("usage") or event.get("usage") or \
        (event.get("response") or {}).get("usage")
    return {**usage, **found} if isinstance(found, dict) else usage


def send(url: str, turn: Turn, max_tokens: int) -> Result:
    headers = {"x-api-key": "bench", "anthropic-version": "2023-06-01"} if turn.api == "/v1/messages" else {}
    usage: dict = {}
    start = time.perf_counter()
    first = None
    calls = []
    for event in sse_events(url + turn.api, replay_body(turn, max_tokens), headers, what=f"{turn.row} with "):
        if event.get("type") in ("error", "response.failed"):
            raise SystemExit(f"{url}{turn.api} failed on {turn.row}: {json.dumps(event)[:400]}")
        if first is None and is_output(event):
            first = time.perf_counter()
        if (name := called(event)) is not None:
            calls.append(name)
        usage = usage_of(event, usage)
    end = time.perf_counter()
    if turn.api == "/v1/messages":  # input_tokens: those read; cache_read_input_tokens: those the cache gave
        cached = int(usage.get("cache_read_input_tokens") or 0)
        prompt = int(usage.get("input_tokens") or 0) + cached
    else:  # input_tokens: the whole prompt
        cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
        prompt = int(usage.get("input_tokens") or 0)
    return Result(ttft_s=(first or end) - start, seconds=end - start, tokens=int(usage.get("output_tokens") or 0),
                  prompt_tokens=prompt, cached_tokens=cached, calls=tuple(calls))


# -- the run and the report ------------------------------------------------------------------

def run(configs: list[Config], turns: list[Turn], max_tokens: int, logs: Path,
        settle_s: float) -> dict[tuple[str, str], Result]:
    results: dict[tuple[str, str], Result] = {}
    servers = [Server(c, logs) for c in configs]
    try:
        for server in servers:
            server.wait_ready()
        for server in servers:
            if server.config.speculum and settle_s > 0:
                settled(server, logs, settle_s)
        for i, turn in enumerate(turns):
            order = servers[i % len(servers):] + servers[:i % len(servers)]
            for server in order:
                results[(turn.row, server.config.name)] = send(server.url, turn, max_tokens)
            print(f"  {turn.row}: " + ", ".join(
                f"{s.config.name} new {results[(turn.row, s.config.name)].new_tokens} "
                f"ttft {results[(turn.row, s.config.name)].ttft_s:.2f}s" for s in servers), file=sys.stderr, flush=True)
    finally:
        for server in servers:
            server.stop()
    return results


METRICS = {"new": ("new prompt tokens read (prompt - cached)", lambda r: r.new_tokens, "{:d}"),
           "prompt": ("prompt tokens", lambda r: r.prompt_tokens, "{:d}"),
           "tokens": ("answer tokens", lambda r: r.tokens, "{:d}"),
           "ttft": ("time to first token, s", lambda r: r.ttft_s, "{:.2f}"),
           "decode": ("decode tok/s", lambda r: r.decode_tok_s, "{:.1f}"),
           "e2e": ("end-to-end tok/s", lambda r: r.e2e_tok_s, "{:.1f}"),
           "received": ("what the client received: tool calls, or text", lambda r: r.received, "{}")}


def render(results, turns: list[Turn], configs: list[str], metric: str) -> str:
    title, measure, fmt = METRICS[metric]
    width = max(len(t.row) for t in turns)
    cols = [max(len(c), 8) for c in configs]
    lines = [title, f"{'turn':<{width}} | " + " | ".join(f"{c:>{w}}" for c, w in zip(configs, cols))]
    for t in turns:
        cells = [fmt.format(measure(results[(t.row, c)])) if (t.row, c) in results else "-" for c in configs]
        lines.append(f"{t.row:<{width}} | " + " | ".join(f"{x:>{w}}" for x, w in zip(cells, cols)))
    return "\n".join(lines)


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"median {statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f}, n {len(values)})"


def verdicts(results, turns: list[Turn], configs: list[str]) -> dict:
    """Issue 48's comparisons: TTFT per turn against each llama-server configuration, and end-to-end
    tok/s on edit turns against the best llama-server configuration of that turn."""
    out: dict = {}
    others = [c for c in configs if not c.startswith("speculum")]
    if SPECULUM not in configs or not others:
        return out
    for c in others:
        ratios = [results[(t.row, SPECULUM)].ttft_s / results[(t.row, c)].ttft_s for t in turns
                  if results[(t.row, c)].ttft_s > 0]
        wins = sum(results[(t.row, SPECULUM)].ttft_s <= results[(t.row, c)].ttft_s for t in turns)
        out[f"TTFT speculum / {c}"] = f"{_summary(ratios)}; turns with speculum <= : {wins} of {len(turns)}"
        # A tool call's first event is its name, some tokens into the answer; a call another server
        # did not read as one is text from its first token, and the client gets no call.
        alike = [t for t in turns if results[(t.row, SPECULUM)].received == results[(t.row, c)].received]
        as_text = [t.row for t in turns if results[(t.row, SPECULUM)].calls and not results[(t.row, c)].calls]
        if len(alike) < len(turns):
            ratios = [results[(t.row, SPECULUM)].ttft_s / results[(t.row, c)].ttft_s for t in alike
                      if results[(t.row, c)].ttft_s > 0]
            out[f"TTFT speculum / {c}, turns answered alike"] = (
                f"{_summary(ratios)}; {c} sent as text what speculum sent as a call on: {', '.join(as_text) or 'none'}")
    edit_rows = [t for t in turns if t.edit]
    ratios, lines = [], []
    for t in edit_rows:
        best = max(others, key=lambda c: results[(t.row, c)].e2e_tok_s)
        theirs = results[(t.row, best)].e2e_tok_s
        mine = results[(t.row, SPECULUM)].e2e_tok_s
        if theirs > 0:
            ratios.append(mine / theirs)
        lines.append(f"{t.row}: {mine:.1f} vs {theirs:.1f} ({best})")
    if edit_rows:
        out["edit turns, end-to-end tok/s speculum / best llama-server"] = (
            f"{_summary(ratios)}; won {sum(r >= 1 for r in ratios)} of {len(ratios)}: " + "; ".join(lines))
    return out


def report_json(results, turns: list[Turn], configs: list[str], info: dict) -> dict:
    return {"info": info, "configs": configs, "verdicts": verdicts(results, turns, configs),
            "rows": [{"turn": t.row, "session": t.session, "index": t.index, "edit": t.edit, "config": c,
                      "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens, "new_tokens": r.new_tokens,
                      "answer_tokens": r.tokens, "ttft_s": round(r.ttft_s, 3), "seconds": round(r.seconds, 3),
                      "decode_tok_s": round(r.decode_tok_s, 2), "e2e_tok_s": round(r.e2e_tok_s, 2),
                      "calls": list(r.calls)}
                     for t in turns for c in configs for r in [results.get((t.row, c))] if r is not None]}


def bench(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--sessions", default=",".join(DEFAULT_SESSIONS),
                    help="comma-separated: claude, codex, claude-full (Claude Code's default first request, "
                         "--ctx 32768)")
    ap.add_argument("--quick", action="store_true", help="the first 2 turns; speculum auto and llama-server plain")
    ap.add_argument("--turns", type=int, help="replay only each session's first N turns")
    ap.add_argument("--configs", help="comma-separated configuration names (default: all that apply)")
    ap.add_argument("--max-tokens", type=int, default=512, help="each answer's cap (default 512)")
    ap.add_argument("--threads", type=int, help="threads for every server (default: all cores)")
    ap.add_argument("--ctx", type=int, help=f"context (default 8192; {FULL_CTX} with claude-full)")
    ap.add_argument("--llama-server", help="a llama-server binary (default: build it from the vendored llama.cpp)")
    ap.add_argument("--settle", type=float, default=900, metavar="S",
                    help="wait up to S seconds for Speculum's idle measuring before the first turn (0: do not)")
    ap.add_argument("--llama-wait", choices=("default", "speculum"), default="default",
                    help="how llama-server's threads wait: libgomp's default (as shipped), or Speculum's "
                         "(engine/llama/cpu_settings.py), so engines are compared where the default collapses "
                         "because other programs load the cores (docs/notes/issue35-peer.md)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON here ('-': standard output)")
    args = ap.parse_args(argv)

    from demo_pair import demo_pair
    from speculum.engine.backend import load_average, one_minute_load, usable_cores

    names = args.sessions.split(",")
    turns = load_turns(names, 2 if args.quick else args.turns)
    ctx = args.ctx or (FULL_CTX if "claude-full" in names else 8192)
    target, draft = demo_pair(args.target, args.draft, alone=False)
    threads = args.threads or usable_cores()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (the servers are stopped on the way out)
    wanted = args.configs.split(",") if args.configs else ([SPECULUM, PLAIN] if args.quick else None)
    configs = [c for c in speculum_configs(target, draft, ctx, threads)
               if c.name == SPECULUM or wanted and c.name in wanted and "auto" in c.name]
    if not wanted or any(not w.startswith("speculum") for w in wanted):
        binary = args.llama_server or build_llama_server()
        configs += [c for c in llama_server_configs(binary, target, draft, ctx, threads, spec_types(binary))
                    if not c.optional]
    if wanted:
        configs = [c for c in configs if c.name in wanted]
    if args.llama_wait == "speculum":
        configs = [c if c.speculum else replace(c, env=SPECULUM_WAIT) for c in configs]
    names_of = [c.name for c in configs]
    info = {"target": Path(target).name, "draft": Path(draft).name if draft else None, "threads": threads,
            "ctx": ctx, "max_tokens": args.max_tokens, "sessions": names, "settle_s": args.settle,
            "load_average_start": load_average(),
            "commands": {c.name: " ".join([*(f"{k}={v}" for k, v in c.env), *c.command]) for c in configs}}
    logs = Path(tempfile.mkdtemp(prefix="bench-agent-logs-"))
    print(f"servers' logs in {logs}; load average {one_minute_load(info['load_average_start'])}", file=sys.stderr)
    results = run(configs, turns, args.max_tokens, logs, args.settle)
    info["load_average_end"] = load_average()
    out = report_json(results, turns, names_of, info)
    for metric in METRICS:
        print(render(results, turns, names_of, metric) + "\n")
    for name, value in out["verdicts"].items():
        print(f"{name}: {value}")
    for name, command in info["commands"].items():
        print(f"{name}: {command}")
    print(f"threads {threads}, context {ctx}, max tokens {args.max_tokens}; load average "
          f"{one_minute_load(info['load_average_start'])} at the start, {one_minute_load(info['load_average_end'])} "
          "at the end")
    if args.json:
        text = json.dumps(out, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text, encoding="utf-8")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["record"]:
        ap = argparse.ArgumentParser(prog="bench_agent.py record", description="record an agent session")
        ap.add_argument("--agent", choices=("claude", "codex", "claude-full"), required=True)
        ap.add_argument("--ctx", type=int, default=8192)
        ap.add_argument("--threads", type=int)
        ap.add_argument("--out", type=Path, help="where to save (default: resources/bench/agents/)")
        args = ap.parse_args(argv[1:])
        from speculum.engine.backend import usable_cores

        record(args.agent, args.ctx, args.threads or usable_cores(), args.out)
        return 0
    return bench(argv)


if __name__ == "__main__":
    sys.exit(main())
