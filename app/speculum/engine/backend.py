"""The interface the decoder needs from a model: what ``LlamaModel`` offers.

A deterministic synthetic model implements the same interface in the tests, so the
exactness of the algorithm is proven apart from llama.cpp's numerics.
"""

from __future__ import annotations

import codecs
import contextlib
from dataclasses import dataclass
import os
import threading
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .promptcache import MIN_GAIN, MIN_SAVED, PromptCache
from .vocabulary import Device, Role


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def load_average() -> tuple[float, float, float] | None:
    """The system's 1-, 5- and 15-minute load averages, or None where it keeps none (Windows):
    what else was running while something was timed."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def one_minute_load(load: tuple[float, float, float] | None) -> str:
    """A load average as benchmarks print it: its 1-minute figure, or "unknown"."""
    return f"{load[0]:.1f}" if load else "unknown"


# What a loaded model is, as the window shows it. Defined here, not in llama.py: the window
# receives it from the engine process, and unpickling must not load llama.cpp there.
@dataclass(frozen=True)
class ModelFacts:
    path: str
    name: str
    architecture: str
    n_parameters: int
    quantization: str
    file_size: int
    vocab_size: int
    context_length: int  # the model's training context
    n_ctx: int  # this context's size
    backend: str  # where it runs, as shown: CPU, Metal, CUDA, "RPC host:port + CUDA" (made from ``device``)
    n_gpu_layers: int
    n_threads: int = 0  # CPU threads decoding
    nextn_layers: int = 0  # multi-token prediction layers loaded: the model drafts for itself
    assistant: str = ""  # the name of the Gemma 4 assistant drafting on this model's KV cache
    device: Device = Device.CPU  # where it runs: what code routes on (never the label above)


class DecodeAborted(Exception):
    """A decode cut short because its request was stopped (``Backend.abortable``): nothing of it
    is in the model's cache, and ``n_past`` says what is."""


class Detokenizer:
    """Turns a stream of token pieces into text, holding back a partial UTF-8 character."""

    def __init__(self, model: TokenPieces):
        self._model = model
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        return self._utf8.decode(self._model.token_bytes(token))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class TokenPieces:
    """Mixin: the bytes of each token, cached (the vocabulary never changes)."""

    def token_bytes(self, token: int) -> bytes:  # pragma: no cover - overridden
        raise NotImplementedError

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def detokenizer(self) -> Detokenizer:
        return Detokenizer(self)


class Backend(TokenPieces):
    """Everything the engine asks of a model: ``LlamaModel`` over llama.cpp, and the tests'
    deterministic synthetic model. A capability a backend may lack (MTP heads, an assistant,
    a recurrent state, a file on disk) has a default here that says it is absent, so the
    engine asks plainly and never probes."""

    n_vocab: int
    n_ctx: int
    n_batch: int  # most tokens one decode call takes
    n_past: int  # tokens in the KV cache
    n_threads: int = 0  # CPU threads decoding (0: not on a CPU thread pool of its own)
    path: Path | None = None  # the GGUF it was loaded from (None: not a file, as in the tests)
    facts: ModelFacts | None = None  # what the window shows of it (None: nothing to show)
    bos: int = -1  # beginning-of-sequence token (-1: none)
    eos: int = -1
    add_bos: bool = False  # whether a raw text prompt starts with BOS
    chat_template: str | None = None
    # Most tokens ``trim`` can drop at once without starting over (None: any number): a
    # recurrent state rolls back only within llama.cpp's snapshots.
    max_rollback: int | None = None
    has_mtp: bool = False  # whether an MTP head can draft for it (open_mtp_head)
    mtp_unavailable: str = ""  # why MTP mode cannot run although the file has NextN layers
    assistant_path: Path | None = None  # a Gemma 4 assistant attached to draft on its cache
    saves_state: bool = False  # whether save_state / load_state work (llama.cpp's sequence state)
    flash_attn: bool | None = None  # flash attention in effect (None: llama.cpp's choice)
    output_here: bool = False  # the output layer on this machine, the other layers on RPC workers
    llama_vocab = None  # llama.cpp's vocabulary handle, for a grammar (None: no llama.cpp vocabulary)

    def decode(self, tokens: Sequence[int], rows: Sequence[int] | None = None) -> np.ndarray:
        raise NotImplementedError

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        raise NotImplementedError

    def trim(self, n: int) -> int | None:  # tokens kept: fewer than n when it had to start over
        raise NotImplementedError

    def reset(self) -> None:
        self.trim(0)

    def is_eog(self, token: int) -> bool:
        raise NotImplementedError

    def token_text(self, token: int, special: bool = True) -> str:
        raise NotImplementedError

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        raise NotImplementedError

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        raise NotImplementedError

    def open_mtp_head(self):
        """The MTP context drafting for this model (only where ``has_mtp``)."""
        raise NotImplementedError(f"{type(self).__name__} has no MTP head.")

    def listen_to_decodes(self, listener: Callable[[Sequence[int], int, np.ndarray], None]) -> None:
        """Call ``listener(tokens, pos, hidden)`` after each decode (only where ``has_mtp``)."""
        raise NotImplementedError(f"{type(self).__name__} has no NextN hidden states.")

    def save_state(self):
        """A copy of the sequence's state for ``load_state`` (only where ``saves_state``)."""
        raise NotImplementedError

    def load_state(self, state, n_tokens: int) -> bool:
        """Put back a state ``save_state`` made when the sequence held ``n_tokens`` tokens."""
        raise NotImplementedError

    def abortable(self, stop) -> contextlib.AbstractContextManager:
        """Inside, ``stop`` (None: none) being set cuts the decode running short
        (``DecodeAborted``) instead of letting it finish; by default decodes always finish."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Give back what it holds (native memory); nothing by default."""


