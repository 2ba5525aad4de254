"""JSON-schema extraction under a grammar: speculative against plain constrained decoding.

Each round runs every mode on every workload, one after the other, so all see the same
machine load: plain constrained decoding (`off`), then the draft model, prompt lookup and
auto, all under the same grammar. Reported per workload and mode: median tokens/s, the
ratio to plain constrained decoding (median of per-round ratios), draft acceptance, whether
the answer equals plain's, and the grammar's own cost: milliseconds per generated token
spent in llama.cpp's grammar sampler (masks, clones, accepts), and the cost of one
whole-vocabulary mask (what every row costs when sampling at T > 0 or asking logprobs).

    PYTHONPATH=app ~/.cache/speculum-dev/venv/bin/python scripts/bench_grammar.py
    (add --target T --draft D, --rounds 3, --modes off,draft,lookup,auto, --temperature 0.7, --json;
     a mode written MODE:free, as draft:free, runs without the grammar, for comparison)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"},
                                           "hobbies": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "city", "hobbies"], "additionalProperties": False}
INVOICE = {"type": "object", "properties": {
    "customer": {"type": "string"},
    "lines": {"type": "array", "items": {
        "type": "object", "properties": {"product": {"type": "string"}, "quantity": {"type": "integer"},
                                         "unit_price": {"type": "number"}},
        "required": ["product", "quantity", "unit_price"], "additionalProperties": False}}},
    "required": ["customer", "lines"], "additionalProperties": False}
INVOICE_TEXT = """Invoice 2291 for Northwind Traders
- 12 x Blue ceramic mug @ 4.50
- 3 x Walnut cutting board @ 22.00
- 40 x Beeswax candle @ 1.25
- 5 x Linen tea towel @ 6.80
- 2 x Cast iron skillet @ 38.90
- 10 x Glass storage jar @ 3.15"""

WORKLOADS = {
    "person": (PERSON, "Extract the person in this text as JSON with keys name, age, city and hobbies.\n\n"
                       "Alice Smith is 34 years old and lives in Paris. She likes chess, tennis and baking.", 96),
    "invoice": (INVOICE, "Extract this invoice as JSON: the customer, and one line per item with product, "
                         f"quantity and unit_price.\n\n{INVOICE_TEXT}", 320),
}


class GrammarClock:
    """Seconds spent in GrammarState's public calls (outermost calls only: no double count)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._depth = 0

    def install(self, cls) -> None:
        for name in ("accept", "allows", "allowed", "best", "clone", "allowed_prefix", "mask"):
            setattr(cls, name, self._timed(getattr(cls, name)))

    def _timed(self, fn):
        def timed(*args, **kw):
            if self._depth:
                return fn(*args, **kw)
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
                self._depth -= 1
        return timed


def run(decoder, prompt, mode, grammar, max_tokens, sampling, clock):
    """One answer; a mode written ``MODE:free`` runs without the grammar (for comparison)."""
    policy, _, free = mode.partition(":")
    before = clock.seconds
    start = time.perf_counter()
    cycles = list(decoder.generate(prompt, max_tokens=max_tokens, policy=policy, grammar=None if free else grammar,
                                   sampling=sampling))
    seconds = time.perf_counter() - start
    tokens = [t for c in cycles for t in c.emitted]
    return {"tokens": tokens, "seconds": seconds, "grammar_s": clock.seconds - before,
            "drafted": sum(len(c.drafted) for c in cycles), "accepted": sum(c.n_accepted for c in cycles),
            "passes": sum(1 for c in cycles if c.emitted), "finish": str(cycles[-1].finish)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="off,draft,lookup,auto")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "app"))
    sys.path.insert(0, str(REPO / "scripts"))
    from speculum.engine.grammar.schema import grammar_for_response_format
    from speculum.engine.grammar.state import GrammarState
    from speculum.engine.loading import load_decoder
    from speculum.engine.settings import LoadOptions
    from speculum.engine.sampling import SamplingParams

    from demo_pair import demo_pair

    clock = GrammarClock()
    clock.install(GrammarState)
    target, draft = demo_pair(args.target, args.draft, alone=False)
    decoder = load_decoder(target, draft, LoadOptions(n_ctx=4096))
    model = decoder.target
    modes = [m.strip() for m in args.modes.split(",")]
    names = [w.strip() for w in args.workloads.split(",")]
    jobs = {}
    for name in names:
        schema, ask, max_tokens = WORKLOADS[name]
        grammar = grammar_for_response_format({"type": "json_schema", "json_schema": {"name": name, "schema": schema}})
        prompt = model.tokenize(model.apply_chat_template([{"role": "user", "content": ask}]))
        jobs[name] = (grammar, prompt, max_tokens)
    list(decoder.generate(jobs[names[0]][1], max_tokens=4, policy="off"))  # warm-up
    results: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for name in names:
            grammar, prompt, max_tokens = jobs[name]
            for mode in modes:
                sampling = SamplingParams(temperature=args.temperature, seed=r)
                out = run(decoder, prompt, mode, grammar, max_tokens, sampling, clock)
                results.setdefault((name, mode), []).append(out)
                n = len(out["tokens"])
                print(f"[{r + 1}/{args.rounds}] {name:<8} {mode:<7} {n / out['seconds']:6.2f} tok/s  {n} tokens  "
                      f"{out['accepted']}/{out['drafted']} accepted  grammar {1e3 * out['grammar_s'] / max(n, 1):.2f} "
                      f"ms/token  ({out['finish']})", file=sys.stderr)
    mask_ms = _whole_mask_ms(jobs[names[0]][0], model)
    report = _report(results, names, modes, mask_ms, model.n_vocab, args)
    print(json.dumps(report, indent=2) if args.json else _table(report))
    return 0


