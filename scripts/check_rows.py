"""Whether a row's logits depend on the pass it is decoded in, on this build and machine, and
what the row-invariance switch costs.

    python scripts/check_rows.py MODEL.gguf [--exact|--no-exact] [--prompt-len 24] [--sizes 1,2,4,8] [--threads N]
                                 [--chunks one,7] [--time] [--json]

Each of --gen tokens (greedy continuations) is decoded alone after the prompt, then in passes of
each size after the prompt read whole or in pieces of each chunk size; rows are compared bit for
bit. --time adds the costs: one plain step, passes of 2-16 rows in single steps, prompt reading.
Exit 1 when a row differs. docs/notes/issue46-exact.md has the results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "app"))

TEXT = ('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n'
        '    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n')


def _timings(model, prompt: list[int], follow: list[int]) -> dict:
    def seconds(tokens: list[int], repeats: int) -> float:
        times = []
        for _ in range(repeats):
            model.trim(len(prompt))
            start = time.perf_counter()
            model.decode(tokens, rows=range(len(tokens)))
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    model.trim(0)
    model.prefill(prompt)
    one = seconds(follow[:1], 30)
    curve = {k: round(seconds(follow[:k], 10) / one, 3) for k in (2, 4, 8, 16)}
    reads = []
    for _ in range(3):
        model.trim(0)
        start = time.perf_counter()
        model.prefill(prompt)
        reads.append(time.perf_counter() - start)
    model.trim(0)
    return {"single_step_ms": round(one * 1000, 3), "plain_tok_s": round(1 / one, 2), "verify_curve": curve,
            "prompt_tok_s": round(len(prompt) / statistics.median(reads), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--exact", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--sizes", default="1,2,3,4,5,8,16,64")
    ap.add_argument("--chunks", default="one", help="comma list: 'one' (the prompt read whole) or a chunk size")
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp's threads (default: Speculum's choice)")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from speculum.engine.llama import cpu_settings

    if args.exact is not None:
        cpu_settings.choose_exact(args.exact)
    from speculum.engine.exactness import check_passes
    from speculum.engine.llama.model import LlamaModel
    from speculum.engine.settings import LoadOptions

    flash = {"on": True, "off": False}.get(args.flash_attn)
    model = LlamaModel(args.model, LoadOptions(n_ctx=max(2048, args.prompt_len + args.gen + 64), flash_attn=flash,
                                                  n_threads=args.threads),
                       verifies=True)
    try:
        tokens = model.tokenize(TEXT * (1 + args.prompt_len // 20), add_special=True)
        if len(tokens) < args.prompt_len:
            raise SystemExit(f"the text makes only {len(tokens)} tokens")
        prompt = tokens[:args.prompt_len - 1]
        follow = [tokens[args.prompt_len - 1]]  # then the model's own greedy continuation
        model.prefill(prompt)
        for _ in range(args.gen - 1):
            follow.append(int(model.decode(follow[-1:])[0].argmax()))
        sizes = [int(s) for s in args.sizes.split(",")]
        chunks = [None if c == "one" else int(c) for c in args.chunks.split(",")]
        checks = check_passes(model, prompt, follow, sizes, chunks)
        report = {"model": Path(args.model).name, "exact": cpu_settings.in_effect().get(cpu_settings.ROW_INVARIANT),
                  "switch_built": cpu_settings.build_has_row_switch(), "flash_attn": model.flash_attn,
                  "prompt_tokens": len(prompt), "checks": {k: {"identical": c.identical, "rows": c.pass_size,
                                                               "max_difference": c.max_difference}
                                                           for k, c in checks.items()}}
        if args.time:
            report["costs"] = _timings(model, prompt + follow[:1], follow[1:17])
    finally:
        model.close()
    if args.json:
        print(json.dumps(report))
    else:
        for name, c in report["checks"].items():
            print(f"{name:>28}: {c['identical']:3d}/{c['rows']} rows identical (max difference {c['max_difference']:.4g})")
        if "costs" in report:
            print(json.dumps(report["costs"]))
    return 0 if all(c["identical"] == c["rows"] for c in report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
