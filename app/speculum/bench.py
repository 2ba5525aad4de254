"""`speculum bench`: every prompt in every mode, interleaved in one process, side by side.

Speed claims are ratios measured in one run (speculative vs plain on the same prompt,
same model), because shared machines are noisy.
"""

from __future__ import annotations

import bisect
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple, Sequence, TextIO

from . import paths
from .documents import read_document
from .engine.policy.costs import CURVE_BATCH
from .engine.decoder import Decoder
from .engine.drafting.copycursor import Spelling
from .engine.drafting.lookup import PromptLookup
from .engine.grammar.schema import schema_grammar
from .engine.prompts import build_messages
from .engine.sampling import SamplingParams
from .engine.stats import Stats
from .engine.vocabulary import Mode, Source
from .errors import SpeculumError

DEFAULT_SUITE = "bench/default.jsonl"


@dataclass
class BenchPrompt:
    name: str
    user: str
    system: str | None = None
    document: str | None = None
    temperature: float = 0.0
    max_tokens: int = 128
    seed: int = 0
    history: list[dict] = field(default_factory=list)  # earlier turns of the conversation
    json_schema: dict | None = None  # the answer constrained to it (a grammar), as response_format asks
    copy_heavy: bool = False  # most of a right answer is in its prompt (benchmarks hold these to a higher bar)

    def messages(self) -> list[dict]:
        return build_messages(self.user, self.system, self.document, self.history)

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, seed=self.seed)

    @property
    def repeatable(self) -> bool:
        """Whether its answer is a function of the prompt, the same in every mode: greedy, or
        seeded drafter-invariant sampling (engine/sampling.py)."""
        sampling = self.sampling()
        return sampling.greedy or sampling.drafter_invariant

    def grammar(self):
        """The grammar the answer follows (None: free text)."""
        return schema_grammar(self.json_schema) if self.json_schema is not None else None


def load_prompts(path: str | None = None) -> list[BenchPrompt]:
    file = Path(path) if path else paths.resource(DEFAULT_SUITE)
    if not file.is_file():
        raise SpeculumError(f"Prompt suite not found: {file}")
    prompts = []
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            doc = d.get("document")
            if doc is None and d.get("document_file"):
                doc = read_document(file.parent / d["document_file"])
            history = [{"role": str(m["role"]), "content": str(m["content"])} for m in d.get("history", [])]
            schema = d.get("json_schema")
            if schema is not None and not isinstance(schema, dict):
                raise TypeError("json_schema must be an object")
            prompts.append(BenchPrompt(d["name"], d["user"], d.get("system"), doc,
                                       float(d.get("temperature", 0.0)), int(d.get("max_tokens", 128)),
                                       int(d.get("seed", 0)), history, schema, bool(d.get("copy_heavy", False))))
        except (ValueError, KeyError, TypeError) as exc:
            raise SpeculumError(f"{file}:{n}: not a valid prompt line ({exc}).") from None
    return prompts


def run_one(decoder: Decoder, prompt_tokens: list[int], mode: Mode, prompt: BenchPrompt,
            max_tokens: int, k: int | None = None, passes: list | None = None,
            choices: list | None = None) -> tuple[Stats, list[int]]:
    """One generation; its Stats and the tokens it wrote (and, into ``passes``, each pass's
    (tokens, seconds); into ``choices``, what each cycle chose, as ``priced_speedup`` reads it)."""
    sampling = prompt.sampling()
    output: list[int] = []
    generation = decoder.generate(prompt_tokens, max_tokens=max_tokens, sampling=sampling, policy=mode, k=k,
                                  grammar=prompt.grammar())
    for cycle in generation:
        output += cycle.emitted
        if passes is not None:
            passes.append(timed_pass(cycle))
        if choices is not None and cycle.emitted:  # an ending event made no pass
            choices.append(CycleChoice(len(cycle.drafted) + 1, len(cycle.emitted), cycle.draft_s))
    return generation.stats, output


def timed_pass(cycle) -> tuple[int, float]:
    """A cycle's target pass as ``curve_from_passes`` reads it: (tokens in it, seconds)."""
    return len(cycle.drafted) + 1, cycle.verify_s


