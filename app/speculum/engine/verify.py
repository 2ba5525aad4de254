"""Verification: which drafted tokens the target keeps, and the token it adds.

Greedy: the longest prefix equal to the target's argmax, then the target's own next
token. Sampling (Leviathan et al. 2023): accept token x with probability
min(1, p(x)/q(x)); on the first rejection resample from max(0, p - q), normalised;
when all k pass, draw a bonus token from p. The output is distributed exactly as the
target's. A lookup draft is a point mass (q(x) = 1), so it is accepted with p(x).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .drafters import Draft
from .sampling import SamplingParams, distribution, sample


@dataclass
class Verdict:
    n_accepted: int
    tokens: list[int]  # the accepted drafts, then the correction or bonus token
    p_drafted: list[float]  # sampling: target p of each drafted token; greedy: empty


def verify(logits: np.ndarray, draft: Draft, sampling: SamplingParams,
           rng: np.random.Generator) -> Verdict:
    """``logits`` has one row per position: after the last context token and after each draft."""
    if sampling.greedy:
        return _verify_greedy(logits, draft)
    return _verify_sampled(logits, draft, sampling, rng)


def _verify_greedy(logits: np.ndarray, draft: Draft) -> Verdict:
    best = logits.argmax(axis=1)
    n = 0
    k = len(draft.tokens)
    while n < k and best[n] == draft.tokens[n]:
        n += 1
    return Verdict(n, list(draft.tokens[:n]) + [int(best[n])], [])


def _verify_sampled(logits: np.ndarray, draft: Draft, sampling: SamplingParams,
                    rng: np.random.Generator) -> Verdict:
    k = len(draft.tokens)
    accepted: list[int] = []
    p_drafted: list[float] = []
    for i, x in enumerate(draft.tokens):
        p = distribution(logits[i], sampling)  # row by row: a rejection ends the work early
        px = float(p[x])
        p_drafted.append(px)
        qx = 1.0 if draft.q is None else float(draft.q[i][x])
        if qx > 0 and rng.random() < min(1.0, px / qx):
            accepted.append(x)
            continue
        if draft.q is None:
            residual = p.copy()
            residual[x] = 0.0
        else:
            residual = np.maximum(p - draft.q[i], 0.0)
        # p <= q everywhere only if p == q, where rejection cannot happen; guard rounding.
        fix = sample(residual, rng) if residual.sum() > 0 else sample(p, rng)
        return Verdict(len(accepted), accepted + [fix], p_drafted)
    return Verdict(len(accepted), accepted + [sample(distribution(logits[k], sampling), rng)], p_drafted)
