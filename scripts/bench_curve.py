#!/usr/bin/env python3
"""The verify curve with ggml's tiled matmul on and off, side by side.

A verification pass of n tokens costs some number of single decoding steps; that curve
caps what any drafter can gain (a copy of n - 1 accepted tokens gives n tokens for the
price of the pass). ggml's tiled K-quant matmul changes the curve from 8 tokens on, so
each setting runs in a process of its own (ggml reads it once), alternated round by
round so machine noise hits both alike. Also times a 128-token prompt chunk, which the
tiled path speeds up. See engine/cpu_settings.py.

    python scripts/bench_curve.py --target MODEL.gguf [--rounds 3] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = (1, 2, 3, 4, 6, 7, 8, 10, 12, 16)
CHUNK = 128
TEXT = "def scale(values, factor):\n    return [v * factor for v in values]\n\n"


def measure(target: str, threads: int | None, repeat: int) -> dict:
    from speculum.engine.llama import LlamaModel, default_threads

    model = LlamaModel(target, n_ctx=2048, n_threads=threads or default_threads())
    tokens = model.tokenize(TEXT * 60)
    context, extra = tokens[:300], tokens[300:300 + CHUNK]
    model.prefill(context)
    times: dict[int, list[float]] = {n: [] for n in (*SIZES, CHUNK)}
    for _ in range(repeat):
        for n in times:
            rows = [n - 1] if n == CHUNK else list(range(n))  # a prompt chunk asks for one row
            start = time.perf_counter()
            model.decode(extra[:n], rows=rows)
            times[n].append(time.perf_counter() - start)
            model.trim(len(context))
    return {str(n): statistics.median(t) for n, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--rounds", type=int, default=3, help="processes per setting, alternated")
    ap.add_argument("--repeat", type=int, default=5, help="passes of each size per process (median)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--child", choices=("0", "1"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.target, args.threads, args.repeat)))
        return

    runs: dict[str, list[dict]] = {"1": [], "0": []}
    for r in range(args.rounds):
        for setting in ("1", "0"):
            env = {**os.environ, "GGML_CPU_TILED_MM": setting}
            cmd = [sys.executable, __file__, "--target", args.target, "--repeat", str(args.repeat), "--child", setting]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            runs[setting].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {r + 1}, tiled {'on' if setting == '1' else 'off'}: "
                  f"single step {runs[setting][-1]['1'] * 1000:.1f} ms", file=sys.stderr)

    def steps(setting: str, n: int) -> float:  # median over rounds of (pass time / single step)
        return statistics.median(run[str(n)] / run["1"] for run in runs[setting])

    print(f"{'tokens in pass':>14} {'tiled on':>9} {'tiled off':>9}   (cost in single steps; median of {args.rounds})")
    for n in SIZES:
        print(f"{n:>14} {steps('1', n):>9.2f} {steps('0', n):>9.2f}")
    for label, setting in (("tiled on", "1"), ("tiled off", "0")):
        best = max(SIZES, key=lambda n: n / steps(setting, n))
        print(f"copy ceiling, {label:<9}: {best / steps(setting, best):.2f}x plain decoding "
              f"(passes of {best}, every draft accepted)")
    on_chunk = statistics.median(run[str(CHUNK)] for run in runs["1"])
    off_chunk = statistics.median(run[str(CHUNK)] for run in runs["0"])
    print(f"{CHUNK}-token prompt chunk: tiled on {on_chunk * 1000:.0f} ms, off {off_chunk * 1000:.0f} ms "
          f"(off / on {off_chunk / on_chunk:.2f})")


if __name__ == "__main__":
    main()
