"""Forced draft mode, adaptive, against every fixed draft length, side by side.

The adaptive draft length must find what the best fixed k gives, without being told. For
each prompt (code writing and code editing from the default suite unless told otherwise),
every round runs the adaptive `draft` mode and `draft` with k = 1..K fixed, one after the
other, so all see the same machine load; the policy keeps what it learnt across rounds, as
in the app. Reported: median tokens/s per setting, the best fixed k, and adaptive over it
(median of the per-round ratios).

    SPECULUM_MODELS_DIR=~/.cache/speculum-dev/models PYTHONPATH=app python scripts/bench_draft_k.py
    (add --target T --draft D, --prompts code-writing,code-editing, --max-k 5, --rounds 3, --json)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--prompts", default="code-writing,code-editing")
    parser.add_argument("--max-k", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "app"))
    from speculum.bench import load_prompts, run_one
    from speculum.engine.loading import load_decoder
    from speculum.engine.settings import LoadOptions
    from speculum.engine.vocabulary import Mode

    from demo_pair import demo_pair

    target, draft = demo_pair(args.target, args.draft, alone=False)
    decoder = load_decoder(target, draft, LoadOptions(n_ctx=4096))
    wanted = [name.strip() for name in args.prompts.split(",")]
    prompts = [p for p in load_prompts() if p.name in wanted]
    settings: list[int | None] = [None, *range(1, args.max_k + 1)]  # None: adaptive
    label = lambda k: "adaptive" if k is None else f"k={k}"  # noqa: E731
    tokenized = {p.name: decoder.target.tokenize(decoder.target.apply_chat_template(p.messages())) for p in prompts}
    list(decoder.generate(tokenized[prompts[0].name], max_tokens=4, policy=Mode.OFF))  # warm-up
    rates: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for p in prompts:
            for k in settings:
                stats, _ = run_one(decoder, tokenized[p.name], Mode.DRAFT, p, p.max_tokens, k)
                rates.setdefault((p.name, label(k)), []).append(stats.tokens_per_s)
                print(f"[{r + 1}/{args.rounds}] {p.name:<14} {label(k):<9} {stats.tokens_per_s:6.2f} tok/s "
                      f"({100 * stats.acceptance_rate:.0f}% accepted, {stats.tokens_per_pass:.2f} per pass)",
                      file=sys.stderr)
    report = []
    for p in prompts:
        medians = {label(k): statistics.median(rates[p.name, label(k)]) for k in settings}
        best = max((label(k) for k in settings if k is not None), key=medians.get)
        ratios = [a / b for a, b in zip(rates[p.name, "adaptive"], rates[p.name, best])]
        report.append({"prompt": p.name, "tokens_per_s": {s: round(v, 2) for s, v in medians.items()},
                       "best_fixed": best, "adaptive_vs_best": round(statistics.median(ratios), 3),
                       "per_round": [round(x, 3) for x in ratios]})
    if args.json:
        print(json.dumps({"target": Path(target).name, "draft": Path(draft).name, "rounds": args.rounds,
                          "results": report}, indent=1))
        return 0
    print(f"{Path(target).name} + {Path(draft).name}, median of {args.rounds} rounds, tok/s")
    for r in report:
        row = "  ".join(f"{s} {v:.2f}" for s, v in r["tokens_per_s"].items())
        print(f"{r['prompt']:<14} {row}  | best fixed {r['best_fixed']}, adaptive / best "
              f"{r['adaptive_vs_best']:.3f} {r['per_round']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
