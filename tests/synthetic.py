"""A deterministic synthetic language model behind the engine's backend interface.

Logits depend only on the last ``order`` tokens (a seeded hash), so speculative and
plain decoding can be compared exactly, with no llama.cpp numerics involved. A
``clock`` lets policy tests charge a cost per pass without real time passing.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from speculum.engine.backend import Backend

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


class SyntheticModel(Backend):
    """Implements ``Backend``; the capabilities llama.cpp alone has (MTP, an assistant, a file)
    keep the interface's defaults."""

    def __init__(self, n_vocab: int = 12, seed: int = 0, order: int = 2, sharpness: float = 3.0,
                 n_ctx: int = 4096, eog: int | None = None,
                 pass_cost: Callable[[int], float] | None = None, clock: "FakeClock | None" = None):
        self.n_vocab = n_vocab
        self.seed = seed
        self.order = order
        self.sharpness = sharpness
        self.n_ctx = n_ctx
        self.n_batch = 512
        self.eog = eog
        self.tokens: list[int] = []
        self.pass_cost = pass_cost
        self.clock = clock
        self.passes = 0
        self.decoded_tokens = 0

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def logits_after(self, history: Sequence[int]) -> np.ndarray:
        key = tuple(history[-self.order:])
        rng = np.random.default_rng([self.seed, *(t + 1 for t in key)])
        return (rng.standard_normal(self.n_vocab) * self.sharpness).astype(np.float32)

    def decode(self, tokens: Sequence[int], rows: Sequence[int] | None = None) -> np.ndarray:
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise RuntimeError("synthetic context overflow")
        rows = sorted(set(rows)) if rows is not None else [len(tokens) - 1]
        out = np.empty((len(rows), self.n_vocab), dtype=np.float32)
        start = len(self.tokens)
        self.tokens.extend(tokens)
        for j, r in enumerate(rows):
            out[j] = self.logits_after(self.tokens[: start + r + 1])
        self.passes += 1
        self.decoded_tokens += len(tokens)
        if self.clock is not None and self.pass_cost is not None:
            self.clock.advance(self.pass_cost(len(tokens)))
        return out

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        return self.decode(tokens)[0]

    def trim(self, n: int) -> int:
        del self.tokens[n:]
        return len(self.tokens)

    def is_eog(self, token: int) -> bool:
        return token == self.eog

    def token_bytes(self, token: int) -> bytes:
        return ALPHABET[token % len(ALPHABET)].encode()

    def token_text(self, token: int, special: bool = True) -> str:
        return self.token_bytes(token).decode()

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return [ALPHABET.index(c) % self.n_vocab for c in text if c in ALPHABET]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def noisy_copy(model: SyntheticModel, seed: int, noise: float) -> SyntheticModel:
    """A draft model that agrees with ``model`` more or less, depending on ``noise``."""

    class Noisy(SyntheticModel):
        def logits_after(self, history: Sequence[int]) -> np.ndarray:
            base = model.logits_after(history)
            key = tuple(history[-self.order:])
            rng = np.random.default_rng([seed, 99, *(t + 1 for t in key)])
            return base + (rng.standard_normal(self.n_vocab) * noise).astype(np.float32)

    return Noisy(n_vocab=model.n_vocab, seed=seed, order=model.order, n_ctx=model.n_ctx, eog=model.eog)
