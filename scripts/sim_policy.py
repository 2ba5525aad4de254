"""The auto policy's copy choices replayed on recorded answers: no machine noise, one second a run.

Lookup's proposals and the target's greedy answer are fixed by the prompt, so a policy's copy
choices can be replayed without the model: each cycle the policy chooses, lookup proposes, the
recorded answer says how much was right, and the pass is priced (and reported to the policy) on a
fixed verify curve. A policy change is compared over many seeds, on curves of more than one shape,
in seconds, and the same seed makes the same choices every time. The draft model is left out: on
a CPU auto mode almost never chooses it, and its proposals cannot be replayed. Where a prompt has
a grammar (the JSON schema), the grammar's forced text is drafted too (``--no-grammar``: not).

Also reported, per prompt: the oracle's speedup (``bench.oracle_speedup``) and a ceiling, the
speedup of a causal policy told this answer's own acceptance per match-length bucket and draft
position (what the policy's tables could learn at best), choosing k by expected tokens per step.

    SPECULUM_MODELS_DIR=~/.cache/speculum-dev/models PYTHONPATH=app python scripts/sim_policy.py
    (add --seeds 1-16, --mode auto|lookup, --curve "2:1.5,4:2.4,8:3.9,16:4.8", --target T)

The answers are recorded once per target (a minute on a 2-core CPU) into --answers.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Pass cost in single steps by tokens in it, as measured on a 2-core Zen 5 CPU: FLAT by
# scripts/bench_curve.py (short context), STEEP as bench runs' passes read at long contexts
# while the target had flash attention (its CPU kernel's cost grows with the cache per row).
CURVES = {"flat": {2: 1.51, 3: 2.07, 4: 2.41, 6: 3.47, 8: 3.92, 12: 4.76, 16: 4.84},
          "steep": {2: 1.8, 3: 2.3, 4: 2.9, 6: 3.7, 8: 4.6, 12: 6.2, 16: 7.4}}
STEP_S = 0.035  # a single step's seconds, as the policy is told them


def full_curve(points: dict[int, float]) -> dict[int, float]:
    """Every size 1..16 from some, straight lines between them."""
    known = sorted({1: 1.0, **points}.items())
    out = {}
    for n in range(1, 17):
        lo = max((k, v) for k, v in known if k <= n)
        hi = min(((k, v) for k, v in known if k >= n), default=lo)
        out[n] = lo[1] if hi[0] == lo[0] else lo[1] + (hi[1] - lo[1]) * (n - lo[0]) / (hi[0] - lo[0])
    return out


def record(target: str, path: Path) -> dict[str, tuple[list[int], list[int]]]:
    """The default suite's greedy answers (prompt tokens, answer tokens), recorded once."""
    if path.is_file():
        return {name: (p, o) for name, (p, o) in json.loads(path.read_text()).items()}
    from speculum.bench import load_prompts
    from speculum.engine.loading import load_decoder
    from speculum.engine.settings import LoadOptions
    from speculum.engine.vocabulary import Mode

    decoder = load_decoder(target, None, LoadOptions(n_ctx=4096))
    answers = {}
    for p in load_prompts():
        if p.temperature == 0:  # a sampled answer differs each time: nothing fixed to replay
            prompt = decoder.target.tokenize(decoder.target.apply_chat_template(p.messages()))
            cycles = decoder.generate(prompt, max_tokens=p.max_tokens, policy=Mode.LOOKUP, grammar=p.grammar())
            answers[p.name] = (list(prompt), [t for c in cycles for t in c.emitted])
            print(f"recorded {p.name}", file=sys.stderr)
    path.write_text(json.dumps(answers))
    return answers


def replay(answers, curve: dict[int, float], seed: int, mode, spelling=None, grammars=None) -> dict[str, float]:
    """One fresh policy through the answers in order; each answer's speedup over plain decoding.
    ``grammars``: (the target, {prompt name: its grammar}): those answers' forced text is drafted too."""
    from speculum.engine.policy.auto import AutoPolicy
    from speculum.engine.drafting.draft import Draft
    from speculum.engine.drafting.grammardrafter import GrammarDrafter
    from speculum.engine.drafting.lookup import PromptLookup
    from speculum.engine.vocabulary import Source

    now = [0.0]
    lookup = PromptLookup(spelling=spelling)  # renames in every spelling, as the engine's lookup
    drafters = {Source.LOOKUP: lookup}
    target, grammar_of = grammars or (None, {})
    if target is not None:
        drafters[Source.GRAMMAR] = GrammarDrafter(target)
    policy = AutoPolicy(drafters, mode=mode, store=None, clock=lambda: now[0], seed=seed)
    speedups = {}
    for name, (prompt, answer) in answers.items():
        for drafter in drafters.values():
            drafter.begin(prompt)
        state = grammar_of[name].start(target) if name in grammar_of else None
        context, written, steps = list(prompt), 0, 0.0
        while written < len(answer):
            for drafter in drafters.values():
                drafter.constrain(state)
            choice = policy.choose(context)
            k = min(choice.k, len(answer) - written - 1)  # the decoder stops at the answer's end too
            drafter = drafters.get(choice.source)
            draft = drafter.propose(context, k, choice, None, None) if k > 0 and drafter else Draft()
            if not draft.tokens:
                draft = Draft(source=Source.NONE)
            right = 0
            while right < len(draft.tokens) and draft.tokens[right] == answer[written + right]:
                right += 1
            cost = curve[len(draft.tokens) + 1]
            steps += cost
            policy.observe(draft, right, 2e-5 if draft.tokens else 0.0, cost * STEP_S)
            context += answer[written:written + right + 1]
            if state is not None:
                state = state.clone()  # a new state, as the decoder's after each cycle
                for token in answer[written:written + right + 1]:
                    state.follow(token)
            written += right + 1
            lookup.accept(context)
        policy.finish()
        speedups[name] = len(answer) / steps
    return speedups


