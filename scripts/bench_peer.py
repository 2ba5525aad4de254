"""Speculum against llama.cpp's own llama-server: the same chat requests through the OpenAI API.

Each configuration is a server process of its own on 127.0.0.1, started fresh every round
(fresh data folder, nothing cached): `speculum serve` in auto mode and in plain decoding
(--mode off), and llama-server built from the llama.cpp that llama-cpp-python vendors
(scripts/build_llama_server.sh) plain and with each of its speculative types that applies:
a draft model (draft-simple), ngram-mod, ngram-cache, and the draft model with ngram-mod.

The requests, greedy, streamed, each sent to every configuration before the next one (the
order turns from step to step, so machine load falls on all alike):
- every prompt of the suite (resources/bench/default.jsonl), first time and the same request again;
- regenerate: a follow-up turn in a conversation (its first answer in the prompt), then that
  turn asked again, as a chat window's "regenerate" does;
- switch back: conversation A, then B, then A's next turn (A's prefix read long ago).

Reported per request: decode tok/s (tokens after the first over the time after the first),
end-to-end tok/s (tokens over the whole request), time to first token, and whether the text
equals llama-server plain's. Compare within a round: the machine's speed moves between rounds.

    python scripts/bench_peer.py            (the demo pair, two rounds; builds llama-server once)
    python scripts/bench_peer.py --quick    (SmolLM2 alone, two short prompts, one round)
    (add --target T --draft D, --rounds N, --configs NAME,..., --only PROMPT,..., --max-tokens N,
     --threads N, --ctx N, --llama-server BIN, --json FILE)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent
PLAIN = "llama-server plain"
SPECULUM = ("speculum auto", "speculum off")
QUICK_PROMPTS = ("code-editing", "open-chat")
FOLLOW_UP = "Thank you. Now give the same answer once more, exactly as before."
SWITCH_BACK = "Now do the same once more, but also rename the variable `totals` to `sums`."
# engine/llama/cpu_settings.py's thread wait, for llama-server where asked (--llama-wait speculum)
SPECULUM_WAIT = (("GOMP_SPINCOUNT", "1000"), ("OMP_WAIT_POLICY", "active"))
SETTLE_S = 180  # longest wait for a fresh auto server's idle cost measuring before the first request


@dataclass(frozen=True)
class Config:
    """One server: what it is called in the table and the command that starts it (PORT filled in)."""
    name: str
    command: tuple[str, ...]
    speculum: bool = False
    env: tuple[tuple[str, str], ...] = ()  # set for this server alone
    optional: bool = False  # run only when named


@dataclass
class Step:
    """One request of a case: its row in the table (None: sent, not reported) and its messages,
    built from the answers this configuration gave earlier in the case."""
    row: str | None
    messages: Callable[[list[str]], list[dict]]
    max_tokens: int
    json_schema: dict | None = None  # sent as response_format: the answer follows it


@dataclass
class Result:
    ttft_s: float
    seconds: float
    tokens: int
    prompt_tokens: int
    cached_tokens: int | None
    text: str

    @property
    def decode_tok_s(self) -> float:
        decode = self.seconds - self.ttft_s
        return (self.tokens - 1) / decode if self.tokens > 1 and decode > 0 else 0.0

    @property
    def e2e_tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Table:
    """Results by (row, configuration), one per round."""
    rows: list[str] = field(default_factory=list)
    configs: list[str] = field(default_factory=list)
    cells: dict[tuple[str, str], list[Result]] = field(default_factory=dict)

    def add(self, row: str, config: str, result: Result) -> None:
        if row not in self.rows:
            self.rows.append(row)
        if config not in self.configs:
            self.configs.append(config)
        self.cells.setdefault((row, config), []).append(result)

    def runs(self, row: str, config: str) -> list[Result]:
        return self.cells.get((row, config), [])


# -- the configurations ----------------------------------------------------------------------

def speculum_configs(target: str, draft: str | None, ctx: int, threads: int | None,
                     exact: bool = False) -> list[Config]:
    """``threads`` None: Speculum's own choice, as a user runs it (all cores, one fewer for each
    core another program holds: engine/llama/contention.py); a number is kept fixed. ``exact``:
    serve --exact (rows pass-size invariant: speculation writes plain decoding's tokens)."""
    base = (sys.executable, "-m", "speculum.cli", "serve", "--target", target, "--ctx", str(ctx),
            *(("--threads", str(threads)) if threads else ()), "--host", "127.0.0.1", "--port", "PORT",
            "--model-id", "bench", *(("--draft", draft) if draft else ()), *(("--exact",) if exact else ()))
    # (optional) without the exact build's invariant kernels: what exactness costs beside llama-server
    return [Config("speculum auto", (*base, "--mode", "auto"), speculum=True),
            Config("speculum off", (*base, "--mode", "off"), speculum=True),
            Config("speculum auto (not exact)", (*base, "--mode", "auto", "--no-exact"), speculum=True, optional=True),
            Config("speculum off (not exact)", (*base, "--mode", "off", "--no-exact"), speculum=True, optional=True)]


def llama_server_configs(binary: str, target: str, draft: str | None, ctx: int, threads: int,
                         types: Sequence[str]) -> list[Config]:
    """Plain, and every speculative type of this build that applies (a draft model only with one)."""
    base = (binary, "-m", target, "-c", str(ctx), "-np", "1", "-t", str(threads), "-tb", str(threads),
            "--host", "127.0.0.1", "--port", "PORT", "--alias", "bench", "--no-webui")
    with_draft = ("-md", draft, "-td", str(threads), "-tbd", str(threads)) if draft else ()
    wanted = [("llama-server draft-simple", ("draft-simple",), True),
              ("llama-server ngram-mod", ("ngram-mod",), False),
              ("llama-server ngram-cache", ("ngram-cache",), False),
              ("llama-server draft-simple+ngram-mod", ("draft-simple", "ngram-mod"), True)]
    configs = [Config(PLAIN, base)]
    for name, spec, needs_draft in wanted:
        if all(t in types for t in spec) and (draft or not needs_draft):
            configs.append(Config(name, (*base, *(with_draft if needs_draft else ()), "--spec-type", ",".join(spec))))
    # Not run unless named (--configs): plain with one of Speculum's own CPU settings each, to
    # find what a difference between Speculum's plain decoding and llama-server's comes from.
    configs += [Config(f"{PLAIN} (flash attention off)", (*base, "-fa", "off"), optional=True),
                Config(f"{PLAIN} (Speculum's thread wait)", base, optional=True, env=SPECULUM_WAIT)]
    return configs


def spec_types(binary: str) -> list[str]:
    """The speculative types this llama-server names in its --help ([]: none, or an older build)."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60).stdout
    for line in out.splitlines():
        if line.strip().startswith("--spec-type"):
            names = line.split()[1] if len(line.split()) > 1 else ""
            return [n for n in names.replace("[", "").replace("]", "").split(",") if n]
    return []


# -- servers ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A configuration's server process, listening on a free loopback port once ``start`` returns."""

    def __init__(self, config: Config, log_dir: Path):
        self.config = config
        self.port = free_port()
        self.data = Path(tempfile.mkdtemp(prefix="bench-peer-", dir=log_dir))
        self.log = (log_dir / f"{config.name.replace(' ', '_')}.log").open("ab")
        env = {**os.environ, **dict(config.env)}
        if config.speculum:
            # A fresh data folder (no measured policy, no n-gram memory, no tuning result), and no
            # idle tuning children beside the other servers' requests.
            env.update(SPECULUM_DATA_DIR=str(self.data / "data"), SPECULUM_CONFIG_DIR=str(self.data / "config"),
                       SPECULUM_NO_TUNING="1", PYTHONPATH=str(REPO / "app"))
        command = [str(self.port) if part == "PORT" else part for part in self.config.command]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                        cwd=str(self.data))
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 900) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.config.name} exited with code {self.process.returncode}; "
                                 f"see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.config.name} did not become ready in {timeout:.0f} s; see {self.log.name}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.data, ignore_errors=True)


