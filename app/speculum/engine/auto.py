"""Auto mode: speculation that measures the machine and never makes things slower.

A cost model measured live on the running machine, kept per model pair between runs:

- ``verify_s[n]``: the target's pass time with n tokens in the batch (1..MAX_BATCH),
- ``draft_first_s`` / ``draft_step_s``: the draft model's time for its first token of a
  cycle (it first catches up on the tokens the target just emitted) and for each next one,
- acceptance per draft position, per drafter (lookup also per n-gram match length),
  as decaying Beta counts so estimates follow the text within a few cycles.

Each cycle the policy picks the drafter and k maximising expected tokens per second,
E[tokens | acceptance, k] / (T_verify(k+1) + k·T_draft), against plain decoding
(k = 0), which wins whenever nothing else pays. On a 2-core CPU verifying 4 tokens
costs ~2.5 single steps and model drafts rarely pay; on a GPU verification is nearly
flat in k and the same arithmetic picks long drafts.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .. import paths
from .cycle import Cycle
from .drafters import LOOKUP, MODEL, NONE
from .policy import Choice

MAX_K = 15  # lookup drafts are nearly free to make: long copies can pay
MAX_K_MODEL = 8
MAX_BATCH = 16
# Batch sizes measured once per machine and pair: CPU kernels make some sizes cheaper
# than smaller ones (4 rows at once with repacked weights), so no curve is assumed.
CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16)
DECAY = 0.8  # per observation: old evidence fades, a collapse shows within a few cycles
CONFIDENCE_BINS = 10
# Now and then the runner-up is tried even if the cost model says no: a load spike
# during calibration must not lock speculation out for good. Rare enough to cost <1%.
EXPLORE_EVERY = 128
EXPLORE_FLOOR = 0.6  # only options expected at >= 60% of the best


@dataclass
class Rate:
    """Acceptance of one draft position as decaying Beta counts around a prior."""

    accepted: float = 0.0
    rejected: float = 0.0
    prior: float = 0.5
    weight: float = 2.0  # pseudo-observations the prior is worth

    def observe(self, ok: bool) -> None:
        self.forget()
        self.accepted += ok
        self.rejected += not ok

    def forget(self) -> None:
        self.accepted *= DECAY
        self.rejected *= DECAY

    @property
    def value(self) -> float:
        return self.value_with(self.prior)

    def value_with(self, prior: float) -> float:
        return (self.accepted + prior * self.weight) / (self.accepted + self.rejected + self.weight)

    @property
    def evidence(self) -> float:
        return self.accepted + self.rejected


@dataclass
class CostModel:
    """Seconds per target pass by batch size, and per draft-model token."""

    verify_s: dict[int, float] = field(default_factory=dict)
    draft_first_s: float | None = None
    draft_step_s: float | None = None
    lookup_s: float = 2e-5
    gpu: bool = False

    # A pass the OS preempted can take 10x longer; clipping keeps one hiccup from
    # steering several cycles, while a real slowdown still shows within a few passes.
    def observe_verify(self, n: int, seconds: float) -> None:
        self.verify_s[n] = _ema(self.verify_s.get(n), seconds)

    def observe_draft(self, k: int, seconds: float, first_s: float) -> None:
        self.draft_first_s = _ema(self.draft_first_s, first_s)
        if k > 1:
            self.draft_step_s = _ema(self.draft_step_s, (seconds - first_s) / (k - 1))

    def draft(self, k: int) -> float:
        """Seconds for the draft model to propose k tokens."""
        first = self.draft_first_s if self.draft_first_s is not None else 0.6 * self.verify(1)
        step = self.draft_step_s if self.draft_step_s is not None else 0.4 * self.verify(1)
        return first + (k - 1) * step

    def verify(self, n: int) -> float:
        if n in self.verify_s:
            return self.verify_s[n]
        known = sorted(self.verify_s.items())
        if not known:
            return 0.05 * (1 + (0.05 if self.gpu else 0.5) * (n - 1))
        # Linear in the batch size between / beyond the measured sizes; never cheaper than one fewer.
        lower = [(k, v) for k, v in known if k < n]
        upper = [(k, v) for k, v in known if k > n]
        if lower and upper:
            (k0, v0), (k1, v1) = lower[-1], upper[0]
            return v0 + (v1 - v0) * (n - k0) / (k1 - k0)
        if len(known) >= 2:
            (k0, v0), (k1, v1) = (known[-2], known[-1]) if lower else (known[0], known[1])
            slope = max((v1 - v0) / (k1 - k0), 0.0)
            base_k, base_v = (k1, v1) if lower else (k0, v0)
            return max(base_v + slope * (n - base_k), base_v if n > base_k else 0.0)
        k0, v0 = known[0]
        per = v0 / (1 + (0.05 if self.gpu else 0.5) * (k0 - 1))
        return per * (1 + (0.05 if self.gpu else 0.5) * (n - 1))

    def to_json(self) -> dict:
        return {"verify_s": {str(k): v for k, v in self.verify_s.items()}, "draft_first_s": self.draft_first_s,
                "draft_step_s": self.draft_step_s, "gpu": self.gpu}

    @classmethod
    def from_json(cls, d: dict) -> "CostModel":
        return cls({int(k): float(v) for k, v in d.get("verify_s", {}).items()}, d.get("draft_first_s"),
                   d.get("draft_step_s"), gpu=bool(d.get("gpu", False)))


def _ema(old: float | None, new: float) -> float:
    return new if old is None else 0.8 * old + 0.2 * min(new, 3 * old)


def chained(rates: Sequence[Rate]) -> list[float]:
    """Acceptance per position; a position with little evidence leans on the one before it
    (after a run of accepted copies the next is usually right too)."""
    out: list[float] = []
    for i, r in enumerate(rates):
        out.append(r.value if i == 0 else r.value_with(0.5 * (r.prior + out[-1])))
    return out


def expected_tokens(rates: Sequence[float]) -> float:
    """1 (the correction or bonus token) + sum over j of P(first j drafts accepted)."""
    total, run = 1.0, 1.0
    for a in rates:
        run *= a
        total += run
    return total


class AutoPolicy:
    """Picks (drafter, k) per cycle by expected tokens per second; k = 0 when nothing pays."""

    def __init__(self, decoder, allowed: Sequence[str] = (MODEL, LOOKUP), min_k: int = 0,
                 store: Path | None = None, clock=time.perf_counter):
        self.decoder = decoder
        self.allowed = [s for s in allowed if decoder.drafter(s) is not None]
        self.min_k = min_k  # forced modes keep drafting; auto may choose plain decoding
        self.store = store
        self.clock = clock
        gpu = getattr(getattr(decoder.target, "facts", None), "backend", "CPU") != "CPU"
        self.costs = CostModel(gpu=gpu)
        self.model_rates = [Rate(prior=0.6) for _ in range(MAX_K_MODEL)]
        # Lookup acceptance by n-gram match length (1..max) and position.
        # Priors from the default bench suite: 1- and 2-token matches are right ~20% and
        # ~35% of the time; the longest matches are where copying pays, so they start
        # optimistic and are tried at once (a miss is learned within a few cycles).
        n_max = decoder.lookup.max_ngram
        self.lookup_rates = {n: [Rate(prior=0.7 if n == n_max else 0.05 + 0.15 * n) for _ in range(MAX_K)]
                             for n in range(1, n_max + 1)}
        # Draft-model acceptance by its own confidence, to tune the early-stop threshold.
        self.confidence_rates = [Rate(prior=(i + 0.5) / CONFIDENCE_BINS) for i in range(CONFIDENCE_BINS)]
        self.min_confidence = 0.0
        self.last: Choice = Choice(NONE, 0)
        self.last_estimate: dict = {}
        self.cycles_since_explore = 0
        self.mode = "auto"
        self._load()

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def for_decoder(cls, decoder, mode: str = "auto") -> "AutoPolicy":
        """auto: any drafter or none; draft / lookup: that drafter only, always drafting."""
        allowed = {"auto": (MODEL, LOOKUP), "draft": (MODEL,), "lookup": (LOOKUP,)}[mode]
        policy = cls(decoder, allowed, min_k=0 if mode == "auto" else 1, store=default_store(decoder),
                     clock=decoder.clock)
        policy.mode = mode
        return policy

    # -- choosing -------------------------------------------------------------------------

    def plain_tokens_per_s(self) -> float:
        return 1.0 / self.costs.verify(1)

    def _options(self, context: Sequence[int]) -> list[tuple[float, Choice, float]]:
        """(expected tokens/s, choice, expected tokens per pass) for every candidate."""
        c = self.costs
        options = []
        if self.min_k == 0:
            options.append((1.0 / c.verify(1), Choice(NONE, 0), 1.0))
        if LOOKUP in self.allowed:
            end, n = self.decoder.lookup.match(context)
            if n > 0:
                available = len(self.decoder.lookup.tokens) - end - 1
                rates = chained(self.lookup_rates[n])
                for k in range(1, min(MAX_K, available, MAX_BATCH - 1) + 1):
                    e = expected_tokens(rates[:k])
                    options.append((e / (c.verify(k + 1) + c.lookup_s), Choice(LOOKUP, k, min_match=n), e))
        if MODEL in self.allowed:
            rates = chained(self.model_rates)
            for k in range(1, min(MAX_K_MODEL, MAX_BATCH - 1) + 1):
                e = expected_tokens(rates[:k])
                options.append((e / (c.verify(k + 1) + c.draft(k)), Choice(MODEL, k, self.min_confidence), e))
        return options

    def choose(self, context: Sequence[int] = ()) -> Choice:
        options = self._options(context)
        if not options:  # forced lookup with no match: a plain step
            self.last = Choice(NONE, 0)
            self.last_estimate = {"expected_tokens_per_s": round(self.plain_tokens_per_s(), 2)}
            return self.last
        options.sort(key=lambda o: o[0], reverse=True)
        speed, choice, e = options[0]
        self.cycles_since_explore += 1
        if self.cycles_since_explore >= EXPLORE_EVERY:
            n_best = choice.k + 1
            runner = next((o for o in options[1:] if o[1].k + 1 != n_best and o[0] >= EXPLORE_FLOOR * speed), None)
            if runner is not None:
                self.cycles_since_explore = 0
                speed, choice, e = runner
        if choice.source == MODEL:
            # Hybrid: a confident lookup match goes first, the model drafts when it has none.
            look = [o for o in options if o[1].source == LOOKUP]
            if look:
                best_look = max(look, key=lambda o: o[0])
                if best_look[0] >= 0.9 * speed:
                    speed, choice, e = best_look
                    choice = Choice(LOOKUP, choice.k, min_match=choice.min_match, fallback=MODEL)
        self.last = choice
        self.last_estimate = {"expected_tokens_per_s": round(speed, 2), "expected_tokens_per_pass": round(e, 3)}
        return choice

    # -- learning -------------------------------------------------------------------------

    def observe(self, cycle: Cycle) -> None:
        n = 1 + len(cycle.drafted)
        if n <= MAX_BATCH and cycle.verify_s > 0:
            self.costs.observe_verify(n, cycle.verify_s)
        if not cycle.drafted:
            return
        if cycle.source == MODEL:
            self.costs.observe_draft(len(cycle.drafted), cycle.draft_s, cycle.draft_first_s or cycle.draft_s)
            rates = self.model_rates
        else:
            self.costs.lookup_s = 0.8 * self.costs.lookup_s + 0.2 * cycle.draft_s
            match = max(1, min(cycle.match_length, len(self.lookup_rates)))
            rates = self.lookup_rates[match]
        seen = min(len(cycle.drafted), cycle.n_accepted + 1, len(rates))
        for i, rate in enumerate(rates):
            if i < seen:
                rate.observe(i < cycle.n_accepted)
            else:  # unseen positions forget too, so an old low estimate cannot trap k short
                rate.forget()
        if cycle.source == MODEL and cycle.draft_confidence:
            self._tune_confidence(cycle)

    def _tune_confidence(self, cycle: Cycle) -> None:
        for i, c in enumerate(cycle.draft_confidence[: cycle.n_accepted + 1]):
            self.confidence_rates[min(int(c * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)].observe(i < cycle.n_accepted)
        # Stop drafting where one more token is expected to cost more than it returns:
        # it returns a(c) tokens for (T_draft + dT_verify) seconds, vs plain speed.
        c = self.costs
        marginal = (c.draft(2) - c.draft(1) + c.verify(3) - c.verify(2)) / c.verify(1)
        for i, rate in enumerate(self.confidence_rates):
            if rate.value >= marginal:
                self.min_confidence = i / CONFIDENCE_BINS
                break
        else:
            self.min_confidence = 1.0

    def describe(self) -> dict:
        c = self.last
        plain = self.plain_tokens_per_s()
        d = {"source": c.source if c.k else NONE, "k": c.k, "mode": self.mode,
             "plain_tokens_per_s": round(plain, 2),
             "verify_cost": {n: round(self.costs.verify(n) / self.costs.verify(1), 3) for n in (2, 3, 5, 9)},
             "draft_cost": {k: round(self.costs.draft(k) / self.costs.verify(1), 3) for k in (1, 3)},
             "model_acceptance": [round(r.value, 3) for r in self.model_rates[:4]],
             "min_confidence": round(self.min_confidence, 2), **self.last_estimate}
        if c.source == LOOKUP:
            d["lookup_match"] = c.min_match
        exp = self.last_estimate.get("expected_tokens_per_s")
        if exp:
            d["expected_speedup"] = round(exp / plain, 3)
        return d

    # -- memory between runs --------------------------------------------------------------

    def _load(self) -> None:
        if not self.store or not self.store.is_file():
            return
        try:
            d = json.loads(self.store.read_text())
            self.costs = CostModel.from_json(d["costs"])
            for r, v in zip(self.model_rates, d.get("model", [])):
                r.prior = float(v)
            for n, saved in d.get("lookup", {}).items():
                for r, v in zip(self.lookup_rates.get(int(n), []), saved):
                    r.prior = float(v)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged memory only costs a re-measurement

    def save(self) -> None:
        if not self.store:
            return
        d = {"costs": self.costs.to_json(), "model": [r.value for r in self.model_rates],
             "lookup": {n: [r.value for r in rs] for n, rs in self.lookup_rates.items()}}
        try:
            paths.write_json_atomic(self.store, d)
        except OSError:
            pass  # a memory that cannot be written only costs a re-measurement next time

    def finish(self) -> None:
        self.save()

    def prepare(self, sequence, last_token: int) -> None:
        """Measure pass time by batch size once per machine and pair, before the first cycle."""
        if all(n in self.costs.verify_s for n in CALIBRATION_SIZES[:6]):
            return
        model = sequence.model

        def timed(seq, tokens: list[int]) -> float:
            keep = len(seq.tokens)
            t = self.clock()
            seq.decode(tokens, rows=range(len(tokens)))
            seconds = self.clock() - t
            seq.trim(keep)
            return seconds

        timed(sequence, [last_token])  # warm-up: the first pass after loading pages weights in
        sizes = [n for n in CALIBRATION_SIZES if model.n_past + n <= model.n_ctx]
        best: dict[int, float] = {}
        for _ in range(3):  # rounds across all sizes: a passing hiccup spoils one sample, not a size
            for n in sizes:
                best[n] = min(best.get(n, float("inf")), timed(sequence, [last_token] * n))
        self.costs.verify_s.update(best)
        draft = self.decoder.model_drafter
        if getattr(draft, "sequence", None) is not None and MODEL in self.allowed:
            if draft.model.n_past + 2 <= draft.model.n_ctx:
                timed(draft.sequence, [last_token])
                # A cycle's first draft token follows a catch-up on ~2 new tokens.
                self.costs.draft_first_s = min(timed(draft.sequence, [last_token] * 2) for _ in range(2))
                self.costs.draft_step_s = min(timed(draft.sequence, [last_token]) for _ in range(3))


def default_store(decoder) -> Path | None:
    """One small file per model pair and machine under the user data folder."""
    target = getattr(decoder.target, "path", None)
    if target is None:
        return None
    draft = getattr(decoder.draft, "path", None)
    facts = getattr(decoder.target, "facts", None)
    ident = "|".join([
        Path(target).name, str(Path(target).stat().st_size),
        Path(draft).name if draft else "-", str(Path(draft).stat().st_size) if draft else "-",
        platform.node(), platform.machine(), getattr(facts, "backend", "?"),
        str(getattr(decoder.target, "n_threads", "?")),
    ])
    return paths.data_dir() / "policy" / (hashlib.sha1(ident.encode()).hexdigest()[:16] + ".json")
