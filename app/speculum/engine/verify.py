"""Verification: which drafted tokens the target keeps, and the token it adds.

Greedy: the longest prefix equal to the target's argmax, then the target's own next
token. Sampling (Leviathan et al. 2023): accept token x with probability
min(1, p(x)/q(x)); on the first rejection resample from max(0, p - q), normalised;
when all k pass, draw a bonus token from p. The output is distributed exactly as the
target's. A lookup draft is a point mass (q(x) = 1), so it is accepted with p(x).

Drafter-invariant sampling (with a seed, ``SamplingParams.drafter_invariant``): the target's
token at each position is its Gumbel-max choice (``sampling.gumbel_max``), so verification is
greedy's, comparing each drafted token with that choice. Whatever the drafter proposed, the
answer is the one plain decoding writes for the seed.

The target's p at a verified position is shaped by what comes before it (``TargetRows``):
penalties count the answer plus the draft tokens before the position, and a grammar masks it
with its state after them. So row i of a pass is exactly the row a plain decoder would have
had, had the draft's first i tokens been its own: a token the grammar forbids has p = 0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from .drafting.draft import Draft
from .sampling import Penalties, SamplingParams, distribution, gumbel_max, log_probs, sample

if TYPE_CHECKING:
    from .grammar.state import GrammarState, MaskedDistribution


@dataclass
class Verdict:
    n_accepted: int
    tokens: list[int]  # the accepted drafts, then the correction or bonus token
    p_drafted: list[float]  # sampling: target p of each drafted token; greedy: empty


class TargetRows:
    """The target's logits at each position of one pass, as a plain decoder would shape them.

    Row i follows the context and ``draft[:i]``: penalised by the answer so far plus those
    tokens, masked by the grammar state after them. Grammar states are cloned and walked down
    the draft only as far as rows are asked for; verification never asks past a token the
    grammar forbids (that token is rejected there), so no state ever follows a forbidden one.
    The rows read the answer's penalties as they stand: ask for them before ``Constraints.follow``.
    """

    def __init__(self, logits: np.ndarray, draft: Sequence[int], grammar: GrammarState | None = None,
                 penalties: Penalties | None = None):
        self.raw = logits
        self.draft = list(draft)
        self.penalties = penalties
        self._states = [grammar.clone()] if grammar is not None else None  # before row i
        self._shaped: dict[int, np.ndarray] = {}
        self._best: dict[int, int] = {}

    @property
    def plain(self) -> bool:
        return self._states is None and self.penalties is None

    def penalised(self, i: int) -> np.ndarray:
        if self.penalties is None:
            return self.raw[i]
        return self.penalties.apply(self.raw[i], self.draft[:i])

    def state(self, i: int) -> GrammarState:
        """The grammar state after ``draft[:i]`` (ValueError if the grammar forbids one of them)."""
        while len(self._states) <= i:
            walked = self._states[-1].clone()
            walked.accept(self.draft[len(self._states) - 1])
            self._states.append(walked)
        return self._states[i]

    def logits(self, i: int) -> np.ndarray:
        """Row i, penalised and masked: what sampling and logprobs read."""
        if self.plain:
            return self.raw[i]
        if i not in self._shaped:
            row = self.penalised(i)
            self._shaped[i] = self.state(i).mask(row) if self._states is not None else row
        return self._shaped[i]

    def distribution(self, i: int, sampling: SamplingParams) -> "ExactRow | MaskedDistribution":
        """Row i as the sampler's distribution: exact, or under a grammar without top-k/top-p/min-p
        (whose masks would change what they keep), read lazily (grammar.MaskedDistribution)."""
        if self._states is None or sampling.filtered or i in self._shaped:
            return ExactRow(distribution(self.logits(i), sampling))
        from .grammar.state import MaskedDistribution

        return MaskedDistribution(self.penalised(i), sampling, self.state(i))

    def best(self, i: int) -> int:
        """The greedy token of row i: for a grammar, only the likeliest tokens' masks are asked."""
        if i not in self._best:
            if i in self._shaped or self._states is None:
                self._best[i] = int(np.argmax(self.logits(i)))
            else:
                self._best[i] = self.state(i).best(self.penalised(i))
        return self._best[i]

    def gumbel(self, i: int, sampling: SamplingParams, position: int) -> int:
        """Row i's token under drafter-invariant sampling, ``position`` being row i's in the answer.
        The path depends only on the sampling and the grammar, never on what was asked before, so
        plain and speculative decoding compute each row's choice alike."""
        if self._states is None or sampling.filtered:
            return gumbel_max(self.logits(i), sampling, position)
        state = self.state(i)
        return gumbel_max(self.penalised(i)[:state.n_vocab], sampling, position, allows=state.allowed_among)

    def reachable(self, i: int) -> bool:
        """Whether row i follows only tokens the grammar allows (always, without a grammar)."""
        if self._states is None:
            return True
        try:
            self.state(i)
        except ValueError:
            return False
        return True

    def shown(self, i: int) -> np.ndarray:
        """Row i for display: shaped where reachable, else only penalised (past a forbidden draft)."""
        return self.logits(i) if self.reachable(i) else self.penalised(i)

    def logprobs(self, tokens: Sequence[int], top: int) -> tuple[list[float], list[list[int]], list[list[float]]]:
        """Log-probability of ``tokens[i]`` in row i at temperature 1 (penalised, masked), and each
        row's ``top`` likeliest tokens with theirs."""
        chosen, top_ids, top_values = [], [], []
        for i, token in enumerate(tokens):
            lp = log_probs(self.logits(i))
            chosen.append(float(lp[token]))
            if top > 0:
                ids = np.argpartition(-lp, min(top, len(lp) - 1))[:top]
                ids = ids[np.isfinite(lp[ids])]
                ids = ids[np.lexsort((ids, -lp[ids]))]
                top_ids.append(ids.tolist())
                top_values.append(lp[ids].astype(float).tolist())
            else:
                top_ids.append([])
                top_values.append([])
        return chosen, top_ids, top_values


