"""Grammar-constrained decoding: llama.cpp's GBNF grammar sampler, followed token by token.

A ``Grammar`` is GBNF text, checked when it is made (``grammar.schema`` makes one from a JSON
schema or an OpenAI ``response_format``; ``grammar.lazy`` holds one back until a trigger).
``Grammar.start(model)`` gives the ``GrammarState`` at the start of an answer: which tokens may
come next (``allowed``, ``allows``, ``best``) and how it follows a token (``accept``). ``clone``
copies it, so a draft can be walked ahead of the accepted text and the copy dropped where the
target rejects the draft.

A whole-vocabulary mask is the grammar's dear call (about 14 ms for Qwen's 151,936 tokens on
a 2-core CPU): greedy picks ask the likeliest tokens first (``best``), and sampling without
top-k/top-p/min-p reads the masked distribution lazily (``MaskedDistribution``), exactly.

The state is llama.cpp's grammar sampler (``llama_sampler_init_grammar``), applied to a reused
token-data array. llama.cpp aborts the process when a state is made to accept a token it
forbids, so ``accept`` checks first.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Pool sizes for the greedy token: the grammar usually allows one of the model's favourites, so
# the best few are checked before the whole vocabulary.
_POOLS = (32, 1024)

# Sampling without top-k/top-p/min-p, the masked distribution p' = p * allowed / Z is read lazily
# (``MaskedDistribution``): the grammar is asked about the likeliest tokens only, those holding
# all but ``HEAD_TAIL`` of the mass where ``HEAD_SIZES`` allow, and the whole vocabulary only
# when that cannot settle a decision exactly.
HEAD_SIZES = (256, 4096)
HEAD_TAIL = 1e-4
REJECTION_TRIES = 64

MAX_GRAMMAR_CHARS = 1_000_000

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def _lc():
    """llama_cpp, loaded on first use through the gate (engine.native), so importing this module
    loads no llama.cpp (the window's process never does)."""
    from ..llama.native import lc
    return lc


@dataclass(frozen=True)
class Grammar:
    """GBNF text and its root rule; raises ValueError, in plain words, when llama.cpp cannot parse it."""

    gbnf: str
    root: str = "root"

    def __post_init__(self) -> None:
        if not isinstance(self.gbnf, str) or not self.gbnf.strip():
            raise ValueError("The grammar is empty.")
        if len(self.gbnf) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"The grammar is {len(self.gbnf):,} characters; at most {MAX_GRAMMAR_CHARS:,} are taken.")
        if "\0" in self.gbnf or "\0" in self.root:
            raise ValueError("The grammar holds a NUL character.")
        sampler = self._sampler(None)
        _lc().llama_sampler_free(sampler)

    def _sampler(self, vocab):
        lc = _lc()
        from ..llama.native import _log_lines, clear_log, recent_log_error
        clear_log()
        sampler = lc.llama_sampler_init_grammar(vocab, self.gbnf.encode("utf-8", "replace"),
                                                self.root.encode("utf-8", "replace"))
        if not sampler:
            why = recent_log_error() or "\n".join(line.strip() for line in _log_lines if line.strip())
            raise ValueError("The grammar does not parse" + (f": {why}" if why else "."))
        return sampler

    def start(self, model) -> "GrammarState":
        """The state at the start of an answer, over ``model``'s vocabulary (``model.llama_vocab``)."""
        vocab = model.llama_vocab
        if not vocab:
            raise ValueError("This model has no llama.cpp vocabulary to apply a grammar with.")
        return GrammarState(self._sampler(vocab), _Candidates(model.n_vocab))


class _Candidates:
    """Token-data arrays the grammar marks (-inf: forbidden), reused for every call of one answer."""

    def __init__(self, n_vocab: int):
        lc = _lc()
        self.n_vocab = n_vocab
        self._data = (lc.llama_token_data * n_vocab)()
        self.view = np.frombuffer(self._data, dtype=_TOKEN_DATA)
        self._array = lc.llama_token_data_array(
            ctypes.cast(self._data, lc.llama_token_data_p), n_vocab, -1, False)
        self._pointer = ctypes.pointer(self._array)

    def allowed(self, sampler, tokens: np.ndarray | None = None) -> np.ndarray:
        """Which of ``tokens`` (None: the whole vocabulary, as a mask) the grammar allows now."""
        n = self.n_vocab if tokens is None else len(tokens)
        view = self.view[:n]
        view["id"] = np.arange(n) if tokens is None else tokens
        view["logit"] = 0.0
        self._array.size, self._array.selected, self._array.sorted = n, -1, False
        _lc().llama_sampler_apply(sampler, self._pointer)
        return view["logit"] == 0.0


