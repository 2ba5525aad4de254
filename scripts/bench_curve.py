#!/usr/bin/env python3
"""The verify curve with one of llama.cpp's CPU settings on and off, side by side.

A verification pass of n tokens costs some number of single decoding steps; that curve
caps what any drafter can gain (a copy of n - 1 accepted tokens gives n tokens for the
price of the pass). Two settings change it (engine/llama/cpu_settings.py): ggml's tiled K-quant
matmul (``--setting tiled``, from 8 tokens on; it also speeds up prompt chunks) and flash
attention (``--setting attention``; its CPU kernel walks the cache once per row of a small
batch, so it matters more the more is cached: ``--context``); ``--setting prompt-tiled`` times
the tiled matmul in prompt chunks only (Speculum's build) against none. Each setting runs in a
process of its own (ggml reads the tiled one once), alternated round by round so machine
noise hits both alike. Also times a 128-token prompt chunk.

    python scripts/bench_curve.py --target MODEL.gguf [--setting tiled|prompt-tiled|attention]
        [--context 300] [--rounds 3] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from speculum.engine.llama.cpu_settings import PROMPT_CHUNK_ROWS, TILED_MATMUL, TILED_MIN_ROWS

SIZES = (1, 2, 3, 4, 6, 7, 8, 10, 12, 16)
CHUNK = 128


def measure(target: str, threads: int | None, repeat: int, cached: int, flash_attn: bool | None) -> dict:
    from speculum.engine.llama.native import default_threads
    from speculum.engine.llama.tuning import time_passes

    return time_passes(target, threads or default_threads(), sizes=(*SIZES, CHUNK), cached=cached, repeat=repeat,
                       flash_attn=flash_attn, one_row=(CHUNK,))  # a prompt chunk asks for one row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--rounds", type=int, default=3, help="processes per setting, alternated")
    ap.add_argument("--repeat", type=int, default=5, help="passes of each size per process (median)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--setting", choices=("tiled", "prompt-tiled", "attention"), default="tiled",
                    help="the tiled matmul (GGML_CPU_TILED_MM), the tiled matmul in prompt chunks only "
                         "(and GGML_CPU_TILED_MM_MIN_ROWS) against none, or flash attention")
    ap.add_argument("--context", type=int, default=300, help="tokens cached before each pass")
    ap.add_argument("--child", choices=("0", "1"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        # the tiled matmul from the environment, as the engine sets it; flash attention per context
        flash_attn = args.child == "1" if args.setting == "attention" else None
        print(json.dumps(measure(args.target, args.threads, args.repeat, args.context, flash_attn)))
        return

    runs: dict[str, list[dict]] = {"1": [], "0": []}
    label = {"1": f"{args.setting} on", "0": f"{args.setting} off"}
    for r in range(args.rounds):
        for setting in ("1", "0"):
            env = None
            if args.setting != "attention":
                env = {k: v for k, v in os.environ.items() if k != TILED_MIN_ROWS}
                env[TILED_MATMUL] = setting
                if args.setting == "prompt-tiled" and setting == "1":
                    env[TILED_MIN_ROWS] = str(PROMPT_CHUNK_ROWS)
            cmd = [sys.executable, __file__, "--target", args.target, "--repeat", str(args.repeat),
                   "--setting", args.setting, "--context", str(args.context), "--child", setting]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            runs[setting].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {r + 1}, {label[setting]}: single step {runs[setting][-1]['1'] * 1000:.1f} ms", file=sys.stderr)

    def steps(setting: str, n: int) -> float:  # median over rounds of (pass time / single step)
        return statistics.median(run[str(n)] / run["1"] for run in runs[setting])

    def ms(setting: str, n: int) -> float:
        return statistics.median(run[str(n)] for run in runs[setting]) * 1000

    print(f"{args.context} tokens cached; cost in single steps (and ms), median of {args.rounds} processes")
    print(f"{'tokens in pass':>14} {label['1']:>18} {label['0']:>18}")
    for n in SIZES:
        print(f"{n:>14} {steps('1', n):>8.2f} ({ms('1', n):>6.1f}) {steps('0', n):>8.2f} ({ms('0', n):>6.1f})")
    for setting in ("1", "0"):
        best = max(SIZES, key=lambda n: n / steps(setting, n))
        print(f"copy ceiling, {label[setting]:<14}: {best / steps(setting, best):.2f}x plain decoding "
              f"(passes of {best}, every draft accepted)")
    on_chunk, off_chunk = ms("1", CHUNK), ms("0", CHUNK)
    print(f"{CHUNK}-token prompt chunk: {label['1']} {on_chunk:.0f} ms, {label['0']} {off_chunk:.0f} ms "
          f"(off / on {off_chunk / on_chunk:.2f})")


if __name__ == "__main__":
    main()
