#!/usr/bin/env python3
"""Plain vs speculative decoding with the target on RPC workers, as network latency grows,
over the secure link (TLS, paired), the plain one (--insecure, through Speculum's relay) and
llama.cpp's own direct connection, side by side.

Starts ``--workers`` `speculum rpc-worker` processes on 127.0.0.1 for each link, puts a TCP
relay in front of each that holds every chunk ``delay`` ms in each direction (latency, not
bandwidth; the secure link's TLS records pass through it as they are), and loads the target
across the relays with the draft local. For each delay it runs, on the same loaded models:
plain, draft model (k adapted), auto, and on a copy-heavy prompt plain vs prompt lookup.
Each delay gets a fresh Decoder and a fresh data folder, so the auto policy measures its
verify-cost curve over that delay's network. Links alternate within each delay, ``--repeat``
rounds, each led by the next link in turn; each link's median run counts, and each ratio
between links is the median of the rounds' own ratios, with their range (a burst of another
process's work on a shared machine slows whichever link runs then: the range says how noisy
the machine was).

On one machine, the workers and this process (the client's threads, its relays, the latency
relays) take turns on the same cores, which two machines never do; the secure link, with a
thread more on each side, loses more to that sharing than the plain one. ``--split-cores``
(Linux) gives the workers one half of the cores and this process the other, as two machines.

    python scripts/bench_rpc.py --target T.gguf --draft D.gguf [--delays 0,1,5] [--tokens 64]
        [--links secure,plain,direct] [--runs plain,draft,auto,copy,lookup] [--repeat 3]
        [--split-cores] [--json FILE]
    python scripts/bench_rpc.py --pool FILE [FILE ...]     # several runs' --json, their rounds together
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import struct
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import speculum
from speculum.engine.rpc import client as rpc
from speculum.engine.backend import load_average, one_minute_load
from speculum.engine.decoder import Decoder
from speculum.engine.loading import load_decoder
from speculum.engine.settings import LoadOptions
from speculum.engine.rpc.address import WorkerAddress, parse_worker

CODE_PROMPT = "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."
COPY_PROMPT = ("Rename the variable `total` to `running_sum` in this code and show the full result:\n\n"
               "def mean(values):\n    total = 0\n    count = 0\n    for v in values:\n        total += v\n"
               "        count += 1\n    if count == 0:\n        return 0.0\n    return total / count\n\n"
               "def variance(values):\n    m = mean(values)\n    total = 0\n    for v in values:\n"
               "        total += (v - m) ** 2\n    return total / len(values)\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DelayRelay:
    """127.0.0.1:port -> target, each chunk held ``delay_s`` in each direction (settable live).
    Chunks are timestamped on arrival and sent at arrival + delay, so bandwidth is not limited."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.delay_s = 0.0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for a, b in ((client, upstream), (upstream, client)):
                q: queue.Queue = queue.Queue()
                threading.Thread(target=self._read, args=(a, q), daemon=True).start()
                threading.Thread(target=self._write, args=(b, q), daemon=True).start()

    def _read(self, src: socket.socket, q: queue.Queue) -> None:
        while True:
            try:
                data = src.recv(1 << 20)
            except OSError:
                data = b""
            q.put((time.perf_counter() + self.delay_s, data))
            if not data:
                return

    @staticmethod
    def _write(dst: socket.socket, q: queue.Queue) -> None:
        while True:
            due, data = q.get()
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return


def split_cores() -> tuple[set[int], set[int]]:
    """(this process's cores, the workers'): the cores this process may use, in two halves."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--split-cores needs at least two cores")
    return set(cores[:len(cores) // 2]), set(cores[len(cores) // 2:])


def start_worker(threads: int, secure: bool, data_dir: str,
                 cores: set[int] | None = None) -> tuple[subprocess.Popen, int, str]:
    """A worker on 127.0.0.1, on ``cores`` when given: (process, port, its pairing string or HOST:PORT)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(speculum.__file__).parents[1]), "SPECULUM_DATA_DIR": data_dir}
    mine = os.sched_getaffinity(0) if cores else None
    if cores:  # (a child takes the mask of the thread that starts it; this thread's own is put back below)
        os.sched_setaffinity(0, cores)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "speculum.cli", "rpc-worker", "--port", str(port),
                                 "--threads", str(threads), *([] if secure else ["--insecure"])],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    finally:
        if mine:
            os.sched_setaffinity(0, mine)
    for line in proc.stdout:
        if "--rpc " in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining its log
            return proc, port, line.split("--rpc ")[1].split()[0]
    raise SystemExit(f"worker did not start (exit {proc.wait()})")