def _whole_mask_ms(grammar, model, n: int = 20) -> float:
    state = grammar.start(model)
    start = time.perf_counter()
    for _ in range(n):
        state.allowed()
    return 1e3 * (time.perf_counter() - start) / n


def _report(results, names, modes, mask_ms, n_vocab, args) -> dict:
    rows = []
    for name in names:
        plain = results.get((name, "off"))
        for mode in modes:
            runs = results[(name, mode)]
            rates = [len(o["tokens"]) / o["seconds"] for o in runs]
            ratios = ([len(o["tokens"]) / o["seconds"] / (len(p["tokens"]) / p["seconds"]) for o, p in zip(runs, plain)]
                      if plain else [])
            drafted = sum(o["drafted"] for o in runs)
            tokens = sum(len(o["tokens"]) for o in runs)
            rows.append({
                "workload": name, "mode": mode, "tokens_per_s": round(statistics.median(rates), 2),
                "ratio_to_plain": round(statistics.median(ratios), 2) if ratios else None,
                "acceptance": round(sum(o["accepted"] for o in runs) / drafted, 3) if drafted else None,
                "tokens_per_pass": round(tokens / max(1, sum(o["passes"] for o in runs)), 2),
                "grammar_ms_per_token": round(1e3 * sum(o["grammar_s"] for o in runs) / max(1, tokens), 3),
                "grammar_share": round(sum(o["grammar_s"] for o in runs) / sum(o["seconds"] for o in runs), 4),
                "same_as_plain": (all(o["tokens"] == p["tokens"] for o, p in zip(runs, plain))
                                  if plain and not args.temperature and ":" not in mode else None),
                "tokens": len(runs[-1]["tokens"]), "finish": runs[-1]["finish"],
            })
    return {"rounds": args.rounds, "temperature": args.temperature, "n_vocab": n_vocab,
            "whole_vocabulary_mask_ms": round(mask_ms, 2), "rows": rows}


def _table(report: dict) -> str:
    lines = [f"{'workload':<9}{'mode':<8}{'tok/s':>7}{'x plain':>9}{'accepted':>10}{'tok/pass':>10}"
             f"{'grammar ms/tok':>16}{'share':>7}  same"]
    for row in report["rows"]:
        ratio = "" if row["ratio_to_plain"] is None else f"{row['ratio_to_plain']:.2f}"
        acc = "" if row["acceptance"] is None else f"{100 * row['acceptance']:.0f}%"
        lines.append(f"{row['workload']:<9}{row['mode']:<8}{row['tokens_per_s']:>7.2f}{ratio:>9}{acc:>10}"
                     f"{row['tokens_per_pass']:>10.2f}{row['grammar_ms_per_token']:>16.3f}"
                     f"{100 * row['grammar_share']:>6.1f}%  {row['same_as_plain']}")
    lines.append(f"one whole-vocabulary mask ({report['n_vocab']:,} tokens): {report['whole_vocabulary_mask_ms']} ms "
                 f"(per row at T > 0 or with logprobs); T = {report['temperature']}, {report['rounds']} rounds")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