class CycleChoice(NamedTuple):
    """What one cycle chose and got: the tokens in its target pass, the tokens it emitted, and
    the seconds its drafting took."""

    pass_tokens: int
    emitted: int
    draft_s: float


def priced_speedup(choices: Sequence[CycleChoice], verify: Callable[[int], float]) -> float | None:
    """A run's speedup over plain decoding with its target passes priced on one verify curve
    (and its drafting as timed): what the policy's choices are worth with the machine's noise
    taken out. On a shared 2-core machine the same plain run reads anywhere from 24 to 33
    tok/s, so tokens/s alone cannot tell a policy's 5% from the machine's; priced on the curve
    the oracle is priced on, this and the oracle compare like for like."""
    seconds = sum(verify(c.pass_tokens) + c.draft_s for c in choices)
    tokens = sum(c.emitted for c in choices)
    return tokens * verify(1) / seconds if seconds > 0 and tokens else None


def time_to_first_token(stats: Stats) -> float:
    return stats.prompt_s + (stats.tokens_over_time[0][0] if stats.tokens_over_time else 0.0)


def copy_fates(prompt: Sequence[int], output: Sequence[int], max_batch: int = CURVE_BATCH,
               spelling: Spelling | None = None) -> list[tuple[int, int]]:
    """Per position of ``output``: the lookup drafter's match length there, and how many of
    the up to ``max_batch - 1`` tokens it would copy are right (with the target's ``spelling``,
    as the engine's lookup copies)."""
    lookup = PromptLookup(spelling=spelling)
    context = list(prompt)
    lookup.begin(context)
    fates = []
    for t, token in enumerate(output):
        length, right = lookup.match(context).length, 0
        if length:
            copy = lookup.copy(max_batch - 1)
            while right < len(copy) and t + right < len(output) and copy[right] == output[t + right]:
                right += 1
        fates.append((length, right))
        context.append(token)
    return fates


def oracle_speedup(prompt: Sequence[int], output: Sequence[int], verify: Callable[[int], float],
                   max_batch: int = CURVE_BATCH, spelling: Spelling | None = None) -> float | None:
    """The speedup over plain decoding of a lookup that knew in advance how many of its
    tokens would be accepted, on this output with this verify curve (seconds per pass by
    tokens in it). At each position it may copy what followed the longest earlier match
    (the lookup drafter's proposal), cut where the output departs from it, or step plainly;
    the fastest way through the whole output is found by dynamic programming."""
    n = len(output)
    if n == 0:
        return None
    accepted = [right for _, right in copy_fates(prompt, output, max_batch, spelling)]
    best = [0.0] * (n + 1)  # seconds to write output[t:]
    for t in range(n - 1, -1, -1):
        best[t] = verify(1) + best[t + 1]
        for j in range(1, min(accepted[t], max_batch - 1, n - t - 1) + 1):
            best[t] = min(best[t], verify(j + 1) + best[t + j + 1])
    return n * verify(1) / best[0]


def curve_from_passes(passes: Sequence[tuple[int, float]]) -> Callable[[int], float] | None:
    """A verify curve from passes as they ran, (tokens in the pass, seconds): the median per
    size, straight lines between the sizes seen and beyond them. What the policy's cost model
    holds was partly timed at another moment and at another context length (calibration
    reads a short one); this is what this request's own passes cost."""
    by_size: dict[int, list[float]] = {}
    for n, seconds in passes:
        if n >= 1 and seconds > 0:
            by_size.setdefault(n, []).append(seconds)
    if 1 not in by_size or len(by_size) < 2:
        return None
    sizes = sorted(by_size)
    cost = {n: statistics.median(by_size[n]) for n in sizes}

    def verify(n: int) -> float:
        if n in cost:
            return cost[n]
        # The two sizes seen around n, or the last two below it (n is never below size 1)
        i = min(bisect.bisect(sizes, n), len(sizes) - 1)
        a, b = sizes[i - 1], sizes[i]
        return max(cost[a] + (cost[b] - cost[a]) * (n - a) / (b - a), cost[1])

    return verify