def through(relay: DelayRelay, address: str) -> str:
    """The worker's --rpc value with the relay's address in place of its own."""
    worker = parse_worker(address)
    host, port = relay.endpoint.rsplit(":", 1)
    return WorkerAddress(host, int(port), worker.fingerprint, worker.token).text()


def round_trip_us(endpoint: str, n: int) -> float:
    """Median microseconds of one small request and its answer (GET_DEVICE_MEMORY) on one
    connection to ``endpoint``, which speaks llama.cpp's RPC as a worker does: the link's own
    cost per round trip, without a model's compute or other processes' load in it."""
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def ask(cmd: int, body: bytes) -> None:
            s.sendall(bytes([cmd]) + struct.pack("<Q", len(body)) + body)
            size = struct.unpack("<Q", _exactly(s, 8))[0]
            _exactly(s, size)

        ask(14, bytes(24))  # HELLO
        times = []
        for _ in range(n):
            t = time.perf_counter()
            ask(11, struct.pack("<I", 0))  # GET_DEVICE_MEMORY of device 0
            times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def _exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise SystemExit("the worker closed the connection")
        data += chunk
    return data


def _relay_for(address: str) -> str:
    """The local endpoint of Speculum's relay to the worker at ``address`` (paired, when secure)."""
    rpc.check_worker(address)
    return rpc._links[parse_worker(address).name].local_endpoint


def run(decoder: Decoder, user: str, mode: str, tokens: int) -> tuple[float, dict]:
    t = decoder.target
    prompt = t.tokenize(t.apply_chat_template([{"role": "user", "content": user}]))
    last = None
    generation = decoder.generate(prompt, max_tokens=tokens, policy=mode, k=4)
    for cycle in generation:
        last = cycle
    policy = last.policy if last and last.policy else None
    return generation.stats.tokens_per_s, {"plain_tokens_per_s": policy.plain_tokens_per_s or 0,
                                        "verify_cost": policy.verify_cost or {}} if policy else {}


KINDS = ("plain", "draft", "auto", "copy", "lookup")  # runs: mode on CODE_PROMPT, or copy/lookup on COPY_PROMPT


def measure(base: Decoder, tokens: int, kinds: tuple[str, ...]) -> dict:
    """tok/s of each run on one link at the delay set now, with a fresh Decoder and data folder."""
    runs = {"plain": (CODE_PROMPT, "off"), "draft": (CODE_PROMPT, "draft"), "auto": (CODE_PROMPT, "auto"),
            "copy": (COPY_PROMPT, "off"), "lookup": (COPY_PROMPT, "lookup")}
    got: dict = {"policy": {}}
    with tempfile.TemporaryDirectory() as data:
        os.environ["SPECULUM_DATA_DIR"] = data  # no verify-cost curve remembered from another delay
        decoder = Decoder(base.target, base.draft)  # (its sequences empty the models the last run left)
        for kind in kinds:
            got[kind], policy = run(decoder, *runs[kind], tokens)
            if kind == "auto":
                got["policy"] = policy
    return got


def median(runs: list[dict], kinds: tuple[str, ...]) -> dict:
    return {**{kind: statistics.median(r[kind] for r in runs) for kind in kinds}, "policy": runs[-1]["policy"]}


def ratio(a: list[dict], b: list[dict], key: str) -> str:
    """The median of the rounds' a/b ratios, and their range."""
    each = sorted(x[key] / y[key] for x, y in zip(a, b))
    return f"{key} {statistics.median(each):.3f}x ({each[0]:.2f}-{each[-1]:.2f})"