def sse_events(url: str, body: dict, headers: dict | None = None, what: str = "") -> Iterator[dict]:
    """A streamed POST's server-sent events, parsed; an answer other than 200 ends the bench, with
    its text (``what``: the request, for that message)."""
    import httpx

    with httpx.stream("POST", url, json=body, headers=headers or {}, timeout=3600) as response:
        if response.status_code != 200:
            response.read()
            raise SystemExit(f"{url} answered {what}{response.status_code}: {response.text[:400]}")
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


def chat(url: str, messages: list[dict], max_tokens: int, json_schema: dict | None = None) -> Result:
    """One streamed, greedy chat request; times measured here, in the client."""
    body = {"model": "bench", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if json_schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": json_schema}}
    pieces: list[str] = []
    usage: dict = {}
    start = time.perf_counter()
    first = None
    for chunk in sse_events(url + "/v1/chat/completions", body):
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") or ""
            if piece and first is None:
                first = time.perf_counter()
            pieces.append(piece)
        usage = chunk.get("usage") or usage
    end = time.perf_counter()
    details = usage.get("prompt_tokens_details") or {}
    return Result(ttft_s=(first or end) - start, seconds=end - start, tokens=int(usage.get("completion_tokens", 0)),
                  prompt_tokens=int(usage.get("prompt_tokens", 0)), cached_tokens=details.get("cached_tokens"),
                  text="".join(pieces))


# -- the requests ----------------------------------------------------------------------------

def cases(prompts, max_tokens: int | None) -> list[list[Step]]:
    """Each case: steps one configuration sends in order (its own earlier answers in later prompts)."""
    out = []
    for p in prompts:
        n = max_tokens or p.max_tokens
        out.append([Step(f"{p.name}, first time", lambda _a, p=p: p.messages(), n, p.json_schema),
                    Step(f"{p.name}, again", lambda _a, p=p: p.messages(), n, p.json_schema)])
    by_name = {p.name: p for p in prompts}
    first = by_name.get("verbatim-extraction") or prompts[0]
    n = max_tokens or first.max_tokens
    follow_up = lambda answers, p=first: [*p.messages(), {"role": "assistant", "content": answers[0]},  # noqa: E731
                                          {"role": "user", "content": FOLLOW_UP}]
    out.append([Step(None, lambda _a, p=first: p.messages(), n),
                Step("regenerate: follow-up turn", follow_up, n),
                Step("regenerate: the same turn again", follow_up, n)])
    a = by_name.get("code-editing") or prompts[0]
    b = by_name.get("open-chat") or prompts[-1]
    n = max_tokens or a.max_tokens
    out.append([Step(None, lambda _a, p=a: p.messages(), n),
                Step(None, lambda _a, p=b: p.messages(), max_tokens or b.max_tokens),
                Step("switch back: A's next turn after B",
                     lambda answers, p=a: [*p.messages(), {"role": "assistant", "content": answers[0]},
                                           {"role": "user", "content": SWITCH_BACK}], n)])
    return out


def settled(server: Server, logs: Path, timeout: float) -> None:
    """Waits until a fresh Speculum server has measured auto mode's costs in its idle moments (its
    log says "measured in"): measured later, beside another server's request, it would slow that one."""
    log = logs / f"{server.config.name.replace(' ', '_')}.log"
    deadline = time.monotonic() + timeout
    while "measured in " not in log.read_text(errors="replace"):
        if time.monotonic() > deadline or server.process.poll() is not None:
            print(f"{server.config.name}: not measured after {timeout:.0f} s; replaying anyway", file=sys.stderr)
            return
        time.sleep(1)


def run_round(configs: list[Config], steps_of: list[list[Step]], table: Table, log_dir: Path,
              round_index: int) -> None:
    for config in configs:  # the table's columns in the configurations' order, not the first run's
        if config.name not in table.configs:
            table.configs.append(config.name)
    servers = [Server(c, log_dir) for c in configs]
    try:
        for server in servers:
            server.wait_ready()
        for server in servers:  # auto's idle measuring, on every core, not beside the first requests
            if server.config.speculum and "auto" in server.config.command:
                settled(server, log_dir, SETTLE_S)
        turn = round_index
        for steps in steps_of:
            answers: dict[str, list[str]] = {s.config.name: [] for s in servers}
            for step in steps:
                turn += 1
                order = servers[turn % len(servers):] + servers[:turn % len(servers)]
                for server in order:
                    name = server.config.name
                    result = chat(server.url, step.messages(answers[name]), step.max_tokens, step.json_schema)
                    answers[name].append(result.text)
                    if step.row is not None:
                        table.add(step.row, name, result)
                if step.row is not None:
                    print(f"  {step.row}: " + ", ".join(
                        f"{s.config.name} {table.runs(step.row, s.config.name)[-1].e2e_tok_s:.1f}" for s in servers),
                        file=sys.stderr, flush=True)
    finally:
        for server in servers:
            server.stop()


# -- the report ------------------------------------------------------------------------------

METRICS = {"e2e": ("end-to-end tok/s", lambda r: r.e2e_tok_s, "{:.1f}"),
           "decode": ("decode tok/s", lambda r: r.decode_tok_s, "{:.1f}"),
           "ttft": ("time to first token, s", lambda r: r.ttft_s, "{:.2f}")}


def agreement(table: Table, config: str, reference: str = PLAIN) -> tuple[int, int]:
    """(requests whose text equals ``reference``'s in the same round, requests compared)."""
    same = total = 0
    for row in table.rows:
        for mine, plain in zip(table.runs(row, config), table.runs(row, reference)):
            total += 1
            same += mine.text == plain.text
    return same, total


def paired(table: Table, a: str, b: str, measure: Callable[[Result], float],
           rows: Sequence[str] | None = None) -> list[float]:
    """measure(a) / measure(b) for every row and round where both ran (same round: same load)."""
    ratios = []
    for row in rows if rows is not None else table.rows:
        for x, y in zip(table.runs(row, a), table.runs(row, b)):
            if measure(y) > 0:
                ratios.append(measure(x) / measure(y))
    return ratios


def best_other(table: Table, row: str, round_index: int, measure: Callable[[Result], float],
               higher: bool = True) -> tuple[str, float] | None:
    """The best llama-server configuration on ``row`` in that round."""
    scores = [(c, measure(runs[round_index])) for c in table.configs if not c.startswith("speculum")
              for runs in [table.runs(row, c)] if len(runs) > round_index]
    if not scores:
        return None
    return max(scores, key=lambda s: s[1]) if higher else min(scores, key=lambda s: s[1])


# Issue 47's bars: Speculum's plain decoding against llama-server's, auto against the best
# llama-server configuration of each request (end to end), by kind of request.
BARS = {"off / plain decode, median": 1.00, "off / plain decode, every request": 0.97,
        "auto / best, first time, nothing to copy": 0.99, "auto / best, first time, copy-heavy": 1.2,
        "auto / best, again": 1.0}
BUSY_BAR = 1.5  # off / plain decode with one core busy


def bars(table: Table, copy_heavy: set[str], busy: bool = False) -> dict:
    """Each bar of issue 47 met or not, with the worst request behind it."""
    out: dict = {}
    if "speculum off" in table.configs and PLAIN in table.configs:
        decode = paired(table, "speculum off", PLAIN, lambda r: r.decode_tok_s)
        if decode:
            median = statistics.median(decode)
            if busy:
                out[f"busy core: off / plain decode, median >= {BUSY_BAR}"] = _met(median >= BUSY_BAR, median)
            else:
                out["off / plain decode, median >= 1.00"] = _met(median >= BARS["off / plain decode, median"], median)
                out["off / plain decode, every request >= 0.97"] = _met(
                    min(decode) >= BARS["off / plain decode, every request"], min(decode))
    if "speculum auto" not in table.configs or busy:
        return out
    groups: dict[str, list[tuple[float, str]]] = {}
    for row in table.rows:
        name, _, when = row.rpartition(", ")
        if when == "first time":
            group = "auto / best, first time, copy-heavy" if name in copy_heavy else \
                "auto / best, first time, nothing to copy"
        else:
            group = "auto / best, again"
        for i, mine in enumerate(table.runs(row, "speculum auto")):
            best = best_other(table, row, i, lambda r: r.e2e_tok_s)
            if best is not None and best[1] > 0:
                groups.setdefault(group, []).append((mine.e2e_tok_s / best[1], f"{row}, round {i + 1}, vs {best[0]}"))
    for group, ratios in groups.items():
        worst = min(ratios)
        out[f"{group} >= {BARS[group]}"] = _met(worst[0] >= BARS[group], worst[0], worst[1])
    return out


def _met(ok: bool, value: float, where: str = "") -> str:
    return f"{'met' if ok else 'NOT met'}: {value:.3f}" + (f" ({where})" if where else "")


def verdicts(table: Table) -> dict:
    """The issue's "Done when" comparisons, each with the numbers behind it."""
    out: dict = {}
    first_rows = [r for r in table.rows if r.endswith("first time")]
    if "speculum off" in table.configs and PLAIN in table.configs:
        decode = paired(table, "speculum off", PLAIN, lambda r: r.decode_tok_s)
        ttft = paired(table, "speculum off", PLAIN, lambda r: r.ttft_s, first_rows)
        out["off / plain, decode tok/s (median of requests)"] = _summary(decode)
        out["off / plain, time to first token, first time"] = _summary(ttft)
    if "speculum auto" in table.configs:
        rounds = max((len(v) for v in table.cells.values()), default=0)
        wins, worst, repeated = [], None, []
        for row in table.rows:
            for i in range(rounds):
                best = best_other(table, row, i, lambda r: r.e2e_tok_s)
                mine = table.runs(row, "speculum auto")
                if best is None or len(mine) <= i or best[1] <= 0:
                    continue
                ratio = mine[i].e2e_tok_s / best[1]
                wins.append(ratio >= 1)
                if worst is None or ratio < worst[0]:
                    worst = (ratio, row, i + 1, best[0])
                if not row.endswith("first time"):
                    fastest = best_other(table, row, i, lambda r: r.ttft_s, higher=False)
                    if fastest and fastest[1] > 0:
                        repeated.append(mine[i].ttft_s / fastest[1])
        if wins:
            out["auto >= best llama-server, end-to-end (requests won)"] = f"{sum(wins)} of {len(wins)}"
            out["auto / best llama-server, end-to-end, worst"] = (
                f"{worst[0]:.2f} ({worst[1]}, round {worst[2]}, vs {worst[3]})")
        if repeated:
            out["auto / fastest llama-server, time to first token, repeated prompts"] = _summary(repeated)
    return out


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"median {statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f}, n {len(values)})"


def render(table: Table, metric: str) -> str:
    title, measure, fmt = METRICS[metric]
    width = max([len(r) for r in table.rows] + [8])
    cols = [max(len(c), 11) for c in table.configs]
    lines = [f"{title} (round 1 / round 2 / ...)",
             f"{'request':<{width}} | " + " | ".join(f"{c:>{w}}" for c, w in zip(table.configs, cols))]
    for row in table.rows:
        cells = [" / ".join(fmt.format(measure(r)) for r in table.runs(row, c)) or "-" for c in table.configs]
        lines.append(f"{row:<{width}} | " + " | ".join(f"{x:>{w}}" for x, w in zip(cells, cols)))
    return "\n".join(lines)


def report(table: Table, info: dict, copy_heavy: set[str] = frozenset(), busy: bool = False) -> dict:
    return {"info": info, "configs": table.configs, "verdicts": verdicts(table),
            "bars": bars(table, set(copy_heavy), busy),
            "agreement_with_plain": {c: "{} of {}".format(*agreement(table, c)) for c in table.configs},
            # Speculation's promise, Speculum's own plain decoding the reference (same kernels)
            "auto_same_as_off": "{} of {}".format(*agreement(table, "speculum auto", "speculum off"))
            if {"speculum auto", "speculum off"} <= set(table.configs) else None,
            "rows": [{"request": row, "config": c, "round": i + 1, "ttft_s": round(r.ttft_s, 3),
                      "seconds": round(r.seconds, 3), "tokens": r.tokens, "prompt_tokens": r.prompt_tokens,
                      "cached_tokens": r.cached_tokens, "decode_tok_s": round(r.decode_tok_s, 2),
                      "e2e_tok_s": round(r.e2e_tok_s, 2), "same_as_plain": r.text == plain.text if plain else None}
                     for row in table.rows for c in table.configs
                     for i, r in enumerate(table.runs(row, c))
                     for plain in [(table.runs(row, PLAIN)[i:i + 1] or [None])[0]]]}


# -- main ------------------------------------------------------------------------------------

def build_llama_server() -> str:
    out = subprocess.run(["bash", str(SCRIPTS / "build_llama_server.sh")], stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise SystemExit("building llama-server failed (see above)")
    return out.stdout.strip().splitlines()[-1]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--quick", action="store_true", help="SmolLM2 alone, two short prompts, one round")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--configs", help="comma-separated configuration names (default: all that apply)")
    ap.add_argument("--prompts", help="JSONL prompt suite (default: the bundled one)")
    ap.add_argument("--only", help="comma-separated prompt names of the suite")
    ap.add_argument("--max-tokens", type=int, help="override each prompt's max_tokens")
    ap.add_argument("--threads", type=int, help="threads for every server (default: all cores)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--llama-server", help="a llama-server binary (default: build it from the vendored llama.cpp)")
    ap.add_argument("--llama-wait", choices=("default", "speculum"), default="default",
                    help="how llama-server's threads wait: libgomp's default (300,000 spins, which collapses when "
                         "other programs load the cores), or Speculum's (engine/llama/cpu_settings.py)")
    ap.add_argument("--exact", action="store_true",
                    help="Speculum's servers with --exact (its speculative answers are then plain decoding's, bit for bit)")
    ap.add_argument("--busy-core", action="store_true",
                    help="another program keeps one core busy all the run (a process spinning), as a compile would")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON here ('-': standard output)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(REPO / "app"))
    sys.path.insert(0, str(SCRIPTS))
    from speculum.bench import load_prompts
    from speculum.engine.backend import load_average, one_minute_load, usable_cores
    from demo_pair import demo_pair

    if args.quick:
        models = Path(os.environ.get("SPECULUM_MODELS_DIR", Path.home() / ".cache/speculum-dev/models"))
        target, draft = args.target or str(models / "SmolLM2-135M-Instruct.Q4_1.gguf"), args.draft
    else:
        target, draft = demo_pair(args.target, args.draft, alone=False)
    prompts = load_prompts(args.prompts)
    only = args.only.split(",") if args.only else (QUICK_PROMPTS if args.quick else None)
    if only:
        prompts = [p for p in prompts if p.name in only]
    if not prompts:
        raise SystemExit("no prompts left to run")
    max_tokens = args.max_tokens or (48 if args.quick else None)
    rounds = args.rounds or (1 if args.quick else 2)
    threads = args.threads or usable_cores()
    binary = args.llama_server or build_llama_server()
    configs = (speculum_configs(target, draft, args.ctx, args.threads, args.exact)
               + llama_server_configs(binary, target, draft, args.ctx, threads, spec_types(binary)))
    if args.llama_wait == "speculum":
        configs = [c if c.speculum or c.env else replace(c, env=SPECULUM_WAIT) for c in configs]
    if args.configs:
        wanted = args.configs.split(",")
        configs = [c for c in configs if c.name in wanted]
    else:
        configs = [c for c in configs if not c.optional]
    info = {"target": Path(target).name, "draft": Path(draft).name if draft else None, "threads": threads,
            "ctx": args.ctx, "rounds": rounds, "load_average_start": load_average(),
            "commands": {c.name: " ".join([*(f"{k}={v}" for k, v in c.env), *c.command]) for c in configs}}
    table = Table()
    logs = Path(tempfile.mkdtemp(prefix="bench-peer-logs-"))  # the servers' own output, kept
    print(f"servers' logs in {logs}", file=sys.stderr)
    info["busy_core"], info["exact"] = args.busy_core, args.exact
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy_core else None
    try:
        for i in range(rounds):
            print(f"round {i + 1} of {rounds} (load average {one_minute_load(load_average())})",
                  file=sys.stderr, flush=True)
            run_round(configs, cases(prompts, max_tokens), table, logs, i)
    finally:
        if hog is not None:
            hog.kill()
    info["load_average_end"] = load_average()
    result = report(table, info, {p.name for p in prompts if p.copy_heavy}, args.busy_core)
    for metric in METRICS:
        print(render(table, metric) + "\n")
    print("same greedy text as llama-server plain: "
          + ", ".join(f"{c} {v}" for c, v in result["agreement_with_plain"].items()))
    if result["auto_same_as_off"]:
        print(f"speculum auto's text the same as speculum off's: {result['auto_same_as_off']}")
    for name, value in {**result["verdicts"], **result["bars"]}.items():
        print(f"{name}: {value}")
    for name, command in info["commands"].items():
        print(f"{name}: {command}")
    print(f"threads {threads}, context {args.ctx}; load average {one_minute_load(info['load_average_start'])} "
          f"at the start, {one_minute_load(info['load_average_end'])} at the end")
    if args.json:
        text = json.dumps(result, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