def ceiling(prompt: list[int], answer: list[int], curve: dict[int, float], spelling=None) -> float:
    """A causal policy told this answer's own acceptance per (match-length bucket, position)."""
    from speculum.bench import copy_fates
    from speculum.engine.policy.acceptance import bucket_of, expected_tokens

    seen = copy_fates(prompt, answer, spelling=spelling)  # per position: (match length, tokens of lookup's proposal right)
    hits, tries = collections.Counter(), collections.Counter()
    for length, right in seen:
        for j in range(min(right + 1, 15) if length else 0):
            tries[bucket_of(length), j] += 1
            hits[bucket_of(length), j] += j < right
    t, steps = 0, 0.0
    while t < len(answer):
        length, right = seen[t]
        best, k = 1.0, 0
        if length:
            rates = [hits[bucket_of(length), j] / tries[bucket_of(length), j] if tries[bucket_of(length), j] else 0.0
                     for j in range(15)]
            for n in range(1, 16):
                if expected_tokens(rates[:n]) / curve[n + 1] > best:
                    best, k = expected_tokens(rates[:n]) / curve[n + 1], n
        steps += curve[k + 1]
        t += min(k, right, len(answer) - t - 1) + 1
    return len(answer) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target")
    parser.add_argument("--answers", help="where the recorded answers are kept (default: the temp folder)")
    parser.add_argument("--seeds", default="1-16", help="a range a-b or a list a,b,c")
    parser.add_argument("--mode", default="auto", choices=("auto", "lookup"))
    parser.add_argument("--grammar", action=argparse.BooleanOptionalAction, default=True,
                        help="draft the grammar's forced text too, where a prompt has a grammar")
    parser.add_argument("--curve", help="sizes:steps, e.g. 2:1.5,4:2.4,16:4.8 (default: the flat and steep ones)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "app"))
    from demo_pair import demo_pair
    from speculum.bench import oracle_speedup
    from speculum.engine.vocabulary import Mode

    target, _ = demo_pair(args.target, None)
    path = Path(args.answers or Path(tempfile.gettempdir()) / f"speculum-sim-{Path(target).stem}.json")
    answers = record(target, path)
    from speculum.engine.drafting.copycursor import Spelling
    from speculum.engine.llama.model import LlamaModel
    from speculum.engine.settings import LoadOptions

    vocabulary = LlamaModel(target, LoadOptions(n_ctx=64))
    spelling = Spelling.of(vocabulary)  # its vocabulary: lookup respells renamed words
    from speculum.bench import load_prompts
    grammar_of = {p.name: p.grammar() for p in load_prompts()}  # (each schema's grammar built once)
    grammars = (vocabulary, {name: g for name, g in grammar_of.items() if g is not None}) if args.grammar else None
    a, _, b = args.seeds.partition("-")
    seeds = list(range(int(a), int(b) + 1)) if b else [int(s) for s in args.seeds.split(",")]
    curves = {"given": {int(n): float(c) for n, c in (x.split(":") for x in args.curve.split(","))}
              } if args.curve else CURVES
    print(f"{Path(target).name}, {args.mode}, fresh policy per seed ({len(seeds)} seeds), lookup"
          f"{' and forced text' if grammars else ' only'}; "
          "speedup over plain decoding: mean / min over seeds, then the oracle and the ceiling")
    for name, points in curves.items():
        curve = full_curve(points)
        runs = [replay(answers, curve, seed, Mode(args.mode), spelling, grammars) for seed in seeds]
        print(f"{name} curve, single steps by size: " + " ".join(f"{n}:{curve[n]:.2f}" for n in (2, 4, 8, 16)))
        for prompt_name, (prompt, answer) in answers.items():
            got = [r[prompt_name] for r in runs]
            oracle = oracle_speedup(prompt, answer, curve.__getitem__, spelling=spelling)
            best = ceiling(prompt, answer, curve, spelling)
            print(f"  {prompt_name:<22} {statistics.mean(got):.3f} / {min(got):.3f}  oracle {oracle:.3f} "
                  f"({statistics.mean(got) / oracle:.0%})  ceiling {best:.3f} ({best / oracle:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