def verify_curve(decoder) -> Callable[[int], float] | None:
    """The verify curve the policies measured during the run (auto's first)."""
    for mode in (Mode.AUTO, Mode.LOOKUP, Mode.DRAFT):
        policy = decoder.policies.get(mode)  # (AutoPolicy only: fixed ones are not kept)
        if policy is not None and policy.costs.verify_s:
            return policy.costs.verify
    return None


def cold_ttft(decoder: Decoder, prompt_tokens: list[int], mode: Mode) -> float:
    """Time to the first token with nothing of the prompt cached."""
    decoder.forget_prompts()
    stats, _ = run_one(decoder, prompt_tokens, mode, BenchPrompt("ttft", ""), 1)
    return time_to_first_token(stats)


def run_order(modes: Sequence[Mode]) -> list[Mode]:
    """The runs of one prompt: plain decoding before and after the first speculative mode, auto
    first among them. Speedups are against the median of a prompt's plain runs: a shared machine's
    speed drifts by 10% within a minute, and a plain run three runs away from auto's made one
    run's auto read 0.91x plain while it decoded 94% of its tokens plainly. Auto first: on the
    first prompt its policy is as fresh as a new user's, not taught by draft mode just before."""
    others = sorted((m for m in modes if m != Mode.OFF), key=lambda m: m != Mode.AUTO)
    if Mode.OFF not in modes or not others:
        return others or [Mode.OFF]
    return [Mode.OFF, others[0], Mode.OFF, *others[1:]]


@dataclass
class ModeRuns:
    """One prompt in one mode, over the repeats."""
    stats: Stats = field(default_factory=Stats)  # all runs merged
    rates: list[float] = field(default_factory=list)  # tokens/s, per run
    choices: list[list[CycleChoice]] = field(default_factory=list)  # what each cycle chose, per run
    output: list[int] = field(default_factory=list)  # the tokens the last run wrote
    outputs: list[list[int]] = field(default_factory=list)  # the tokens each run wrote

    def add(self, stats: Stats, output: list[int], chosen: list[CycleChoice]) -> None:
        self.stats.merge(stats)
        self.rates.append(stats.tokens_per_s)
        self.choices.append(chosen)
        self.output = output
        self.outputs.append(output)

    def row(self, name: str, mode: Mode) -> dict:
        s = self.stats
        return {
            "name": name, "mode": mode, "tokens": s.tokens // len(self.rates),
            "tokens_per_s": round(statistics.median(self.rates), 3),
            "acceptance_rate": round(s.acceptance_rate, 4),
            "tokens_per_pass": round(s.tokens_per_pass, 4),
            "overhead_ms_per_cycle": round(s.overhead_ms_per_cycle, 4),
            "draft_share": round(s.draft_share, 4),
            "choices": {source: round(share, 3) for source, share in s.choices.items()},
        }