class Follows:
    """What a grammar state answers from its primitives (``allows``, ``allowed``,
    ``allowed_among``, ``clone``, ``follow``): masks, the greedy pick, a draft's allowed prefix
    and a draft's proposal under the grammar. ``GrammarState`` and ``grammar.lazy``'s state."""

    n_vocab: int
    triggered = True  # False: a lazy grammar's state before its trigger (free text)

    def begun_trigger(self) -> "tuple[bytes, bytes, GrammarState] | None":
        """A lazy grammar's trigger the answer has begun (``grammar.lazy``); None here."""
        return None

    def allows(self, token: int) -> bool:
        raise NotImplementedError

    def allowed(self) -> np.ndarray:
        raise NotImplementedError

    def allowed_among(self, tokens: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def clone(self) -> "Follows":
        raise NotImplementedError

    def follow(self, token: int) -> None:
        """Follow ``token``, known to be allowed."""
        raise NotImplementedError

    def accept(self, token: int) -> None:
        """Follow ``token``; ValueError when the grammar forbids it (the state is then unchanged)."""
        if not self.allows(token):
            raise ValueError(f"token {token} is not allowed by the grammar here")
        self.follow(token)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of ``logits`` with -inf on every token the grammar forbids (rows may be longer or
        shorter than this vocabulary: a draft model's; tokens past it are forbidden)."""
        allowed = self.allowed()
        out = np.full(logits.shape, -np.inf, dtype=np.float32)
        n = min(len(logits), len(allowed))
        np.copyto(out[:n], logits[:n], where=allowed[:n])
        return out

    def best(self, logits: np.ndarray) -> int:
        """The argmax of ``mask(logits)``, lowest id on ties, checking the likeliest tokens first."""
        logits = np.asarray(logits[:self.n_vocab], dtype=np.float32)
        top = int(np.argmax(logits))  # the lowest id of the largest: the answer whenever allowed
        if self.allows(top):
            return top
        for size in _POOLS:
            if size >= len(logits):
                break
            threshold = np.partition(logits, len(logits) - size)[len(logits) - size]
            pool = np.flatnonzero(logits >= threshold)  # every token tied at the threshold too
            ok = pool[self.allowed_among(pool)]
            if len(ok):
                return _first_best(ok, logits[ok])
        ok = np.flatnonzero(self.allowed())
        if not len(ok):
            raise ValueError("The grammar allows no token here.")
        return _first_best(ok, logits[ok])

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows in turn (a draft stops at the first it forbids)."""
        if not tokens:
            return 0
        walk = self.clone()
        for n, token in enumerate(tokens):
            if not walk.allows(token):
                return n
            if n + 1 < len(tokens):
                walk.follow(token)
        return len(tokens)

    def masked_head(self, p: np.ndarray) -> np.ndarray | None:
        """A draft's proposal under the grammar without a whole-vocabulary mask: ``p`` kept on its
        likeliest ``HEAD_SIZES[0]`` tokens the grammar allows, renormalised (None when it allows
        none of them). Verification is exact for any proposal it is handed, this one included."""
        m = min(HEAD_SIZES[0], len(p))
        head = np.argpartition(-p, m - 1)[:m] if m < len(p) else np.arange(len(p))
        head = head[head < self.n_vocab]
        ok = head[self.allowed_among(head)]
        mass = float(p[ok].sum(dtype=np.float64)) if len(ok) else 0.0
        if mass <= 0.0:
            return None
        out = np.zeros_like(p)
        out[ok] = p[ok] / mass
        return out



class GrammarState(Follows):
    """Where an answer stands in its grammar: which tokens may come next, and following one."""

    _sampler = None  # (until __init__ sets it: __del__ runs for a half-made state too)

    def __init__(self, sampler, candidates: _Candidates):
        self._free = _lc().llama_sampler_free  # held: at interpreter exit no import works
        self._sampler = sampler
        self._candidates = candidates
        self._one = np.zeros(1, np.int32)

    def __del__(self) -> None:
        if self._sampler:
            self._free(self._sampler)
            self._sampler = None

    @property
    def n_vocab(self) -> int:
        return self._candidates.n_vocab

    def clone(self) -> "GrammarState":
        return GrammarState(_lc().llama_sampler_clone(self._sampler), self._candidates)

    def allows(self, token: int) -> bool:
        if not 0 <= token < self.n_vocab:
            return False
        self._one[0] = token
        return bool(self._candidates.allowed(self._sampler, self._one)[0])

    def follow(self, token: int) -> None:
        _lc().llama_sampler_accept(self._sampler, int(token))

    def allowed(self) -> np.ndarray:
        """A mask over the vocabulary: True where the token may come next."""
        return self._candidates.allowed(self._sampler)

    def allowed_among(self, tokens: np.ndarray) -> np.ndarray:
        """Which of ``tokens`` (ids within the vocabulary) may come next: the cost of asking grows
        with how many are asked."""
        return self._candidates.allowed(self._sampler, tokens.astype(np.int32))


class MaskedDistribution:
    """One row's grammar-masked distribution p' = p * allowed / Z, with ``p`` a temperature
    softmax (no top-k/top-p/min-p), read without a whole-vocabulary mask where it can be exactly.

    Z, the allowed mass, is bounded by asking the grammar about the likeliest tokens only: those
    allowed give Z's lower bound, the untested tail's mass its upper. An acceptance test
    ``u < p'(x) / q(x)`` is decided from the bounds unless ``u`` falls between them, and sampling
    is rejection sampling from ``p`` (draw, keep an allowed token); only then, or after
    ``REJECTION_TRIES`` draws, is the whole mask computed. Every decision is the exact one."""

    def __init__(self, logits: np.ndarray, sampling, state: GrammarState):
        from ..sampling import distribution

        self.logits, self.sampling, self.state = logits, sampling, state
        self.p = distribution(logits, sampling)
        self._exact: np.ndarray | None = None
        self._bounds: tuple[float, float] | None = None

    def bounds(self) -> tuple[float, float]:
        """(lower, upper) bound of the allowed mass Z."""
        if self._exact is not None:
            return self._z, self._z
        if self._bounds is None:
            p, total = self.p, float(self.p.sum(dtype=np.float64))
            for size in HEAD_SIZES:
                m = min(size, len(p))
                head = np.argpartition(-p, m - 1)[:m] if m < len(p) else np.arange(len(p))
                tail = max(0.0, total - float(p[head].sum(dtype=np.float64)))
                if tail <= HEAD_TAIL * total:
                    break
            inside = head[head < self.state.n_vocab]
            allowed = self.state.allowed_among(inside)
            ok = inside[allowed]
            self._forbidden = np.concatenate([inside[~allowed], head[head >= self.state.n_vocab]])
            self._known = set(ok.tolist())
            low = float(p[ok].sum(dtype=np.float64))
            self._bounds = (low, low + tail * (1 + 1e-9) + 1e-30)
        return self._bounds

    def exact(self) -> np.ndarray:
        """p' itself (the whole mask: asked only when needed)."""
        if self._exact is None:
            from ..sampling import distribution

            masked = self.state.mask(self.logits)
            self._z = float(self.p[np.isfinite(masked)].sum(dtype=np.float64))
            self._exact = distribution(masked, self.sampling)  # as the whole-mask path defines it
        return self._exact

    def prob(self, x: int) -> float:
        """p'(x): exact once the mask is known, else from Z's lower bound (for display)."""
        if self._exact is not None:
            return float(self._exact[x])
        if not self.state.allows(x):
            return 0.0
        low = self.bounds()[0]
        return float(self.p[x]) / low if low > 0 else float(self.exact()[x])

    def accepts(self, x: int, qx: float, u: float) -> bool:
        """Exactly ``u < min(1, p'(x) / qx)``."""
        if self._exact is not None:
            return u < min(1.0, float(self._exact[x]) / qx)
        if not self.state.allows(x):
            return False
        low, high = self.bounds()
        px = float(self.p[x])
        if low > 0:
            if u < min(1.0, px / (high * qx)):
                return True
            if u >= min(1.0, px / (low * qx)):
                return False
        return u < min(1.0, float(self.exact()[x]) / qx)

    def sample(self, rng: np.random.Generator, exclude: int | None = None) -> int:
        """A token from p' (with ``exclude`` taken out), by rejection: drawn from p without the
        likeliest tokens known forbidden (every allowed token keeps its p), kept when allowed."""
        from ..sampling import sample

        if self._exact is None:
            self.bounds()
            proposal = self.p.copy()
            proposal[self._forbidden] = 0.0
            if exclude is not None:
                proposal[exclude] = 0.0
            if proposal.sum(dtype=np.float64) > 0:
                for _ in range(REJECTION_TRIES):
                    y = sample(proposal, rng)
                    if y in self._known or self.state.allows(y):
                        return y
        p = self.exact()
        if exclude is None:
            return sample(p, rng)
        rest = p.copy()
        rest[exclude] = 0.0
        return sample(rest, rng) if rest.sum() > 0 else sample(p, rng)


def _first_best(ids: np.ndarray, values: np.ndarray) -> int:
    return int(ids[values == values.max()].min())
