"""Turning logits into a distribution, the same way for the target (p) and the draft (q).

Temperature, then top-k, top-p and min-p, as llama.cpp's common sampler orders them.
Speculative sampling is exact only if p and q are shaped by the same rules, so both
go through ``distribution`` below.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Top-p is exact with a partial sort: the first candidates usually hold the mass.
_TOP_P_CANDIDATES = 256


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Probabilities (float64, sums to 1) over the vocabulary after every filter."""
    x = np.asarray(logits, dtype=np.float64) / max(params.temperature, 1e-6)
    n = x.shape[-1]
    if 0 < params.top_k < n:
        kth = np.partition(x, n - params.top_k)[n - params.top_k]
        x = np.where(x >= kth, x, -np.inf)
    p = np.exp(x - x.max())
    p /= p.sum()
    if params.top_p < 1.0:
        m = min(_TOP_P_CANDIDATES, n)
        pool = np.argpartition(-p, m - 1)[:m] if m < n else np.arange(n)
        order = pool[np.argsort(-p[pool], kind="stable")]
        cum = np.cumsum(p[order])
        if cum[-1] < params.top_p and m < n:  # the mass is spread wide: sort everything
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
        cut = int(np.searchsorted(cum, params.top_p, side="left")) + 1
        mask = np.zeros(n, dtype=bool)
        mask[order[:cut]] = True
        p = np.where(mask, p, 0.0)
    if params.min_p > 0.0:
        p = np.where(p >= params.min_p * p.max(), p, 0.0)
    return p / p.sum()


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token from probabilities ``p`` (inverse CDF on a single uniform)."""
    cum = np.cumsum(p)
    return int(min(np.searchsorted(cum, rng.random() * cum[-1], side="right"), len(p) - 1))


def softmax_at(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """p(token) per row under temperature 1, for display: rows (m, V), tokens (m,)."""
    x = np.asarray(logits, dtype=np.float32)
    top = x.max(axis=1, keepdims=True)
    z = np.exp(x - top).sum(axis=1)
    return np.exp(x[np.arange(len(tokens)), tokens] - top[:, 0]) / z