def run_bench(decoder: Decoder, prompts: list[BenchPrompt], modes: list[Mode], max_tokens: int | None = None,
              repeat: int = 1, k: int | None = None, progress: TextIO | None = None,
              info: dict | None = None, remember: bool = False) -> list[dict]:
    """Interleave modes per prompt and repetition; per (prompt, mode) the median tokens/s of
    the repeats, and the other figures over all of them. ``remember``: at the end, each prompt's
    plain answer goes into the n-gram memory (not before: it would draft this run's answers).

    ``info`` (a dict) receives the first token's wait with a fresh policy and with the one
    the run has taught (the prompt read from scratch both times): "ttft"."""
    if Source.MODEL not in decoder.drafters:
        modes = [m for m in modes if m != Mode.DRAFT]
    if Source.MTP not in decoder.drafters:  # no NextN layers: nothing to compare
        modes = [m for m in modes if m != Mode.MTP]
    tokenized = {p.name: decoder.target.tokenize(decoder.target.apply_chat_template(p.messages())) for p in prompts}
    # Warm-up: the first decode after loading is slower (page faults, thread start).
    list(decoder.generate(tokenized[prompts[0].name], max_tokens=4, policy=Mode.OFF))
    first_mode = next((m for m in modes if m == Mode.AUTO), None)
    ttft = _TimeToFirstToken(decoder, tokenized[prompts[0].name], first_mode) if info is not None and first_mode else None
    runs: dict[tuple[str, Mode], ModeRuns] = {}
    passes: dict[str, list[tuple[int, float]]] = {p.name: [] for p in prompts}  # per prompt, all modes
    for r in range(repeat):
        for p in prompts:
            for mode in run_order(modes):
                chosen: list[CycleChoice] = []
                stats, output = run_one(decoder, tokenized[p.name], mode, p, max_tokens or p.max_tokens, k,
                                        passes[p.name], chosen)
                if progress:
                    progress.write(f"[{r + 1}/{repeat}] {p.name:<22} {mode:<7} {stats.tokens_per_s:6.1f} tok/s\n")
                    progress.flush()
                runs.setdefault((p.name, mode), ModeRuns()).add(stats, output, chosen)
    if ttft is not None:
        info["ttft"] = ttft.after_the_run()
    results = [one.row(name, mode) for (name, mode), one in runs.items()]
    _compare(results, runs, passes, tokenized, {p.name: p.repeatable for p in prompts}, decoder)
    if remember and decoder.memory is not None:
        for p in prompts:
            if (p.name, Mode.OFF) in runs:
                decoder.memory.remember(tokenized[p.name] + runs[p.name, Mode.OFF].output, f"bench {p.name}")
    return results


class _TimeToFirstToken:
    """The first token's wait, the prompt read from scratch: with the policy fresh (made when
    this is), then taught by the run; each next to plain decoding timed beside it."""

    def __init__(self, decoder: Decoder, prompt_tokens: list[int], mode: Mode):
        self.decoder, self.prompt_tokens, self.mode = decoder, prompt_tokens, mode
        self.fresh_s = cold_ttft(decoder, prompt_tokens, mode)
        self.plain_s = cold_ttft(decoder, prompt_tokens, Mode.OFF)

    def after_the_run(self) -> dict:
        calibrated_s = cold_ttft(self.decoder, self.prompt_tokens, self.mode)
        plain_after_s = cold_ttft(self.decoder, self.prompt_tokens, Mode.OFF)
        ttft = {"fresh_s": self.fresh_s, "plain_s": self.plain_s, "calibrated_s": calibrated_s,
                "plain_after_s": plain_after_s, "fresh_vs_calibrated": self.fresh_s / calibrated_s,
                # A shared machine's speed drifts over a run: each against plain decoding timed next to it.
                "fresh_vs_calibrated_vs_plain": (self.fresh_s / self.plain_s) / (calibrated_s / plain_after_s)}
        return {key: round(v, 4) for key, v in ttft.items()}


