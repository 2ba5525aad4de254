#!/usr/bin/env python3
"""Plain vs speculative decoding with the target on RPC workers, as network latency grows.

Starts ``--workers`` `speculum rpc-worker` processes on 127.0.0.1, puts a TCP relay in front
of each that holds every chunk ``delay`` ms in each direction (latency, not bandwidth), and
loads the target across the relays with the draft local. For each delay it runs, on the
same loaded models: plain, draft model (k adapted), auto, and on a copy-heavy prompt plain
vs prompt lookup. Each delay gets a fresh Decoder and a fresh data folder, so the auto
policy measures its verify-cost curve over that delay's network.

    python scripts/bench_rpc.py --target T.gguf --draft D.gguf [--delays 0,2,10] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import speculum
from speculum.engine.decoder import Decoder
from speculum.engine.loading import LoadOptions, load_decoder

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


def start_worker(threads: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(speculum.__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "speculum.cli", "rpc-worker", "--port", str(port),
                             "--threads", str(threads)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    for line in proc.stdout:
        if "listening on" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining its log
            return proc, port
    raise SystemExit(f"worker did not start (exit {proc.wait()})")


def run(decoder: Decoder, user: str, mode: str, tokens: int) -> tuple[float, dict]:
    t = decoder.target
    prompt = t.tokenize(t.apply_chat_template([{"role": "user", "content": user}]))
    last = None
    generation = decoder.generate(prompt, max_tokens=tokens, policy=mode, k=4)
    for cycle in generation:
        last = cycle
    return generation.stats.tokens_per_s, (last.policy if last else {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--delays", default="0,2,10", help="ms added each way per chunk, comma-separated")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--worker-threads", type=int, default=1)
    ap.add_argument("--threads", type=int, help="local threads (the draft's)")
    args = ap.parse_args()

    workers = [start_worker(args.worker_threads) for _ in range(args.workers)]
    relays = [DelayRelay(("127.0.0.1", port)) for _, port in workers]
    try:
        base = load_decoder(args.target, args.draft, LoadOptions(
            n_ctx=2048, n_threads=args.threads, rpc=tuple(r.endpoint for r in relays)))
        print(f"target on {base.target.facts.backend}, draft on {base.draft.facts.backend}; "
              f"{args.tokens} greedy tokens per run; tok/s (speedup over plain)", flush=True)
        header = (f"{'delay each way':>14} | {'plain':>6} | {'draft':>13} | {'auto':>13} | "
                  f"{'auto: plain est., verify(5)/verify(1)':>38} | {'copy: plain':>11} | {'lookup':>13}")
        rows = []
        for delay_ms in (float(d) for d in args.delays.split(",")):
            for r in relays:
                r.delay_s = delay_ms / 1000
            with tempfile.TemporaryDirectory() as data:
                os.environ["SPECULUM_DATA_DIR"] = data  # no verify-cost curve remembered from another delay
                decoder = Decoder(base.target, base.draft)
                plain, _ = run(decoder, CODE_PROMPT, "off", args.tokens)
                draft, _ = run(decoder, CODE_PROMPT, "draft", args.tokens)
                auto, policy = run(decoder, CODE_PROMPT, "auto", args.tokens)
                copy_plain, _ = run(decoder, COPY_PROMPT, "off", args.tokens)
                lookup, _ = run(decoder, COPY_PROMPT, "lookup", args.tokens)
            est = f"{policy.get('plain_tokens_per_s', 0):.2f} tok/s, {policy.get('verify_cost', {}).get(5, 0):.2f}"
            rows.append(f"{delay_ms:>11g} ms | {plain:6.2f} | {draft:6.2f} ({draft / plain:4.2f}x) | "
                        f"{auto:6.2f} ({auto / plain:4.2f}x) | {est:>38} | {copy_plain:11.2f} | "
                        f"{lookup:6.2f} ({lookup / copy_plain:4.2f}x)")
            print(rows[-1], file=sys.stderr, flush=True)
        print(header)
        print("-" * len(header))
        print("\n".join(rows))
        base.target.close()
        base.draft.close()
    finally:
        for proc, _ in workers:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
