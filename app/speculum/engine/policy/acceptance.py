"""What the auto policy knows of how often drafts are right: acceptance per draft position as
decaying Beta counts around a prior (``Rate``), a table of them per drafter or match-length
bucket (``Table``), and the arithmetic of expected tokens per pass from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

DECAY = 0.8  # per observation: old evidence fades, a collapse shows within a few cycles
UNSEEN_DECAY = 0.97  # per cycle that does not reach a position: its evidence ages, slowly
IDLE_DECAY = 0.99  # per cycle a table is not drafted from at all: half its evidence in ~70
PRIOR_WEIGHT = 2.0  # pseudo-observations a prior is worth: little, so evidence wins fast
# Lookup acceptance is learned per match-length bucket (lower bounds: 1, 2, 3, 4-5, 6-8,
# 9-16, 17+): a copy that matched 30 tokens of context is right far more often than one
# that matched a newline. Priors from the default bench suite; Thompson sampling lets a
# wrong prior be found out within a few cycles. Matches of 9+ tokens were right 95-99% of the
# time at every position seen there; at 0.8/0.85 a fresh policy copied 8 tokens a pass from a
# 30-token match where 15 were right (code editing 1.66x plain priced on the verify curve,
# 1.76x at 0.9/0.95; document summary 1.72x, 1.82x; 3 policy seeds each).
LOOKUP_BUCKETS = (1, 2, 3, 4, 6, 9, 17)
LOOKUP_PRIORS = (0.2, 0.35, 0.5, 0.6, 0.7, 0.9, 0.95)
# The n-gram memory: the same buckets, warier below 9 tokens (an earlier text shares phrases
# with this one more often than it goes on the same way); lookup in the context at hand is
# right more often at a short match, and its n-grams are the memory's too.
MEMORY_PRIORS = (0.1, 0.2, 0.3, 0.4, 0.55, 0.85, 0.95)
# A client's prediction: acceptance by how many output tokens in a row followed it
# (bucket lower bounds: 1, 2-3, 4-7, 8-15, 16+). One token in common with it means little
# (unrelated text shares newlines and brackets); a long run is an edit copying the file,
# right nearly every time.
PREDICTION_BUCKETS = (1, 2, 4, 8, 16)
PREDICTION_PRIORS = (0.1, 0.5, 0.75, 0.85, 0.9)
# The grammar's forced text: acceptance by how many of its characters lead it before the first
# blank no habit confirmed (bucket lower bounds: 1, 4-7, 8-15, 16+). A whole key with its quotes
# and colon is right unless a guessed blank before it is wrong.
GRAMMAR_BUCKETS = (1, 4, 8, 16)
GRAMMAR_PRIORS = (0.5, 0.8, 0.9, 0.95)


def bucket_of(length: int, bounds: Sequence[int] = LOOKUP_BUCKETS) -> int:
    """Index of the bucket holding ``length`` (bounds are the buckets' lower bounds)."""
    i = 0
    while i + 1 < len(bounds) and length >= bounds[i + 1]:
        i += 1
    return i


@dataclass
class Rate:
    """Acceptance of one draft position as decaying Beta counts around a prior."""

    accepted: float = 0.0
    rejected: float = 0.0
    prior: float = 0.5
    weight: float = PRIOR_WEIGHT  # pseudo-observations the prior is worth

    def observe(self, ok: bool) -> None:
        self.forget()
        self.accepted += ok
        self.rejected += not ok

    def forget(self, decay: float = DECAY) -> None:
        self.accepted *= decay
        self.rejected *= decay

    @property
    def value(self) -> float:
        return self.value_with(self.prior)

    @property
    def prior_weight(self) -> float:
        """The prior counts for less as evidence comes in: with decaying counts evidence never
        exceeds 1 / (1 - DECAY) observations, and a fixed weight kept every estimate a
        third of the way to its prior (a draft right 100% of the time read as 89%)."""
        return self.weight / (1.0 + self.evidence)

    def value_with(self, prior: float) -> float:
        w = self.prior_weight
        return (self.accepted + prior * w) / (self.accepted + self.rejected + w)

    def sample_with(self, prior: float, rng: np.random.Generator) -> float:
        """A draw from the Beta posterior: wide where evidence is thin, so a position or a
        threshold never tried is tried now and then, until it has proven not to pay."""
        w = self.prior_weight
        return float(rng.beta(self.accepted + prior * w, self.rejected + (1 - prior) * w))

    @property
    def evidence(self) -> float:
        return self.accepted + self.rejected


class Table(list):
    """One drafter's (or match bucket's) rates per draft position, and the cycle through which
    its idle aging has been applied: a table not drafted from ages when it is next read, not
    every cycle (~200 rates a cycle, most never read: a fifth of what auto mode cost per cycle
    beyond plain decoding, 0.07 of 0.33 ms on a 2-core CPU)."""

    def __init__(self, rates=(), aged: int = 0):
        super().__init__(rates)
        self.aged = aged


def chained(rates: Sequence[Rate], rng: np.random.Generator | None = None) -> list[float]:
    """Acceptance per position; a position with little evidence leans on the one before it
    (after a run of accepted copies the next is usually right too). With ``rng``, each is
    a Thompson draw from its posterior instead of its mean."""
    out: list[float] = []
    for i, r in enumerate(rates):
        prior = r.prior if i == 0 else 0.5 * (r.prior + out[-1])
        out.append(r.value_with(prior) if rng is None else r.sample_with(prior, rng))
    return out


def observe_positions(rates: Sequence[Rate], n_drafted: int, n_accepted: int) -> None:
    """Position i is seen when the first i drafts were accepted. The unseen forget slowly:
    as fast as the seen (as before), a long draft that proved itself was forgotten within
    ten short ones, and k fell back for good; Thompson draws already retry low estimates."""
    seen = min(n_drafted, n_accepted + 1, len(rates))
    for i, rate in enumerate(rates):
        if i < seen:
            rate.observe(i < n_accepted)
        else:
            rate.forget(UNSEEN_DECAY)


def expected_tokens(rates: Sequence[float]) -> float:
    """1 (the correction or bonus token) + sum over j of P(first j drafts accepted)."""
    total, run = 1.0, 1.0
    for a in rates:
        run *= a
        total += run
    return total