def verify(rows: TargetRows | np.ndarray, draft: Draft, sampling: SamplingParams,
           rng: np.random.Generator, position: int | None = None) -> Verdict:
    """``rows``: one per position, after the last context token and after each draft token
    (plain logits, or ``TargetRows`` to shape them by penalties and a grammar). ``position``: the
    first row's position in the sequence (the context's length), which keys drafter-invariant
    sampling's noise."""
    if not isinstance(rows, TargetRows):
        rows = TargetRows(rows, draft.tokens)
    if sampling.greedy:
        return _verify_greedy(rows, draft)
    if sampling.drafter_invariant:
        if position is None:
            raise ValueError("drafter-invariant sampling needs the position of the pass's first row")
        return _verify_greedy(rows, draft, lambda i: rows.gumbel(i, sampling, position + i))
    return _verify_sampled(rows, draft, sampling, rng)


def _verify_greedy(rows: TargetRows, draft: Draft, pick: Callable[[int], int] | None = None) -> Verdict:
    """The longest prefix of the draft equal to the target's own picks, then its pick after it:
    row i's argmax, or (``pick``) its Gumbel-max token."""
    if pick is None:
        pick = rows.raw.argmax(axis=1).__getitem__ if rows.plain else rows.best
    n = 0
    while True:  # each row's pick asked once: a Gumbel-max pick is not free
        token = int(pick(n))
        if n == len(draft.tokens) or token != draft.tokens[n]:
            return Verdict(n, list(draft.tokens[:n]) + [token], [])
        n += 1


def _verify_sampled(rows: TargetRows, draft: Draft, sampling: SamplingParams,
                    rng: np.random.Generator) -> Verdict:
    k = len(draft.tokens)
    accepted: list[int] = []
    p_drafted: list[float] = []
    for i, x in enumerate(draft.tokens):
        p = rows.distribution(i, sampling)  # row by row: a rejection ends the work early
        p_drafted.append(p.prob(x))
        qx = 1.0 if draft.q is None else float(draft.q[i][x])
        if qx > 0 and p.accepts(x, qx, rng.random()):
            accepted.append(x)
            continue
        if draft.q is None:
            fix = p.sample(rng, exclude=x)
        else:
            target = p.exact()
            residual = np.maximum(target - draft.q[i], 0.0)
            # p <= q everywhere only if p == q, where rejection cannot happen; guard rounding.
            fix = sample(residual, rng) if residual.sum() > 0 else sample(target, rng)
        return Verdict(len(accepted), accepted + [fix], p_drafted)
    return Verdict(len(accepted), accepted + [rows.distribution(k, sampling).sample(rng)], p_drafted)


class ExactRow:
    """A row's distribution held whole (what ``MaskedDistribution`` reads lazily)."""

    def __init__(self, p: np.ndarray):
        self.p = p

    def prob(self, x: int) -> float:
        return float(self.p[x])

    def accepts(self, x: int, qx: float, u: float) -> bool:
        return u < min(1.0, float(self.p[x]) / qx)

    def exact(self) -> np.ndarray:
        return self.p

    def sample(self, rng: np.random.Generator, exclude: int | None = None) -> int:
        if exclude is None:
            return sample(self.p, rng)
        rest = self.p.copy()
        rest[exclude] = 0.0
        return sample(rest, rng) if rest.sum() > 0 else sample(self.p, rng)


class Constraints:
    """What shapes the target's distribution within one answer beyond the sampling filters: the
    grammar's state after the answer so far, and the penalties the answer has earned."""

    def __init__(self, grammar: GrammarState | None = None, penalties: Penalties | None = None):
        self.grammar = grammar
        self.penalties = penalties

    @classmethod
    def start(cls, target, grammar, sampling: SamplingParams, context: Sequence[int]) -> "Constraints":
        """For an answer after ``context``: ``grammar`` (an engine.grammar.Grammar, or None) over the
        target's vocabulary, and the penalties ``sampling`` asks for."""
        return cls(grammar.start(target) if grammar is not None else None,
                   Penalties(sampling, context) if sampling.penalized else None)

    def guide(self, choice):
        """The policy's choice, with the grammar state a model drafter masks its draft by."""
        return choice if self.grammar is None else replace(choice, grammar=self.grammar)

    def within(self, draft: Draft) -> Draft:
        """A point-mass draft (lookup, prediction, greedy) cut before its first token the grammar
        forbids: that token would be rejected anyway, and the rest could not follow it. A sampled
        draft is left whole: its q was masked when drawn, and cutting it would bias verification."""
        if self.grammar is None or draft.q is not None or not draft.tokens:
            return draft
        n = self.grammar.allowed_prefix(draft.tokens)
        return draft if n == len(draft.tokens) else replace(draft, tokens=draft.tokens[:n],
                                                              confidence=draft.confidence[:n])

    def rows(self, logits: np.ndarray, draft: Draft) -> TargetRows:
        return TargetRows(logits, draft.tokens, self.grammar, self.penalties)

    def follow(self, rows: TargetRows, emitted: Sequence[int], n_accepted: int) -> None:
        """The answer went on with ``emitted``: keep the grammar state of the accepted drafts (the
        rejected ones' states are dropped with ``rows``), then follow the target's own token."""
        if self.grammar is not None and emitted:
            state = rows.state(n_accepted).clone() if emitted[n_accepted:] else rows.state(n_accepted)
            for token in emitted[n_accepted:]:
                state.accept(token)
            self.grammar = state
        if self.penalties is not None:
            self.penalties.add(emitted)
