"""A grammar held back until the answer writes one of its triggers (llama-server's "lazy grammar"):
free text until then, the grammar from the trigger's first character on. Tool calls use it:
a model may talk, but a call it starts (``<tool_call>`` for Qwen) is written as the grammar of
the offered tools says.

The state is a function of the tokens followed, as a ``GrammarState`` is, so verification under
speculation stays exact. A token may end a trigger and go on past it (``<tool_call>`` is one
token in Qwen's vocabulary, ``{"name"`` is not): it is allowed where what follows the trigger
in it is what the grammar allows there, and the grammar then starts from the trigger's text.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from .state import Follows, Grammar, GrammarState, _lc

_BLANK = b" \t\r\n"


@dataclass(frozen=True)
class Trigger:
    """Text that starts the grammar: anywhere in the answer, or only as its first non-blank text."""
    text: str
    at_start: bool = False


@dataclass(frozen=True)
class LazyGrammar:
    """``grammar`` (which spells each trigger itself) from the first trigger the answer writes on."""
    grammar: Grammar
    triggers: tuple[Trigger, ...]

    def __post_init__(self) -> None:
        if not self.triggers or any(not t.text for t in self.triggers):
            raise ValueError("A lazy grammar needs triggers of some text.")

    def start(self, model) -> "LazyGrammarState":
        """The state at the start of an answer, over ``model``'s vocabulary."""
        vocab = model.llama_vocab
        if not vocab:
            raise ValueError("This model has no llama.cpp vocabulary to apply a grammar with.")
        pieces = vocabulary_pieces(vocab, model.n_vocab)
        fresh = self.grammar.start(model)
        starts = []
        for trigger in self.triggers:  # the grammar after each trigger's own text
            state = fresh.clone()
            for token in model.tokenize(trigger.text, add_special=False, parse_special=True):
                state.accept(token)  # ValueError: the grammar does not begin with its trigger
            starts.append(state)
        shared = _Shared(self, pieces, tuple(starts), lambda text: model.tokenize(text, add_special=False,
                                                                                   parse_special=False))
        return LazyGrammarState(shared, b"", b"", None)


class _Shared:
    """What every state of one answer shares: the vocabulary's pieces, each trigger's grammar
    state, and what was worked out about which tokens end a trigger."""

    def __init__(self, lazy: LazyGrammar, pieces: tuple[bytes, ...], starts: tuple[GrammarState, ...],
                 tokenize: Callable[[str], list[int]]):
        self.pieces = pieces
        self.triggers = [(t.text.encode("utf-8"), t.at_start) for t in lazy.triggers]
        self.starts = starts
        self.tokenize = tokenize
        self.longest = max(len(text) for text, _ in self.triggers)
        # Tokens that can end some trigger: those holding its last byte (the rest never do).
        self.candidates = np.unique(np.concatenate([_holding(pieces, text[-1:]) for text, _ in self.triggers]))
        self.masks: dict[tuple[bytes, bytes | None], np.ndarray] = {}
        self.verdicts: dict[tuple[int, bytes, bytes | None], bool] = {}


