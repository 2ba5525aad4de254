"""Copying drafters: prompt lookup in the context at hand (a suffix automaton over prompt and
generated tokens, followed through the output's edits by a ``CopyCursor``), and lookup in
what this machine wrote and read before (``ngrammemory``)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..sampling import SamplingParams
from ..vocabulary import Source
from .copycursor import CopyCursor, Spelling
from .draft import NO_MATCH, Choice, Draft, Drafter, DrafterInputs, Match
from .ngrammemory import NgramMemory


class SuffixIndex:
    """Suffix automaton over a growing token sequence, extended one token at a time.

    After each token it knows the longest suffix of the sequence that also occurred
    earlier, and an earlier place where it ended: the longest copy the text allows,
    found in amortised constant time per token (a dict of 1-3-grams knew only 3 tokens).
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        # Per state: transitions, suffix link, longest length, an end position of its strings.
        self._next: list[dict[int, int]] = [{}]
        self._link: list[int] = [-1]
        self._len: list[int] = [0]
        self._end: list[int] = [-1]
        self._last = 0
        self.match = NO_MATCH  # for the whole sequence so far

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new_tokens: Sequence[int]) -> None:
        for t in new_tokens:
            self.add(int(t))

    def add(self, t: int) -> None:
        nxt, link, length, end = self._next, self._link, self._len, self._end
        i = len(self.tokens)
        self.tokens.append(t)
        cur = len(length)
        nxt.append({})
        link.append(0)
        length.append(length[self._last] + 1)
        end.append(i)
        p = self._last
        while p != -1 and t not in nxt[p]:
            nxt[p][t] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][t]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:  # split q: the shorter strings now also end at i
                clone = len(length)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                end.append(end[q])
                while p != -1 and nxt[p].get(t) == q:
                    nxt[p][t] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self._last = cur
        # link[cur]: the longest suffix that occurred before. Its recorded end is an earlier
        # occurrence; from now on it points here, so the next match copies the latest one.
        u = link[cur]
        if u > 0 and end[u] < i:
            self.match = Match(end[u], length[u], i - end[u])
            end[u] = i
        else:
            self.match = NO_MATCH


class PromptLookup(Drafter):
    """Copies what followed the longest earlier occurrence of the context's suffix, and goes
    on copying from there through the output's edits.

    Prompt + generated tokens sit in a ``SuffixIndex`` updated as tokens arrive; a match
    of any length is found (a verbatim passage matches dozens of tokens deep), and the
    policy learns acceptance by match length. A ``CopyCursor`` follows the copy the output
    is making: while it has followed as long as the longest match says, the copy goes on from
    it, through the edits it learnt: a rename seen at its first occurrence is copied with its
    new name at the next (the longest match there is the new name's first place in the answer,
    followed by what followed it there). The match length reported is the cursor's run.
    """

    source = Source.LOOKUP

    def __init__(self, max_ngram: int | None = None, min_ngram: int = 1, spelling: Spelling | None = None):
        self.max_ngram = max_ngram  # None: no cap on the match length reported
        self.min_ngram = min_ngram
        self.spelling = spelling  # renames learnt apply to every token spelling the word
        self.reset()

    @classmethod
    def build(cls, inputs: DrafterInputs) -> "PromptLookup":
        return cls(max_ngram=inputs.max_ngram, spelling=Spelling.of(inputs.target))

    @property
    def tokens(self) -> list[int]:
        return self._index.tokens

    @property
    def substitutions(self) -> dict[int, dict[tuple[int, ...], tuple[int, ...]]]:
        return self._cursor.substitutions

    def reset(self) -> None:
        self._index = SuffixIndex()
        self._cursor = CopyCursor(self._index.tokens, self.spelling)

    def extend(self, new_tokens: Sequence[int]) -> None:
        cursor, index = self._cursor, self._index
        for t in new_tokens:
            t = int(t)
            if cursor.at is not None:  # followed before the token joins the text: never at the token it reads
                cursor.follow(t, len(index))
            index.add(t)

    def begin(self, context: Sequence[int]) -> None:
        """Start a generation: keep the index when ``context`` extends what it holds, else
        rebuild it (a conversation edited or truncated between generations). Edits learnt in
        one answer are not carried into the next."""
        n = len(self.tokens)
        if len(context) >= n and list(context[:n]) == self.tokens:
            self._cursor = CopyCursor(self._index.tokens, self.spelling)
            self.extend(context[n:])
        else:
            self.reset()
            self.extend(context)

    def match(self, context: Sequence[int]) -> Match:
        """The copy the output is making: the cursor where it has followed as long as the
        longest suffix match, else that match (at its latest occurrence)."""
        n = len(self.tokens)
        if len(context) < n or (n and context[n - 1] != self.tokens[n - 1]):
            self.begin(context)  # not an extension of what the index holds
        else:
            self.extend(context[n:])
        m, cursor = self._index.match, self._cursor
        cursor.rejoin(self.tokens)  # near where it left, before any match elsewhere
        if m.length and (cursor.at is None or cursor.run < m.length):
            cursor.found(m.end + 1, m.length, self.tokens)  # the output left its copy, or a longer one is found
        if cursor.at is None or cursor.run < self.min_ngram or not cursor.remaining:
            return NO_MATCH
        length = cursor.run if self.max_ngram is None else min(cursor.run, self.max_ngram)
        return Match(cursor.at - 1, length, cursor.remaining)

    def propose(self, context: Sequence[int], k: int, choice: Choice, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Copies up to k tokens after the match; none when it is shorter than ``choice.min_match``."""
        if k <= 0:
            return Draft(source=self.source)
        end, n, _ = self.match(context)
        if end < 0 or n < choice.min_match:
            return Draft(source=self.source)
        cont = self.copy(k)
        return Draft(cont, self.source, None, [1.0] * len(cont), n)

    def copy(self, k: int) -> list[int]:
        """The k tokens the copy goes on with, after the last ``match``."""
        return self._cursor.expected(k)

    def accept(self, context: Sequence[int]) -> None:
        self.extend(context[len(self.tokens):])


class MemoryLookup(Drafter):
    """Prompt lookup in the n-gram memory (``ngrammemory``): copies what followed the end of
    the context where this machine wrote or read it before (a regenerated answer, a document
    quoted again). The match length is how far back the memory agrees with the context."""

    source = Source.MEMORY

    def __init__(self, memory: NgramMemory) -> None:
        self.memory = memory

    @classmethod
    def build(cls, inputs: DrafterInputs) -> "MemoryLookup | None":
        return cls(inputs.memory) if inputs.memory is not None else None

    def begin(self, context: Sequence[int]) -> None:
        self.memory.refresh()  # the window may have forgotten a conversation since

    def match(self, context: Sequence[int]) -> Match:
        return Match(*self.memory.match(context))

    def propose(self, context: Sequence[int], k: int, choice: Choice, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        end, n, _ = self.match(context) if k > 0 else NO_MATCH
        if end < 0 or n < choice.min_match:
            return Draft(source=self.source)
        tokens = self.memory.copy(end, k)
        return Draft(tokens, self.source, None, [1.0] * len(tokens), n)

    def accept(self, context: Sequence[int]) -> None:
        """Nothing to keep: the memory learns a context when its generation ends."""
