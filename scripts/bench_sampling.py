"""Acceptance at T > 0: rejection sampling against drafter-invariant (Gumbel-max) sampling.

Both verify the same drafter on the same prompts, seeds and temperature (bench suite prompts,
their temperature replaced); drafted tokens are counted as each coupling keeps them. Reported
per prompt and overall: accepted / drafted for each, Gumbel over rejection, and tokens per
target pass; with --check-off, whether each Gumbel answer equals Off's for its seed. Ratios
from one run, no speeds: the machine may be busy.

Answers that part early differ in what there is to draft, so a few runs' counts are noisy. The
paired figures take that out (draft mode): along each Gumbel answer, the target's and the draft
model's rows at every position give each coupling's chance of keeping a drafted token there:
rejection sampling's sum of min(p, q), and the Gumbel coupling's share of --noise-draws noise
draws (other seeds) under which the two rows' Gumbel-max tokens agree.

    SPECULUM_MODELS_DIR=~/.cache/speculum-dev/models PYTHONPATH=app python scripts/bench_sampling.py
    (add --target T --draft D, --prompts code-writing,open-chat, --seeds 1,2, --tokens 64,
     --temperature 0.8, --mode draft, --k 4 (0: adaptive), --check-off, --exact, --json)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--prompts", default="code-writing,open-chat,code-explanation")
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--mode", default="draft")
    parser.add_argument("--k", type=int, default=4, help="fixed draft length (0: the mode's own, adapted)")
    parser.add_argument("--check-off", action="store_true", help="also decode plainly: is Gumbel's answer Off's?")
    parser.add_argument("--exact", action=argparse.BooleanOptionalAction, default=None,
                        help="llama.cpp's row-invariance switch (as speculum's --exact)")
    parser.add_argument("--noise-draws", type=int, default=200, help="per position, for the paired figures (0: none)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "app"))
    from speculum.engine.llama import cpu_settings

    if args.exact is not None:  # before llama.cpp loads: ggml reads it once
        cpu_settings.choose_exact(args.exact)
    from speculum.bench import load_prompts
    from speculum.engine.loading import load_decoder
    from speculum.engine.sampling import Coupling, SamplingParams
    from speculum.engine.settings import LoadOptions
    from speculum.engine.vocabulary import Mode

    from demo_pair import demo_pair

    target, draft = demo_pair(args.target, args.draft, alone=args.mode != Mode.DRAFT)
    decoder = load_decoder(target, draft, LoadOptions(n_ctx=4096))
    wanted = [name.strip() for name in args.prompts.split(",")]
    prompts = [p for p in load_prompts() if p.name in wanted]
    seeds = [int(s) for s in args.seeds.split(",")]
    k = args.k or None
    tokenized = {p.name: decoder.target.tokenize(decoder.target.apply_chat_template(p.messages())) for p in prompts}
    rows = []
    for p in prompts:
        grammar = p.grammar()
        for seed in seeds:
            row = {"prompt": p.name, "seed": seed}
            for coupling in Coupling:
                sampling = SamplingParams(temperature=args.temperature, seed=seed, coupling=coupling)
                cycles = list(decoder.generate(tokenized[p.name], max_tokens=args.tokens, sampling=sampling,
                                               policy=args.mode, k=k, grammar=grammar))
                passes = sum(1 for c in cycles if c.emitted)
                row[coupling.value] = {"drafted": sum(len(c.drafted) for c in cycles),
                                       "accepted": sum(c.n_accepted for c in cycles),
                                       "tokens": sum(len(c.emitted) for c in cycles), "passes": passes,
                                       "output": [t for c in cycles for t in c.emitted]}
            if args.check_off:
                plain = [t for c in decoder.generate(tokenized[p.name], max_tokens=args.tokens, grammar=grammar,
                                                     sampling=SamplingParams(temperature=args.temperature, seed=seed))
                         for t in c.emitted]
                row["gumbel_same_as_off"] = plain == row[Coupling.GUMBEL.value]["output"]
            rows.append(row)
            print(_line(row), file=sys.stderr)
    report = _report(rows, args)
    if args.mode == Mode.DRAFT and args.noise_draws:  # last: it leaves both models' caches elsewhere
        report["paired"] = _paired(decoder, tokenized, rows, args)
    if args.json:
        print(json.dumps(report))
    else:
        _print_table(report)
    return 0


def _paired(decoder, tokenized: dict, rows: list[dict], args) -> list[dict]:
    """Each coupling's chance of keeping a drafted token, position by position along the runs'
    Gumbel answers, on the same rows for both (the docstring's paired figures)."""
    import numpy as np

    from speculum.engine.sampling import SamplingParams, distribution, gumbel_max

    params = SamplingParams(temperature=args.temperature)
    seeds = [SamplingParams(temperature=args.temperature, seed=s) for s in range(10_000, 10_000 + args.noise_draws)]
    table = {}
    for row in rows:
        prompt, answer = tokenized[row["prompt"]], row["gumbel"]["output"]
        target_rows, draft_rows = (_rows_along(model, prompt, answer) for model in (decoder.target, decoder.draft))
        for i, (p_row, q_row) in enumerate(zip(target_rows, draft_rows)):
            position = len(prompt) + i
            p, q = distribution(p_row, params), distribution(q_row, params)
            agree = np.mean([gumbel_max(p_row, s, position) == gumbel_max(q_row, s, position) for s in seeds])
            for name in (row["prompt"], "all"):
                entry = table.setdefault(name, {"prompt": name, "positions": 0, "rejection": 0.0, "gumbel": 0.0})
                entry["positions"] += 1
                entry["rejection"] += float(np.minimum(p, q).sum(dtype=np.float64))
                entry["gumbel"] += float(agree)
    for entry in table.values():
        entry["rejection"] /= entry["positions"]
        entry["gumbel"] /= entry["positions"]
        entry["gumbel_over_rejection"] = entry["gumbel"] / entry["rejection"] if entry["rejection"] else None
    return list(table.values())


def _rows_along(model, prompt: list[int], answer: list[int]):
    """The model's rows predicting each token of ``answer`` after ``prompt`` (read afresh)."""
    import numpy as np

    model.reset()
    model.prefill(prompt[:-1])
    return np.array(model.decode(prompt[-1:] + answer[:-1], rows=range(len(answer))))  # (a view until the next decode)


def _rate(counts: list[dict]) -> float:
    drafted = sum(c["drafted"] for c in counts)
    return sum(c["accepted"] for c in counts) / drafted if drafted else 0.0


def _per_pass(counts: list[dict]) -> float:
    passes = sum(c["passes"] for c in counts)
    return sum(c["tokens"] for c in counts) / passes if passes else 0.0


def _line(row: dict) -> str:
    r, g = row["rejection"], row["gumbel"]
    same = f"  same as off: {row['gumbel_same_as_off']}" if "gumbel_same_as_off" in row else ""
    return (f"{row['prompt']:<22} seed {row['seed']:<3} rejection {r['accepted']}/{r['drafted']}  "
            f"gumbel {g['accepted']}/{g['drafted']}{same}")


def _report(rows: list[dict], args) -> dict:
    groups = {}
    for row in rows:
        groups.setdefault(row["prompt"], []).append(row)
    groups["all"] = rows
    table = []
    for name, group in groups.items():
        rej, gum = [r["rejection"] for r in group], [r["gumbel"] for r in group]
        entry = {"prompt": name, "runs": len(group), "rejection": _rate(rej), "gumbel": _rate(gum),
                 "gumbel_over_rejection": _rate(gum) / _rate(rej) if _rate(rej) else None,
                 "tokens_per_pass_rejection": _per_pass(rej), "tokens_per_pass_gumbel": _per_pass(gum)}
        if "gumbel_same_as_off" in group[0]:
            entry["gumbel_same_as_off"] = sum(r["gumbel_same_as_off"] for r in group)
        table.append(entry)
    return {"mode": args.mode, "k": args.k or "adaptive", "temperature": args.temperature, "tokens": args.tokens,
            "seeds": args.seeds, "table": table}


def _print_table(report: dict) -> None:
    print(f"mode {report['mode']}, k {report['k']}, T {report['temperature']}, {report['tokens']} tokens, "
          f"seeds {report['seeds']}")
    print(f"{'prompt':<22} {'runs':>4} {'rejection':>9} {'gumbel':>7} {'ratio':>6} {'tok/pass rej':>12} "
          f"{'tok/pass gum':>12}")
    for e in report["table"]:
        ratio = f"{e['gumbel_over_rejection']:.3f}" if e["gumbel_over_rejection"] is not None else "-"
        print(f"{e['prompt']:<22} {e['runs']:>4} {e['rejection']:>9.3f} {e['gumbel']:>7.3f} {ratio:>6} "
              f"{e['tokens_per_pass_rejection']:>12.2f} {e['tokens_per_pass_gumbel']:>12.2f}")
    if report.get("paired"):
        print("paired, per position along the answers: chance a drafted token is kept")
        print(f"{'prompt':<22} {'positions':>9} {'rejection':>9} {'gumbel':>7} {'ratio':>6}")
        for e in report["paired"]:
            ratio = f"{e['gumbel_over_rejection']:.3f}" if e["gumbel_over_rejection"] is not None else "-"
            print(f"{e['prompt']:<22} {e['positions']:>9} {e['rejection']:>9.3f} {e['gumbel']:>7.3f} {ratio:>6}")


if __name__ == "__main__":
    sys.exit(main())