class LazyGrammarState(Follows):
    """Before a trigger: free text (``tail``: the answer's end that may begin an anywhere trigger;
    ``head``: the answer's non-blank start while it may still begin an at-start one, None once
    it cannot). After one: the grammar's own state (``inner``)."""

    def __init__(self, shared: _Shared, tail: bytes, head: bytes | None, inner: GrammarState | None):
        self._shared, self._tail, self._head, self.inner = shared, tail, head, inner

    @property
    def n_vocab(self) -> int:
        return len(self._shared.pieces)

    @property
    def triggered(self) -> bool:
        return self.inner is not None

    def begun_trigger(self) -> tuple[bytes, bytes, GrammarState] | None:
        """Where the answer's start has begun an at-start trigger (``{"`` of ``{"name"``): the
        trigger, the rest of it and the grammar's state after it; None otherwise (or once triggered)."""
        if self.inner is not None or not self._head:
            return None
        for (text, at_start), start in zip(self._shared.triggers, self._shared.starts):
            if at_start and len(text) > len(self._head) and text.startswith(self._head):
                return text, text[len(self._head):], start
        return None

    def clone(self) -> "LazyGrammarState":
        return LazyGrammarState(self._shared, self._tail, self._head,
                                self.inner.clone() if self.inner is not None else None)

    def allows(self, token: int) -> bool:
        if self.inner is not None:
            return self.inner.allows(token)
        if not 0 <= token < self.n_vocab:
            return False
        return self._verdict(token)

    def allowed(self) -> np.ndarray:
        if self.inner is not None:
            return self.inner.allowed()
        key = (self._tail, self._head)
        mask = self._shared.masks.get(key)
        if mask is None:
            mask = np.ones(self.n_vocab, dtype=bool)
            for token in self._shared.candidates:
                mask[token] = self._verdict(int(token))
            self._shared.masks[key] = mask
        return mask

    def allowed_among(self, tokens: np.ndarray) -> np.ndarray:
        if self.inner is not None:
            return self.inner.allowed_among(tokens)
        return self.allowed()[tokens]  # (kept per trigger prefix: a few masks an answer)

    def follow(self, token: int) -> None:
        if self.inner is not None:
            self.inner.follow(token)
            return
        ended = self._ends(token)
        if ended is not None:
            which, rest = ended
            inner = self._shared.starts[which].clone()
            for t in self._rest_tokens(rest):
                inner.follow(t)
            self.inner = inner
            return
        piece, shared = self._shared.pieces[token], self._shared
        text = self._tail + piece
        self._tail = next((text[len(text) - n:] for n in range(min(len(text), shared.longest - 1), 0, -1)
                           if any(not start and t.startswith(text[len(text) - n:]) for t, start in shared.triggers)),
                          b"")
        if self._head is not None:
            head = self._head + piece if self._head else piece.lstrip(_BLANK)
            self._head = head if not head or any(start and t.startswith(head) for t, start in shared.triggers) \
                else None

    # -- which tokens end a trigger, and whether what follows it in them is allowed --

    def _ends(self, token: int) -> tuple[int, bytes] | None:
        """(which trigger, the token's bytes after it) when ``token`` ends a trigger here."""
        piece, found = self._shared.pieces[token], None
        for i, (text, at_start) in enumerate(self._shared.triggers):
            if at_start:
                if self._head is None:
                    continue
                head = self._head + piece if self._head else piece.lstrip(_BLANK)
                at = 0 if head.startswith(text) else -1
                rest = head[len(text):]
            else:
                joined = self._tail + piece
                at = joined.find(text)
                rest = joined[at + len(text):]
            if at >= 0 and (found is None or len(rest) > len(found[1])):  # the earliest end wins
                found = (i, rest)
        return found

    def _verdict(self, token: int) -> bool:
        key = (token, self._tail, self._head)
        verdict = self._shared.verdicts.get(key)
        if verdict is None:
            ended = self._ends(token)
            verdict = True
            if ended is not None and ended[1]:
                which, rest = ended
                walk = self._shared.starts[which].clone()
                try:
                    tokens = self._rest_tokens(rest)
                except UnicodeDecodeError:
                    tokens = None
                verdict = tokens is not None and walk.allowed_prefix(tokens) == len(tokens)
            self._shared.verdicts[key] = verdict
        return verdict

    def _rest_tokens(self, rest: bytes) -> list[int]:
        return self._shared.tokenize(rest.decode("utf-8")) if rest else []


@lru_cache(maxsize=4)
def _pieces_of(address: int, n_vocab: int, fingerprint: tuple[bytes, ...]) -> tuple[bytes, ...]:
    vocab, buf = ctypes.c_void_p(address), ctypes.create_string_buffer(256)
    return tuple(_piece(vocab, t, buf) for t in range(n_vocab))


def vocabulary_pieces(vocab, n_vocab: int) -> tuple[bytes, ...]:
    """Every token's bytes as llama.cpp's grammar reads them (special tokens by their text),
    kept for the few vocabularies in use (keyed also by some pieces: an address can be reused)."""
    address = ctypes.cast(vocab, ctypes.c_void_p).value
    probe = tuple(_piece(vocab, t) for t in range(0, n_vocab, max(1, n_vocab // 16)))
    return _pieces_of(address, n_vocab, probe)


def _piece(vocab, token: int, buf=None) -> bytes:
    buf = buf if buf is not None else ctypes.create_string_buffer(256)
    n = _lc().llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = _lc().llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    return buf.raw[:max(n, 0)]


_HOLDING: dict[tuple[int, bytes], tuple[tuple[bytes, ...], np.ndarray]] = {}


def _holding(pieces: tuple[bytes, ...], byte: bytes) -> np.ndarray:
    """The tokens whose piece holds ``byte``, kept per vocabulary (its pieces held with them, so
    an id is never another's)."""
    key = (id(pieces), byte)
    kept = _HOLDING.get(key)
    if kept is None or kept[0] is not pieces:
        if len(_HOLDING) > 64:
            _HOLDING.clear()
        kept = _HOLDING[key] = (pieces, np.array([i for i, p in enumerate(pieces) if byte in p], dtype=np.int64))
    return kept[1]
