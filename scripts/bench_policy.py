"""The auto policy's choices, priced on the verify curve: what it is worth with the machine's noise out.

On a shared 2-core machine the same plain run reads anywhere from 24 to 33 tok/s, so one run's
tokens/s cannot tell a policy change's 5% from the machine's. Here each seed starts a fresh
policy (as a new user's) and takes it through the suite's prompts in order, as `speculum bench`
does; each answer's cycles are priced on one verify curve (the median pass time per size over
every pass of the run, `bench.curve_from_passes`), as bench prices its oracle. Reported per
prompt: the priced speedup over plain decoding per seed, their mean and minimum, and the oracle's.

    SPECULUM_MODELS_DIR=~/.cache/speculum-dev/models PYTHONPATH=app python scripts/bench_policy.py
    (add --target T --draft D, --seeds 1,2,3,4, --mode auto|lookup|draft, --prompts a,b, --json)
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
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--mode", default="auto", choices=("auto", "lookup", "draft"))
    parser.add_argument("--prompts", help="names from the default suite, in order (default: all but the sampled)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "app"))
    import numpy as np

    from speculum.bench import curve_from_passes, load_prompts, oracle_speedup, priced_speedup, run_one, timed_pass
    from speculum.engine.loading import load_decoder
    from speculum.engine.settings import LoadOptions
    from speculum.engine.vocabulary import Mode

    from demo_pair import demo_pair

    target, draft = demo_pair(args.target, args.draft, alone=False)
    decoder = load_decoder(target, draft, LoadOptions(n_ctx=4096))
    suite = load_prompts()
    if args.prompts:
        by_name = {p.name: p for p in suite}
        prompts = [by_name[name.strip()] for name in args.prompts.split(",")]
    else:  # a sampled prompt writes a different text each time: its prices compare different outputs
        prompts = [p for p in suite if p.temperature == 0]
    mode = Mode(args.mode)
    seeds = [int(s) for s in args.seeds.split(",")]
    tokenized = {p.name: decoder.target.tokenize(decoder.target.apply_chat_template(p.messages())) for p in prompts}
    list(decoder.generate(tokenized[prompts[0].name], max_tokens=4, policy=Mode.OFF))  # warm-up
    passes: list[tuple[int, float]] = []
    answers: dict[tuple[str, int], tuple[list, list[int]]] = {}
    for seed in seeds:
        decoder.policies.pop(mode, None)
        policy = decoder.policy_for(mode)
        policy.store = None  # fresh, and leaves the user's memory alone
        policy.rng = np.random.default_rng(seed)
        for p in prompts:
            choices: list = []
            stats, output = run_one(decoder, tokenized[p.name], policy, p, p.max_tokens, None, passes, choices)
            answers[p.name, seed] = choices, output
            print(f"seed {seed} {p.name:<22} {stats.tokens_per_s:6.1f} tok/s", file=sys.stderr)
    curve = curve_from_passes(passes)
    if curve is None:
        print("No verify curve: the run timed no single step or only one size.", file=sys.stderr)
        return 1
    report = []
    for p in prompts:
        priced = [priced_speedup(answers[p.name, s][0], curve) or 0.0 for s in seeds]
        oracle = [oracle_speedup(tokenized[p.name], answers[p.name, s][1], curve) or 0.0 for s in seeds]
        report.append({"prompt": p.name, "priced": [round(x, 3) for x in priced],
                       "mean": round(statistics.mean(priced), 3), "min": round(min(priced), 3),
                       "oracle": round(statistics.mean(oracle), 3)})
    if args.json:
        print(json.dumps({"target": Path(target).name, "draft": Path(draft).name, "mode": mode.value,
                          "seeds": seeds, "curve_steps": {n: round(curve(n) / curve(1), 3) for n in (2, 4, 8, 12, 16)},
                          "results": report}, indent=1))
        return 0
    print(f"{Path(target).name} + {Path(draft).name}, {mode.value}, fresh policy per seed {seeds}; "
          f"verify curve in single steps: " + " ".join(f"{n}:{curve(n) / curve(1):.2f}" for n in (2, 4, 8, 12, 16)))
    for r in report:
        print(f"{r['prompt']:<22} priced {' '.join(f'{x:.3f}' for x in r['priced'])}  mean {r['mean']:.3f} "
              f"min {r['min']:.3f}  oracle {r['oracle']:.3f} ({100 * r['mean'] / r['oracle']:.0f}% of it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