def _compare(results: list[dict], runs: dict[tuple[str, Mode], ModeRuns], passes: dict[str, list],
             tokenized: dict[str, list[int]], greedy: dict[str, bool], decoder: Decoder) -> None:
    """Each row against plain decoding of its prompt: speedup, the oracle's and the priced
    speedup where a verify curve is known, and whether greedy output stayed the same."""
    off = {r["name"]: r["tokens_per_s"] for r in results if r["mode"] == Mode.OFF}
    policy_curve = verify_curve(decoder)
    curves = {name: curve_from_passes(timed) for name, timed in passes.items()}
    spelling = None  # the target's, built at the first oracle
    for r in results:
        one = runs[r["name"], r["mode"]]
        base = off.get(r["name"])
        r["speedup_vs_off"] = round(r["tokens_per_s"] / base, 3) if base else None
        # The prompt's own passes (its context length, this run's moment) when they give a
        # curve; the policy's cost model holds sizes timed elsewhere, often cheaper.
        curve = curves[r["name"]]
        r["oracle_curve"] = "passes" if curve is not None else "policy"
        curve = curve or policy_curve
        if r["mode"] in (Mode.LOOKUP, Mode.AUTO) and curve is not None:
            spelling = spelling or Spelling.of(decoder.target)
            oracle = oracle_speedup(tokenized[r["name"]], one.output, curve, spelling=spelling)
            r["oracle_speedup"] = round(oracle, 3) if oracle else None
            r["oracle_fraction"] = (round(r["speedup_vs_off"] / oracle, 3)
                                    if oracle and r["speedup_vs_off"] is not None else None)
        if curve is not None:
            priced = [x for run in one.choices if (x := priced_speedup(run, curve))]
            r["priced_speedup"] = round(statistics.median(priced), 3) if priced else None
            if r.get("oracle_speedup") and r["priced_speedup"]:
                r["priced_oracle_fraction"] = round(r["priced_speedup"] / r["oracle_speedup"], 3)
        plain = runs.get((r["name"], Mode.OFF))
        if plain is not None and greedy[r["name"]] and (r["mode"] != Mode.OFF or len(one.outputs) > 1):
            # Speculation's promise: the target's own answer. Greedy (or seeded: the same noise in
            # every mode), token for token, in every run
            # against plain decoding's first (a batched pass computes in another order than a single
            # step unless --exact, so a near tie can flip: shown here; where it first departs).
            parted = [at for same, at in (departure(plain.outputs[0], out) for out in one.outputs) if not same]
            r["same_as_off"], r["departs_at"] = not parted, min(parted) if parted else None


def departure(plain: Sequence[int], other: Sequence[int]) -> tuple[bool, int | None]:
    """Whether two answers are the same, and where the second first departs from the first."""
    for i, (a, b) in enumerate(zip(plain, other)):
        if a != b:
            return False, i
    return (True, None) if len(plain) == len(other) else (False, min(len(plain), len(other)))


def print_table(results: list[dict], out: TextIO, info: dict | None = None) -> None:
    head = (f"{'prompt':<22} {'mode':<7} {'tokens':>6} {'tok/s':>7} {'accept':>7} {'tok/pass':>8} "
            f"{'ovh ms':>7} {'vs off':>7} {'priced':>7} {'oracle':>7} {'of it':>6} {'as off':>7}  passes by drafter")
    out.write(head + "\n" + "-" * len(head) + "\n")
    for r in results:
        sp = f"{r['speedup_vs_off']:.2f}x" if r["speedup_vs_off"] is not None else "-"
        acc = f"{100 * r['acceptance_rate']:.0f}%" if r["mode"] != Mode.OFF else "-"
        oracle = f"{r['oracle_speedup']:.2f}x" if r.get("oracle_speedup") else "-"
        share = f"{100 * r['oracle_fraction']:.0f}%" if r.get("oracle_fraction") else "-"
        priced = f"{r['priced_speedup']:.2f}x" if r.get("priced_speedup") else "-"
        same = "-" if "same_as_off" not in r else "same" if r["same_as_off"] else f"@{r['departs_at']}"
        out.write(f"{r['name']:<22} {r['mode']:<7} {r['tokens']:>6} {r['tokens_per_s']:>7.1f} {acc:>7} "
                  f"{r['tokens_per_pass']:>8.2f} {r['overhead_ms_per_cycle']:>7.3f} {sp:>7} {priced:>7} {oracle:>7} {share:>6} "
                  f"{same:>7}  "
                  + " ".join(f"{src} {100 * share:.0f}%" for src, share in r["choices"].items()) + "\n")
    if (info or {}).get("flash_attn"):
        value = info["flash_attn"]
        out.write(f"\nThe target's flash attention: {value}{' (llama.cpp chose)' if value == 'auto' else ''}\n")
    ttft = (info or {}).get("ttft")
    if ttft:
        out.write(f"\nFirst token, prompt read from scratch: fresh policy {ttft['fresh_s']:.2f} s "
                  f"(plain next to it {ttft['plain_s']:.2f} s), taught by this run {ttft['calibrated_s']:.2f} s "
                  f"(plain {ttft['plain_after_s']:.2f} s): fresh/taught {ttft['fresh_vs_calibrated']:.2f}x, "
                  f"each against its plain {ttft['fresh_vs_calibrated_vs_plain']:.2f}x\n")
