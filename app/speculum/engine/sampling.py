"""Turning logits into a distribution, the same way for the target (p) and the draft (q).

Temperature, then top-k, top-p and min-p, as llama.cpp's common sampler orders them.
Speculative sampling is exact only if p and q are shaped by the same rules, so both
go through ``distribution`` below.

With a seed, a token is drawn by the Gumbel-max trick instead (``gumbel_max``): the argmax of
logits/T + g over the tokens the filters keep, with g keyed by (seed, position, token) and not
by a stream of draws. The draft proposes with the same noise, so a drafted token is kept iff it
is the target's own choice, and the answer is plain decoding's for that seed whatever drafted
it (Daliri, Musco & Suresh 2024, "Coupling without Communication and Drafter-Invariant
Speculative Decoding").
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

# Top-p is exact with a partial sort: the first few hundred candidates usually hold the
# mass; wider pools are tried only for flat distributions.
_TOP_P_POOLS = (256, 4096, 32768)


class Coupling(Enum):
    """How a sampled answer's drafted tokens are verified against the target (T > 0)."""

    # Leviathan et al.: accept x with min(1, p(x)/q(x)), else resample from max(0, p - q).
    # The answer's distribution is the target's, but which answer depends on the draws made,
    # so on what was drafted: a seed repeats only with the same drafts.
    REJECTION = "rejection"
    # Gumbel-max with noise keyed by (seed, position, token): every position's token is a
    # function of the seed and the target's row alone, so any drafter gives plain decoding's text.
    GUMBEL = "gumbel"


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from every token the answer holds
    frequency_penalty: float = 0.0  # OpenAI's: subtracted once per time the answer holds it
    repeat_penalty: float = 1.0  # llama.cpp's: divides (multiplies, when negative) recent tokens' logits
    repeat_last_n: int = 64  # how many of the latest context tokens the repeat penalty looks at
    coupling: Coupling | None = None  # None: GUMBEL with a seed, REJECTION without (``drafter_invariant``)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def drafter_invariant(self) -> bool:
        """Whether tokens are drawn by ``gumbel_max`` (the same text for a seed in every mode).
        Without a seed, rejection sampling: it is the optimal coupling of draft and target, and on
        the bench suite (demo pair, T = 0.8) it kept 0.878 of drafted tokens against Gumbel's 0.867
        (docs/notes/issue46-exact.md, "Drafter-invariant sampling at T > 0"): with no seed to hold,
        nothing pays for the difference."""
        if self.greedy:
            return False
        if self.coupling is not None:
            return self.coupling == Coupling.GUMBEL
        return self.seed is not None

    @property
    def filtered(self) -> bool:
        """Whether top-k, top-p or min-p cut the distribution (after a grammar's mask, when one applies)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repeat_penalty != 1.0


class Penalties:
    """The penalties of ``SamplingParams`` for one answer, applied row by row.

    Presence and frequency count the answer's tokens (OpenAI: "how often the token was sampled
    prior to the current position"); the repeat penalty looks at the last ``repeat_last_n``
    tokens of the whole context, prompt included, as llama.cpp's. A verified row is penalised
    by the answer so far plus the draft tokens before it, so a speculative answer is shaped
    exactly as one decoded a token at a time.
    """

    def __init__(self, params: SamplingParams, context: Sequence[int]):
        self.params = params
        self.counts: Counter[int] = Counter()
        n = max(0, params.repeat_last_n)
        self.recent: deque[int] = deque(list(context)[-n:] if n else [], maxlen=n)

    def add(self, tokens: Sequence[int]) -> None:
        """The answer went on with ``tokens``."""
        self.counts.update(int(t) for t in tokens)
        self.recent.extend(int(t) for t in tokens)

    def apply(self, logits: np.ndarray, before: Sequence[int] = ()) -> np.ndarray:
        """A penalised copy of one row of logits, with ``before`` following the answer so far."""
        params = self.params
        out = np.array(logits, dtype=np.float32)
        if params.repeat_penalty != 1.0 and self.recent.maxlen:
            window = (list(self.recent) + [int(t) for t in before])[-self.recent.maxlen:]
            ids = np.fromiter(set(window), dtype=np.int64)
            v = out[ids]
            out[ids] = np.where(v > 0, v / params.repeat_penalty, v * params.repeat_penalty)
        if params.presence_penalty or params.frequency_penalty:
            counts = self.counts + Counter(int(t) for t in before) if len(before) else self.counts
            if counts:
                ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
                times = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
                out[ids] -= times * params.frequency_penalty + params.presence_penalty
        return out


def distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Probabilities (float32, each row sums to 1) over the vocabulary after every filter.

    Takes one row or a (rows, V) matrix; float32 and in-place operations keep a
    150k-token row well under a millisecond.
    """
    p = np.multiply(logits, 1.0 / max(params.temperature, 1e-6), dtype=np.float32)
    n = p.shape[-1]
    if 0 < params.top_k < n:
        kth = np.partition(p, n - params.top_k, axis=-1)[..., n - params.top_k:n - params.top_k + 1]
        p[p < kth] = -np.inf
    p -= p.max(axis=-1, keepdims=True)
    np.exp(p, out=p)
    p /= p.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    if params.top_p < 1.0:
        for row in p.reshape(-1, n):
            mask = np.ones(n, dtype=bool)
            mask[_top_p_set(row, params.top_p)] = False
            row[mask] = 0.0
    if params.min_p > 0.0:
        p[p < params.min_p * p.max(axis=-1, keepdims=True)] = 0.0
    if params.top_p < 1.0 or params.min_p > 0.0:
        p /= p.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    return p


