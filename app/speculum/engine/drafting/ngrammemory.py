"""The n-gram memory: what this machine has written and read before, as text to draft from.

Prompt lookup copies from the context at hand; the memory copies from earlier ones: the
answer being regenerated, the document a new conversation quotes again, the boilerplate a
client resends. Each generation's context (prompt and answer) is remembered under its origin
(a conversation's id, "api", "cli"); a conversation's next turn replaces its previous one,
which it extends. One file per vocabulary under ``data_dir()/ngram-memory``, capped in
tokens (oldest contexts go first); forgetting an origin (a deleted conversation) or clearing
the whole memory rewrites or removes the files.

Lookup is by hashed n-grams in sorted arrays (numpy): the context's last LONG tokens, else
its last SHORT ones; among their latest occurrences, the one whose match reaches furthest
back wins, and what followed it is the draft.

The file is outside input: any damage (a bad header, counts that do not add up, a token the
vocabulary lacks) sets it aside and the memory starts empty.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ... import paths

MAGIC = b"SPECNGM1"
HEADER = struct.Struct("<8sII")  # magic, vocabulary size, JSON length
DEFAULT_TOKENS = 1 << 18  # 1 MiB on disk; the index in memory is about 12 bytes a token per level
LEVELS = (16, 4)  # n-gram lengths looked up, the most telling first
CANDIDATES = 8  # latest occurrences of an n-gram weighed per level
MAX_MATCH = 32  # how far back a match is measured among candidates; one that reaches it is
# measured on to the context's start (``_agreement``): whether this whole context was seen before
MAX_ORIGIN = 100  # characters of an origin's name
MAX_FILE = 256 << 20  # a file larger than this is not read (a memory of 64 million tokens)
_MULT = np.uint64(0x9E3779B97F4A7C15)


def folder() -> Path:
    return paths.data_dir() / "ngram-memory"


def vocabulary_id(model) -> str:
    """A name for the model's vocabulary: the same for a target and its draft model."""
    n = model.n_vocab
    digest = hashlib.sha1(str(n).encode())
    for token in [*range(0, n, max(1, n // 512)), *range(max(0, n - 64), n)]:
        digest.update(model.token_bytes(token) + b"\x00")
    return digest.hexdigest()[:16]


def _hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """The hash of every n-gram of ``tokens``, by the position of its last token (len - n + 1)."""
    t = tokens.astype(np.uint64)
    h = np.zeros(len(tokens) - n + 1, np.uint64)
    for i in range(n):
        h = h * _MULT + t[i:len(tokens) - n + 1 + i]
    return h


def _hash(tokens: Sequence[int]) -> int:
    """``_hashes`` of one n-gram, in plain integers (a few numpy calls cost more, per cycle)."""
    h = 0
    for t in tokens:
        h = (h * _MULT_INT + int(t)) & _MASK
    return h


_MULT_INT, _MASK = int(_MULT), (1 << 64) - 1


@dataclass(eq=False)
class _Text:
    origin: str
    base: int  # its first token's place in the memory's positions (never reused)
    tokens: np.ndarray  # int32


class NgramMemory:
    """Contexts by origin, oldest first, within ``max_tokens``; kept in ``path`` when given."""

    def __init__(self, n_vocab: int, path: Path | None = None, max_tokens: int = DEFAULT_TOKENS):
        self.n_vocab = n_vocab
        self.path = path
        self.max_tokens = max(0, int(max_tokens))
        self._texts: list[_Text] = []
        self._bases: list[int] = []  # each text's base, in order
        self._next_base = 0
        self._index = {n: (np.zeros(0, np.uint64), np.zeros(0, np.int64)) for n in LEVELS}
        self._seen_file: tuple | None = None  # the file as last read or written (inode, mtime, size)
        self._last: tuple[Sequence[int], tuple, tuple[int, int, int, _Text | None]] | None = None
        self.problem = ""  # why a damaged file was set aside, in plain words
        if path is not None:
            self._read()

    @classmethod
    def for_model(cls, model, max_tokens: int = DEFAULT_TOKENS, where: Path | None = None) -> "NgramMemory":
        return cls(model.n_vocab, (where or folder()) / f"{vocabulary_id(model)}.bin", max_tokens)

    @property
    def n_tokens(self) -> int:
        return sum(len(t.tokens) for t in self._texts)

    def origins(self) -> set[str]:
        return {t.origin for t in self._texts}

    # -- drafting ----------------------------------------------------------------------------

    def match(self, context: Sequence[int]) -> tuple[int, int, int]:
        """(end, length, available): the place in the memory whose preceding ``length`` tokens
        are the end of ``context``, and how many tokens follow it there; (-1, 0, 0) for none."""
        if len(context) < LEVELS[-1] or not self._texts:
            return -1, 0, 0
        # The policy asks, then the drafter, of the same list: held here (so its id is never
        # another's), and the end that cycles change, with the length, tells it apart.
        key = (len(context), *context[-MAX_MATCH:])
        if self._last is not None and self._last[0] is context and self._last[1] == key:
            return self._last[2][:3]
        found = self._find(context)
        self._last = (context, key, found)
        return found[:3]

    def copy(self, end: int, k: int) -> list[int]:
        """Up to k tokens that follow position ``end`` (from ``match``)."""
        text = self._text_at(end)
        if text is None:
            return []
        at = end - text.base + 1
        return [int(t) for t in text.tokens[at:at + k]]

    def _find(self, context: Sequence[int]) -> tuple[int, int, int, _Text | None]:
        tail = np.asarray(context[-MAX_MATCH:], dtype=np.int64)[::-1]
        best = (-1, 0, 0, None)
        for n in LEVELS:
            if len(context) < n:
                continue
            keys, ends = self._index[n]
            h = np.uint64(_hash(context[-n:]))
            lo, hi = np.searchsorted(keys, h, "left"), np.searchsorted(keys, h, "right")
            for end in ends[max(lo, hi - CANDIDATES):hi][::-1]:  # latest first
                text = self._text_at(int(end))
                if text is None:
                    continue
                at = int(end) - text.base
                back = text.tokens[max(0, at + 1 - MAX_MATCH):at + 1][::-1]
                m = min(len(back), len(tail))
                differ = np.flatnonzero(back[:m] != tail[:m])
                length = int(differ[0]) if len(differ) else m
                if length >= n and length > best[1] and at + 1 < len(text.tokens):
                    best = (int(end), length, len(text.tokens) - at - 1, text)
            if best[1] >= n:
                break
        if best[1] >= MAX_MATCH:
            best = (best[0], self._agreement(context, best[3], best[0]), best[2], best[3])
        return best

    @staticmethod
    def _agreement(context: Sequence[int], text: _Text, end: int) -> int:
        """How many tokens back from ``end`` ``text`` agrees with the end of ``context``: all of
        the context when it is the start of an earlier text again (a prompt sent again, an
        answer regenerated). Once a cycle at most, and only past a MAX_MATCH agreement: 60 us
        for a 4,096-token context."""
        at = end - text.base
        n = min(len(context), at + 1)
        here = np.asarray(context[len(context) - n:], dtype=np.int32)[::-1]
        differ = np.flatnonzero(here != text.tokens[at + 1 - n:at + 1][::-1])
        return int(differ[0]) if len(differ) else n

    def _text_at(self, pos: int) -> _Text | None:
        i = bisect_right(self._bases, pos) - 1
        if i < 0:
            return None
        text = self._texts[i]
        return text if pos < text.base + len(text.tokens) else None

    # -- remembering and forgetting ----------------------------------------------------------

    def remember(self, tokens: Sequence[int], origin: str) -> None:
        """Keep ``tokens`` (a prompt and its answer) under ``origin``; an earlier context of the
        same origin that these tokens extend is replaced. Written to the file at once."""
        if self.max_tokens <= 0 or len(tokens) < LEVELS[-1] + 1:
            return
        self.refresh()
        held = np.asarray(tokens[-self.max_tokens:], dtype=np.int32)
        origin = origin[:MAX_ORIGIN]
        dropped = []
        for text in self._texts:
            if text.origin != origin:
                continue
            n = min(len(text.tokens), len(held))
            if len(text.tokens) >= len(held) and np.array_equal(text.tokens[:n], held[:n]):
                return  # already held (a stopped answer, written again)
            if len(text.tokens) <= len(held) and np.array_equal(text.tokens, held[:len(text.tokens)]):
                dropped.append(text)
        total = self.n_tokens - sum(len(t.tokens) for t in dropped) + len(held)
        for text in self._texts:  # oldest first, to make room
            if total <= self.max_tokens:
                break
            if text not in dropped:
                dropped.append(text)
                total -= len(text.tokens)
        self._drop(dropped)
        self._add(_Text(origin, self._next_base, held))
        self._write()

    def forget(self, origin: str) -> None:
        """Drop everything remembered under ``origin``."""
        self.refresh()
        gone = [t for t in self._texts if t.origin == origin[:MAX_ORIGIN]]
        if gone:
            self._drop(gone)
            self._write()

    def clear(self) -> None:
        self._drop(list(self._texts))
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self._seen_file = None

    def refresh(self) -> None:
        """Read the file again if another process changed it (the window forgot a conversation)."""
        if self.path is not None and _stamp(self.path) != self._seen_file:
            self._drop(list(self._texts))
            self._read()

    def _add(self, text: _Text) -> None:
        self._texts.append(text)
        self._bases.append(text.base)
        self._next_base = text.base + len(text.tokens) + 1
        for n in LEVELS:
            if len(text.tokens) < n:
                continue
            keys, ends = self._index[n]
            new_keys = _hashes(text.tokens, n)
            new_ends = np.arange(text.base + n - 1, text.base + len(text.tokens), dtype=np.int64)
            keys, ends = np.concatenate([keys, new_keys]), np.concatenate([ends, new_ends])
            order = np.argsort(keys, kind="stable")  # equal n-grams stay in position order: latest last
            self._index[n] = (keys[order], ends[order])
        self._last = None

    def _drop(self, texts: list[_Text]) -> None:
        if not texts:
            return
        gone = set(map(id, texts))
        kept = [t for t in self._texts if id(t) not in gone]
        bases = np.array([t.base for t in self._texts], np.int64)
        alive = np.array([id(t) not in gone for t in self._texts])
        for n in LEVELS:
            keys, ends = self._index[n]
            if len(ends):
                keep = alive[np.searchsorted(bases, ends, "right") - 1]
                self._index[n] = (keys[keep], ends[keep])
        self._texts = kept
        self._bases = [t.base for t in kept]
        self._last = None

    # -- the file ----------------------------------------------------------------------------

    def _read(self) -> None:
        path = self.path
        try:
            if path.stat().st_size > MAX_FILE:
                self._damaged("far larger than any memory is kept")
                return
            data = path.read_bytes()
        except FileNotFoundError:
            self._seen_file = None
            return
        except OSError as exc:
            self._damaged(f"could not be read ({exc.__class__.__name__})")
            return
        try:
            texts = _parse(data, self.n_vocab)
        except ValueError as exc:
            self._damaged(str(exc))
            return
        room, kept = self.max_tokens, []
        for origin, tokens in reversed(texts):  # the newest, within the cap (it may have been lowered)
            if len(tokens) > room:
                break
            room -= len(tokens)
            kept.append((origin, tokens))
        for origin, tokens in reversed(kept):
            self._add(_Text(origin, self._next_base, tokens))
        self._seen_file = _stamp(path)

    def _damaged(self, why: str) -> None:
        self.problem = f"The n-gram memory {self.path.name} was damaged ({why}); it starts empty."
        paths.set_aside(self.path, why)
        self._seen_file = None

    def _write(self) -> None:
        if self.path is None:
            return
        header = json.dumps({"texts": [[t.origin, len(t.tokens)] for t in self._texts]}).encode()
        body = b"".join(t.tokens.astype("<i4").tobytes() for t in self._texts)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
            with os.fdopen(fd, "wb") as out:
                out.write(HEADER.pack(MAGIC, self.n_vocab, len(header)) + header + body)
            os.replace(tmp, self.path)
        except OSError:
            return  # a memory that cannot be written only drafts less next time
        self._seen_file = _stamp(self.path)


def _stamp(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _parse(data: bytes, n_vocab: int | None) -> list[tuple[str, np.ndarray]]:
    """The (origin, tokens) a memory file holds; ValueError, in plain words, when it is damaged.
    ``n_vocab`` None: any vocabulary (to forget an origin in every file)."""
    if len(data) < HEADER.size:
        raise ValueError("too short")
    magic, vocab, n_header = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not an n-gram memory file")
    if n_vocab is not None and vocab != n_vocab:
        raise ValueError(f"made for a vocabulary of {vocab:,} tokens, not {n_vocab:,}")
    try:
        header = json.loads(data[HEADER.size:HEADER.size + n_header])
        texts = header["texts"]
        if not isinstance(texts, list):
            raise TypeError
        counts = []
        for origin, n in texts:
            if not isinstance(origin, str) or len(origin) > MAX_ORIGIN or type(n) is not int or n < 0:
                raise TypeError
            counts.append((origin, n))
    except (ValueError, KeyError, TypeError):
        raise ValueError("its list of texts is damaged") from None
    body = data[HEADER.size + n_header:]
    if len(body) != 4 * sum(n for _, n in counts):
        raise ValueError("its token counts do not match its size")
    tokens = np.frombuffer(body, dtype="<i4").astype(np.int32)
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= vocab):
        raise ValueError("it holds tokens outside its vocabulary")
    out, at = [], 0
    for origin, n in counts:
        out.append((origin, tokens[at:at + n]))
        at += n
    return out


def forget(origin: str, where: Path | None = None) -> None:
    """Forget ``origin`` in every vocabulary's memory (a conversation deleted); a damaged file
    is set aside."""
    where = where or folder()
    if not where.is_dir():
        return
    for path in where.glob("*.bin"):
        try:
            vocab = HEADER.unpack_from(path.read_bytes())[1]
        except (OSError, struct.error):
            continue
        memory = NgramMemory(vocab, path)
        if not memory.problem:
            memory.forget(origin)


def clear(where: Path | None = None) -> None:
    """Forget everything, in every vocabulary (the setting that turns the memory off)."""
    where = where or folder()
    if where.is_dir():
        for path in where.glob("*.bin"):
            path.unlink(missing_ok=True)