def row(label: str, delay_ms: float, r: dict) -> str:
    def cell(kind: str, base: str) -> str:
        if kind not in r:
            return f"{'-':>13}" if kind != base else f"{'-':>6}"
        return f"{r[kind]:6.2f}" + (f" ({r[kind] / r[base]:4.2f}x)" if kind != base and base in r else "")

    policy = r["policy"]
    est = (f"{policy.get('plain_tokens_per_s', 0):.2f} tok/s, {policy.get('verify_cost', {}).get(5, 0):.2f}"
           if policy else "-")
    return (f"{label:>6} | {delay_ms:>8g} ms | {cell('plain', 'plain')} | {cell('draft', 'plain'):>13} | "
            f"{cell('auto', 'plain'):>13} | {est:>38} | {cell('copy', 'copy'):>11} | {cell('lookup', 'copy'):>13}")


def pool(files: list[str]) -> None:
    """Secure / plain over every round of several runs (their --json), per machine split and delay:
    the median of the rounds' ratios, with a 90% interval for that median (bootstrap, fixed seed)."""
    rng = random.Random(0)
    groups: dict[tuple[str, str], list[float]] = {}
    for name in files:
        run = json.loads(Path(name).read_text())
        split = (f"{'split' if run['split_cores'] else 'shared'} cores, "
                 f"{run['workers']} worker(s) of {run['worker_threads']} thread(s)")
        for delay, links in run["tokens_per_s"].items():
            if not {"secure", "plain"} <= links.keys():
                continue  # (a run without both links has no ratio to give)
            for kind in links["secure"][0]:
                groups.setdefault((f"{run['target']}, {split}, {kind}", delay), []).extend(
                    s[kind] / p[kind] for s, p in zip(links["secure"], links["plain"]))
    for (what, delay), each in groups.items():
        medians = sorted(statistics.median(rng.choices(each, k=len(each))) for _ in range(2000))
        print(f"{what} | {delay:>3} ms | secure / plain {statistics.median(each):.3f} over {len(each)} rounds "
              f"(90% interval {medians[100]:.3f}-{medians[1899]:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--delays", default="0,1,5", help="ms added each way per chunk, comma-separated")
    ap.add_argument("--links", default="secure,plain,direct",
                    help="secure (pairing string, TLS), plain (--insecure, through Speculum's relay), direct "
                         "(--insecure, llama.cpp connected straight to the worker: llama.cpp's own link, the yardstick)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", default=",".join(KINDS), help=f"which runs, of {','.join(KINDS)}")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds per delay, links alternating within each; medians count")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--round-trips", type=int, default=2000, help="small requests timed per link")
    ap.add_argument("--worker-threads", type=int,
                    help="per worker (default 1; with --split-cores, the workers' cores)")
    ap.add_argument("--threads", type=int, help="local threads (the draft's)")
    ap.add_argument("--json", metavar="FILE", help="also write every round's tok/s, per delay and link, here")
    ap.add_argument("--split-cores", action="store_true",
                    help="workers on one half of the cores, this process on the other, as two machines (Linux)")
    ap.add_argument("--pool", nargs="+", metavar="FILE", help="only pool these runs' --json files")
    args = ap.parse_args()
    if args.pool:
        pool(args.pool)
        return
    if not (args.target and args.draft):
        ap.error("--target and --draft are needed for a run")
    if args.split_cores and not hasattr(os, "sched_setaffinity"):
        raise SystemExit("--split-cores needs Linux (os.sched_setaffinity)")
    here, theirs = split_cores() if args.split_cores else (None, None)
    if here:  # before any thread starts here: they all take this one's cores
        os.sched_setaffinity(0, here)
        print(f"cores: this process {sorted(here)}, workers {sorted(theirs)}", flush=True)
    args.worker_threads = args.worker_threads or (len(theirs) if theirs else 1)

    links = [name.strip() for name in args.links.split(",") if name.strip()]
    load_start = one_minute_load(load_average())
    kinds = tuple(k for k in KINDS if k in args.runs.split(","))
    data = tempfile.mkdtemp(prefix="speculum-bench-rpc-")
    workers = {link: [start_worker(args.worker_threads, link == "secure", data, theirs) for _ in range(args.workers)]
               for link in links}
    relays = {link: [DelayRelay(("127.0.0.1", port)) for _, port, _ in workers[link]] for link in links}
    bases: dict[str, Decoder] = {}
    try:
        # The links' own round trip, before any model holds the workers (each serves one client at a time).
        trips = {}
        for link in links:
            _, port, address = workers[link][0]
            trips[link] = round_trip_us(f"127.0.0.1:{port}" if link == "direct" else
                                        _relay_for(address), args.round_trips)
        print("round trip of a small request on loopback, median of "
              f"{args.round_trips}: " + ", ".join(f"{link} {us:.0f} us" for link, us in trips.items()), flush=True)
        for link in links:
            addresses = tuple(through(r, w[2]) for r, w in zip(relays[link], workers[link]))
            if link == "direct":  # ggml to the latency relay itself: no relay of ours, no read timeout
                for address, relay in zip(addresses, relays[link]):
                    rpc.check_worker(address)
                    rpc._links[parse_worker(address).name].local_endpoint = relay.endpoint
            bases[link] = load_decoder(args.target, args.draft, LoadOptions(
                n_ctx=2048, n_threads=args.threads, rpc=addresses))
        first = bases[links[0]]
        print(f"target on {first.target.facts.backend} (per link), draft on {first.draft.facts.backend}; "
              f"{args.tokens} greedy tokens per run, median of {args.repeat}; tok/s (speedup over plain)", flush=True)
        header = (f"{'link':>6} | {'delay each way':>11} | {'plain':>6} | {'draft':>13} | {'auto':>13} | "
                  f"{'auto: plain est., verify(5)/verify(1)':>38} | {'copy: plain':>11} | {'lookup':>13}")
        rows, ratios = [], []
        rounds: dict[str, dict[str, list[dict]]] = {}
        for delay_ms in (float(d) for d in args.delays.split(",")):
            for link in links:
                for r in relays[link]:
                    r.delay_s = delay_ms / 1000
            runs: dict[str, list[dict]] = {link: [] for link in links}
            for i in range(args.repeat):
                for link in links[i % len(links):] + links[:i % len(links)]:  # each link leads a round in turn
                    runs[link].append(measure(bases[link], args.tokens, kinds))
            rounds[f"{delay_ms:g}"] = {link: [{k: r[k] for k in kinds} for r in runs[link]] for link in links}
            results = {link: median(runs[link], kinds) for link in links}
            for link in links:
                rows.append(row(link, delay_ms, results[link]))
                print(rows[-1], file=sys.stderr, flush=True)
            for a, b in (("secure", "plain"), ("secure", "direct"), ("plain", "direct")):
                if {a, b} <= set(links):
                    ratios.append(f"{a:>6} / {b:<6} | {delay_ms:>4g} ms | " + " | ".join(
                        ratio(runs[a], runs[b], key) for key in kinds))
        print(header)
        print("-" * len(header))
        print("\n".join(rows))
        if ratios:
            print("\nratios of tok/s between links, per run kind: median of the rounds' ratios (their range)")
            print("\n".join(ratios))
        # The secure link's threads take turns with the workers' compute on a machine's cores:
        # its share of a token depends on what else was running.
        load_end = one_minute_load(load_average())
        print(f"\nload average {load_start} at the start, {load_end} at the end")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "target": args.target, "tokens": args.tokens, "workers": args.workers,
                "worker_threads": args.worker_threads, "split_cores": args.split_cores,
                "load_average": [load_start, load_end], "tokens_per_s": rounds}, indent=1))
    finally:
        for base in bases.values():
            base.target.close()
            base.draft.close()
        for link in links:
            for proc, _, _ in workers[link]:
                proc.terminate()
                proc.wait(10)


if __name__ == "__main__":
    main()