def _top_p_set(p: np.ndarray, top_p: float) -> np.ndarray:
    """The smallest set of most likely tokens whose mass reaches top_p."""
    n = len(p)
    for m in _TOP_P_POOLS + (n,):
        m = min(m, n)
        pool = np.argpartition(-p, m - 1)[:m] if m < n else np.arange(n)
        order = pool[np.argsort(-p[pool], kind="stable")]
        cum = np.cumsum(p[order], dtype=np.float64)
        if cum[-1] >= top_p or m == n:
            cut = int(np.searchsorted(cum, top_p, side="left")) + 1
            return order[:cut]
    raise AssertionError("unreachable")


def log_probs(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities of one row at temperature 1 (float64; -inf stays -inf: a masked token)."""
    x = np.asarray(logits, dtype=np.float64)
    top = x.max()
    return x - (top + np.log(np.exp(x - top).sum()))


_BLOCK = 1024


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token from probabilities ``p``: inverse CDF on one uniform, in two levels
    (block sums, then within the block) so no cumulative sum over the whole vocabulary."""
    n = len(p)
    sums = np.add.reduceat(p, np.arange(0, n, _BLOCK), dtype=np.float64)
    cum = np.cumsum(sums)
    u = rng.random() * cum[-1]
    b = min(int(np.searchsorted(cum, u, side="right")), len(cum) - 1)
    while sums[b] <= 0:  # rounding at the very top end: step back to mass
        b -= 1
    u -= cum[b - 1] if b else 0.0
    block = p[b * _BLOCK:(b + 1) * _BLOCK]
    inner = np.cumsum(block, dtype=np.float64)
    i = min(int(np.searchsorted(inner, u, side="right")), len(block) - 1)
    while block[i] <= 0:
        i -= 1
    return b * _BLOCK + i


# Gumbel noise from a uniform of 24 bits, u = (b + 1/2) / 2^24: never above -log(-log(1 - 2^-25)).
# A token whose scaled logit is further than that below the leader's score cannot win, so
# only the tokens near the top need their noise (on the Qwen demo pair at T = 0.8, a handful of 150k).
_UNIFORM_BITS = 24
GUMBEL_CEILING = -math.log(-math.log1p(-2.0 ** -(_UNIFORM_BITS + 1)))
_ALLOWED_POOLS = (64, 4096, 1 << 62)  # the likeliest tokens a grammar is asked about, widening
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    """splitmix64's finaliser on one Python int (the per-(seed, position) key)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


@lru_cache(maxsize=64)
def _position_key(seed: int, position: int) -> int:
    return _mix64((_mix64((seed & _MASK64) ^ _GOLDEN) + (position & _MASK64) * 0xD1B54A32D192ED03) & _MASK64)


def gumbel_noise(seed: int, position: int, tokens: np.ndarray) -> np.ndarray:
    """Standard Gumbel noise (float64) for ``tokens`` at ``position`` of an answer sampled with
    ``seed``: a counter-based hash (splitmix64) of (seed, position, token), so a token's noise
    is the same whoever asks and in whatever order, and no state is carried between calls."""
    z = np.asarray(tokens, dtype=np.uint64) * np.uint64(_GOLDEN) + np.uint64(_position_key(seed, position))
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)  # (uint64 arrays wrap silently, as the hash wants)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    u = ((z >> np.uint64(64 - _UNIFORM_BITS)).astype(np.float64) + 0.5) * 2.0 ** -_UNIFORM_BITS
    return -np.log(-np.log(u))


def gumbel_max(logits: np.ndarray, params: SamplingParams, position: int,
               allows: Callable[[np.ndarray], np.ndarray] | None = None) -> int:
    """The token at ``position``: argmax of logits/T + g(seed, position, token) over the tokens
    top-k, top-p and min-p keep (as ``distribution`` keeps them), lowest id on a tie. ``allows``:
    which of some tokens a grammar allows (``Follows.allowed_among``), for a row not masked: the
    likeliest tokens are asked first, never the whole vocabulary. The target and the draft call
    this alike; only its result is compared, so it need only be deterministic."""
    scaled = np.multiply(logits, 1.0 / max(params.temperature, 1e-6), dtype=np.float32)
    if params.filtered:
        scaled[distribution(logits, params) == 0] = -np.inf
    seed = 0 if params.seed is None else params.seed
    # A floor: the best perturbed score among the likeliest tokens that may be drawn. No token
    # scaled further than the noise's ceiling below it can reach it.
    known = np.array([int(np.argmax(scaled))])
    for size in _ALLOWED_POOLS:
        if allows is not None:
            m = min(size, len(scaled))
            head = np.argpartition(-scaled, m - 1)[:m] if m < len(scaled) else np.arange(len(scaled))
            known = head[allows(head)]
        known = known[np.isfinite(scaled[known])]
        if len(known) or allows is None or size >= len(scaled):
            break
    if not len(known):
        raise ValueError("No token may be drawn here (every one is filtered out or forbidden).")
    floor = float((scaled[known] + gumbel_noise(seed, position, known)).max()) - GUMBEL_CEILING - 1e-3
    near = np.flatnonzero(scaled >= floor)  # ascending: the first of equal scores is the lowest id
    scores = scaled[near] + gumbel_noise(seed, position, near).astype(np.float32)
    if allows is None:
        return int(near[np.argmax(scores)])
    ranked = near[np.lexsort((near, -scores))]
    for size in (1, *_ALLOWED_POOLS):
        pool = ranked[:size]
        allowed = pool[allows(pool)]
        if len(allowed):
            return int(allowed[0])
    raise AssertionError("unreachable: the floor's own tokens are allowed")


class RowProbs:
    """p(token) per row under temperature 1, for display. Each row's normaliser is computed
    once, however many token lists are looked up in it (emitted and drafted share rows)."""

    def __init__(self, logits: np.ndarray):
        self.x = np.asarray(logits, dtype=np.float32)
        self.top = self.x.max(axis=1)
        self.z = np.exp(self.x - self.top[:, None]).sum(axis=1)

    def at(self, tokens: Sequence[int]) -> list[float]:
        """p(tokens[i]) in row i, for the first len(tokens) rows."""
        rows = np.arange(len(tokens))
        return (np.exp(self.x[rows, np.asarray(tokens)] - self.top[rows]) / self.z[rows]).tolist()