class CachedSequence:
    """A backend plus the tokens in its KV cache, so a new request reuses the common prefix.

    A chat's second turn shares the first turn's tokens: only the new ones are decoded. With
    a prompt cache (``promptcache.PromptCache``), a new prompt also resumes from the states of
    earlier sequences this one held (``resume``).
    """

    def __init__(self, model: Backend, cache: PromptCache | None = None, owner: Role = Role.TARGET):
        self.model = model
        self.tokens: list[int] = []
        if model.n_past:  # what another sequence left (a new Decoder on loaded models): not this one's
            model.reset()
        # Saving needs the model's state calls (llama.cpp's); a synthetic model has none. Nor is
        # a model with an MTP head cached: the head's own cache holds pairs built from the
        # target's hidden states, which a saved state does not carry.
        self.cache = cache if model.saves_state and not model.has_mtp else None
        self.owner = owner  # whose saved states are this sequence's in the shared cache
        # (position, logits) of the latest prompt's last token, read with that prompt: a prompt
        # sent again gets its first token from it, with no pass, and the very token it got before.
        self.row: tuple[int, np.ndarray] | None = None
        self._saved_memo: tuple | None = None  # reusable's: (cache version, context length, its last token, saved)

    def common(self, context: Sequence[int]) -> int:
        """How many leading tokens of ``context`` the cache already holds."""
        limit = min(len(self.tokens), len(context))
        context = list(context[:limit])
        if self.tokens[:limit] == context:  # the usual case, at C speed
            return limit
        lo, hi = 0, limit - 1  # the prefix is shorter than limit: binary search on slice compares
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.tokens[:mid] == context[:mid]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def sync(self, context: Sequence[int]) -> int:
        """Trim the cache to its longest common prefix with ``context``; return that length."""
        n = self.common(context)
        if n < len(self.tokens):
            n = self._trim(n)
        return n

    def reusable(self, context: Sequence[int]) -> int:
        """About how many leading tokens of ``context`` ``resume`` would find, live or saved: for
        cost estimates, asked every cycle. The saved part is worked out again only for a new
        prompt (not an extension of the last one asked about) or a changed cache."""
        n = self.common(context)
        if self.cache is None:
            return n
        memo = self._saved_memo
        if (memo is None or memo[0] != self.cache.version or len(context) < memo[1]
                or context[memo[1] - 1] != memo[2] or memo[3] >= memo[1]):
            saved = self.cache.best(self.owner, context, exact=self._exact)[1]
            memo = self._saved_memo = (self.cache.version, len(context), context[-1] if context else None, saved)
        return max(n, memo[3])

    def keep(self) -> None:
        """Save the live state in the prompt cache now, between requests, so that the next
        prompt's ``resume`` finds it held and need not copy it while a user waits."""
        if self.cache is not None and len(self.tokens) >= MIN_SAVED:
            self.cache.save(self.owner, self.tokens, self.model, self.row)

    def resume(self, context: Sequence[int]) -> int:
        """``sync`` at a new prompt: what the cache would lose is saved first, and a saved state
        sharing more of ``context`` than the live one is put back. Returns the prefix length held."""
        n = self.common(context)
        cache = self.cache
        if cache is not None:
            if len(self.tokens) - n >= MIN_SAVED:
                cache.save(self.owner, self.tokens, self.model, self.row)
            saved, usable = cache.best(self.owner, context, exact=self._exact)
            if saved is not None and usable >= n + MIN_GAIN:
                if cache.restore(saved, self.model):
                    self.tokens, self.row = [int(t) for t in saved.tokens], saved.row
                    n = usable
                else:  # refused: the model's sequence is empty now
                    self.tokens, self.row, n = [], None, 0
        if n < len(self.tokens):
            n = self._trim(n)
        return n

    @property
    def _exact(self) -> bool:
        """A recurrent state cannot be cut back: only a whole saved state serves."""
        return self.model.max_rollback is not None

    @property
    def keeps_rows(self) -> bool:
        """Whether a prompt's last row serves it again: not for a recurrent state (it cannot be
        cut back to the prompt) nor beside an MTP head (which pairs each token with the target's
        hidden state from the pass that read it)."""
        return not self._exact and not self.model.has_mtp

    def last_row(self, context: Sequence[int]) -> np.ndarray | None:
        """The row of logits read with ``context``'s last token, when this sequence holds all of
        ``context`` and read its last token as a prompt's last (a copy); else None."""
        if (self.row is None or self.row[0] != len(context) - 1 or not self.keeps_rows
                or self.common(context) < len(context)):
            return None
        return self.row[1].copy()

    def _trim(self, n: int) -> int:
        kept = self.model.trim(n)
        n = n if kept is None else min(n, kept)  # a recurrent model may have started over
        del self.tokens[n:]
        if self.row is not None and self.row[0] >= n:
            self.row = None
        return n

    def feed(self, tokens: Sequence[int], stop: threading.Event | None = None,
             on_chunk: Callable[[int, int], None] | None = None, chunk: int | None = None,
             last_row: bool = False) -> np.ndarray | None:
        """Decode tokens (prompt prefill). ``stop`` being set ends it: the chunk in flight is cut
        short where the model can (``Backend.abortable``), and what it had read of that chunk
        is forgotten. ``last_row``: the last token's row of logits (a copy) is returned, None
        when stopped; otherwise no logits are asked for.

        ``on_chunk(read, chunk_size)`` after each chunk; ``chunk``: tokens per decode
        (at most the model's batch)."""
        if not tokens:
            return None
        step, row = min(chunk or self.model.n_batch, self.model.n_batch), None
        with self.model.abortable(stop):
            for start in range(0, len(tokens), step):
                if stop is not None and stop.is_set():
                    return None
                part = tokens[start:start + step]
                final = last_row and start + step >= len(tokens)
                try:
                    logits = self.model.decode(part, rows=(len(part) - 1,) if final else ())
                except DecodeAborted:
                    del self.tokens[self.model.n_past:]  # (a recurrent state may have started over)
                    return None
                self.tokens.extend(part)
                if final:
                    row = np.array(logits)  # the model's buffer is the next decode's
                    self.row = (len(self.tokens) - 1, row)
                    row = row.copy()  # (the caller's to shape)
                if on_chunk is not None:
                    on_chunk(start + len(part), len(part))
        return row

    def decode(self, tokens: Sequence[int], rows: Sequence[int] | None = None) -> np.ndarray:
        logits = self.model.decode(tokens, rows)
        self.tokens.extend(tokens)
        return logits

    def trim(self, n: int) -> None:
        if n < len(self.tokens):
            self._trim(n)
