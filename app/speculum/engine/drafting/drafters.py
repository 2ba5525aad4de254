"""Drafters propose the next few tokens cheaply; the target verifies them in one pass.

Every drafter has the same three calls (as llama.cpp's ``common/speculative``):
``begin(context)`` before a generation, ``propose(context, k, choice, sampling, rng)``
each cycle, ``accept(context)`` once the target has kept what it kept.

- ``ModelDrafter``: a small model of the same tokenizer, its KV cache kept in step
  with the target (synced to the accepted context before every proposal).
- ``PromptLookup``: copies the continuation of the latest earlier occurrence of the
  context's longest repeated suffix (a suffix automaton over prompt + generated tokens).
- ``MemoryLookup``: the same from what this machine wrote and read before (``ngrammemory``).
- ``MtpDrafter`` (``mtp.py``): the target's own multi-token prediction head.
- ``PredictionDrafter``: the client's predicted output, kept aligned
  with what the target writes.

``DRAFTERS`` maps each source to its class: a new drafter is one class with a ``build``
and one entry there; the decoder builds whichever the loaded models allow.
"""

from __future__ import annotations

import re
import time
from bisect import bisect_left
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..backend import Backend, CachedSequence
from .draft import Choice, Draft, Drafter, DrafterInputs, draft_one_by_one  # noqa: F401  (re-exported)
from .mtp import MtpDrafter
from ..sampling import SamplingParams
from ..vocabulary import Source



class ModelDrafter:
    source = Source.MODEL

    def __init__(self, model: Backend, clock=time.perf_counter, prompt_cache=None):
        self.model = model
        self.sequence = CachedSequence(model, prompt_cache, owner="draft")
        self.clock = clock
        self._drafted = False  # since the last accept: only then is there anything to drop
        # A new prompt since the draft model last read: its first read resumes from the prompt
        # cache. Not before: auto mode may never draft with the model on this prompt.
        self._new_prompt = True

    @classmethod
    def build(cls, inputs: DrafterInputs) -> "ModelDrafter | None":
        return cls(inputs.draft, inputs.clock, inputs.prompt_cache) if inputs.draft is not None else None

    def _sync(self, context: Sequence[int]) -> int:
        if self._new_prompt:
            self._new_prompt = False
            return self.sequence.resume(context)
        return self.sequence.sync(context)

    def propose(self, context: Sequence[int], k: int, choice: Choice, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Up to k tokens following ``context``; stops early below ``choice.min_confidence``."""
        if k <= 0:
            return Draft(source=self.source)
        seq = self.sequence
        have = self._sync(context)
        if have == len(context):  # nothing new to decode: step back one to get logits
            seq.trim(have - 1)
            have -= 1
        # Room in the draft's own context: it may be smaller than the target's.
        k = min(k, self.model.n_ctx - len(context))
        if k <= 0:
            return Draft(source=self.source)
        start = self.clock()
        pending = list(context[have:])
        if len(pending) <= self.model.n_batch:
            logits = seq.decode(pending, rows=(len(pending) - 1,))[0]
        else:  # a long catch-up (a new chat turn): in chunks, logits from the last one
            seq.feed(pending[:-1])
            logits = seq.decode(pending[-1:])[0]
        tokens, q, conf, first_s, steps = draft_one_by_one(logits, k, lambda i, tok: seq.decode([tok])[0], choice,
                                                    sampling, rng, start, self.clock)
        self._drafted = bool(tokens)
        return Draft(tokens, self.source, q, conf, first_s=first_s, caught_up=len(pending), steps=steps)

    def behind(self, context: Sequence[int]) -> int:
        """Tokens of ``context`` the draft model would read before its first draft token."""
        # The whole common prefix, not a guess from its end: with a longer earlier prompt in its
        # cache, a guess read a new 1,300-token document as 8 tokens behind, and auto mode
        # tried the draft model there and paid seconds to read it (0.95x plain).
        return len(context) - self.sequence.reusable(context)

    def read(self, context: Sequence[int], stop=None, on_chunk=None, chunk: int | None = None) -> None:
        """Read ``context`` into the draft model's cache now, as part of reading the prompt
        (``CachedSequence.feed``'s arguments). Where it drafts every cycle, its first draft would
        otherwise read a whole new document inside the first cycle, seconds with no progress
        shown. Nothing is read that its own context could not hold."""
        if self.holds(context):
            self.sequence.feed(context[self.sequence.resume(context):], stop, on_chunk, chunk=chunk)

    def holds(self, context: Sequence[int]) -> bool:
        """Whether the draft model's own context (it may be smaller than the target's) holds this."""
        return len(context) < self.model.n_ctx

    def begin(self, context: Sequence[int]) -> None:
        """Nothing to read yet: ``propose`` syncs the KV cache to the context it is given."""
        self._new_prompt = True

    def accept(self, context: Sequence[int]) -> None:
        """Drop drafted tokens the target rejected (the next propose syncs anyway)."""
        if self._drafted:
            self.sequence.sync(context)
            self._drafted = False


class Match(NamedTuple):
    """The latest earlier occurrence of the context's longest repeated suffix."""

    end: int  # position of its last token (-1: none)
    length: int  # matched suffix length in tokens (0: none)
    available: int  # tokens after it that a draft could copy


NO_MATCH = Match(-1, 0, 0)


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


# Copying with edits: a cursor into the text being copied, kept aligned with the output.
#
# While the output follows the text, the cursor advances with it; when the output leaves it (an
# edit inserts, deletes or changes text), the place it left is kept until the cursor is found
# again (lookup: at the longest match; a prediction: where the output's latest tokens occur,
# searching forward from where it was). A guess that fails at once (a new name's first token
# found elsewhere) does not move that place: the edit still began where the output left the text.
#
# An edit usually repeats itself (a rename changes every occurrence), so the cursor learns it:
# the tokens it skipped and the ones the output wrote instead are one substitution, kept once the
# output has followed the text for CONFIRM tokens after it. Copies then apply it wherever the
# skipped tokens come again, and the cursor follows the output through it: the second occurrence
# of a renamed variable is drafted with its new name instead of failing a pass.
MAX_ALIGN = 8  # longest output suffix looked up when re-aligning
START_RUN = 2  # a prediction's trust at the very start: the answer usually opens with it
MAX_SKIPPED = 8  # longest span of the text a learned substitution replaces...
MAX_WRITTEN = 16  # ... and longest text it writes instead
CONFIRM = 2  # tokens the output follows the text after a change before it is learned


class Spelling(NamedTuple):
    """A vocabulary's spelling: a token's bytes, and text back into tokens."""

    token_bytes: Callable[[int], bytes]
    tokenize: Callable[[str], list[int]]

    @classmethod
    def of(cls, model) -> "Spelling":
        return cls(model.token_bytes, lambda text: model.tokenize(text, add_special=False, parse_special=False))


# A substitution that replaces one word by another ("area" -> "surface") is also a rename of
# that word wherever the tokenizer spells it otherwise: " area" after "def" is one token,
# "(area" after "print" another (Qwen), or "area" after "(" (SmolLM2), and a substitution of
# tokens alone drafted "print(area(2, " after "def surface(w, h):" was written.
_WORD_CHANGE = re.compile(r"(\W*)(\w+)(\W*)")


def renamed_word(old: str, new: str) -> tuple[str, str] | None:
    """(old word, new word) when ``old`` and ``new`` are one word each, framed alike."""
    a, b = _WORD_CHANGE.fullmatch(old), _WORD_CHANGE.fullmatch(new)
    if a is None or b is None or a.group(1) != b.group(1) or a.group(3) != b.group(3) or a.group(2) == b.group(2):
        return None
    return a.group(2), b.group(2)


class CopyCursor:
    """Where the output stands in a text it copies from, followed token by token, and the
    substitutions learned on the way. ``text`` may grow (lookup copies from the output too).
    With the vocabulary's ``spelling``, a substitution of one word renames it in every token
    that spells it (see ``renamed_word``)."""

    def __init__(self, text: list[int], spelling: Spelling | None = None) -> None:
        self.text = text
        self.spelling = spelling
        self.renames: dict[str, str] = {}  # word -> the word the output writes instead
        self._renamed: re.Pattern | None = None  # any of those words, whole
        self._respelled: dict[int, tuple[int, ...] | None] = {}  # per text token, under the renames
        self.at: int | None = None  # index of the next expected token; None: lost
        self.run = 0  # output tokens in a row that followed the text
        self.anchor = 0  # where the output last followed the text
        self.substitutions: dict[int, dict[tuple[int, ...], tuple[int, ...]]] = {}  # first skipped token -> ...
        self.left: tuple[int, int] | None = None  # where the output left: (text index, context position)
        self._pending: tuple[int, ...] = ()  # a substitution's tokens still expected before ``at``
        self._followed = 0  # tokens followed since the cursor was last found
        self._candidate: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # (skipped, written), unconfirmed
        self._confirming = 0  # tokens followed since the candidate's re-alignment

    def start(self, at: int | None, run: int) -> None:
        """A new answer begins: expected at ``at`` (None: nowhere yet), trusted as ``run`` tokens."""
        self.at, self.run, self._followed, self.anchor = at, run, run, at or 0
        self._pending, self.left, self._candidate = (), None, None

    @property
    def remaining(self) -> int:
        """Tokens a copy could still take from here (0 when lost or at the text's end)."""
        return 0 if self.at is None else len(self._pending) + len(self.text) - self.at

    def follow(self, token: int, pos: int) -> bool:
        """Advance over the output's token at context position ``pos``; False when it left the text."""
        if self.at is None:
            return False
        at = self.at
        if self._step(token):
            self.run += 1
            self._followed += 1
            self.anchor = self.at
            self._learn_when_confirmed()
            return True
        if self._followed >= CONFIRM or self.left is None:
            self.left = (at, pos) if not self._pending else None
        self.at, self._pending, self.run, self._candidate = None, (), 0, None
        return False

    def found(self, end: int, n: int, context: Sequence[int]) -> None:
        """The output's last ``n`` tokens (the end of ``context``) found in the text before index ``end``."""
        self.at, self.run, self._followed, self._pending = end, n, 0, ()
        self._candidate, self._confirming = self._change(context, n, end), 0

    def expected(self, k: int) -> list[int]:
        """The next k tokens the output should write: the text, with the learned edits applied."""
        if self.at is None:
            return []
        out = list(self._pending[:k])
        at = self.at
        while len(out) < k and at < len(self.text):
            sub = self._substitution_at(at)
            if sub is not None:
                out.extend(sub[1])
                at += len(sub[0])
            else:
                out.append(self.text[at])
                at += 1
        return out[:k]

    def _substitution_at(self, at: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """A learned substitution whose skipped tokens start at text index ``at``: one of tokens,
        else a rename of a word in the token there."""
        token = self.text[at]
        for skipped, written in self.substitutions.get(token, {}).items():
            if tuple(self.text[at:at + len(skipped)]) == skipped:
                return skipped, written
        if not self.renames:
            return None
        if token not in self._respelled:
            self._respelled[token] = self._respell(token)
        written = self._respelled[token]
        return ((token,), written) if written else None

    def _respell(self, token: int) -> tuple[int, ...] | None:
        try:
            piece = self.spelling.token_bytes(token).decode("utf-8")
        except UnicodeDecodeError:  # part of a character: no word in it
            return None
        new = self._renamed.sub(lambda m: self.renames[m.group(1)], piece)
        return tuple(self.spelling.tokenize(new)) if new != piece else None

    def _renames_changed(self) -> None:
        words = "|".join(map(re.escape, self.renames))
        self._renamed = re.compile(rf"(?<!\w)({words})(?!\w)") if words else None
        self._respelled.clear()

    def _rename(self, skipped: tuple[int, ...], written: tuple[int, ...]) -> None:
        if self.spelling is None:
            return
        decode = lambda tokens: b"".join(map(self.spelling.token_bytes, tokens)).decode("utf-8", "replace")  # noqa: E731
        words = renamed_word(decode(skipped), decode(written))
        if words is not None:
            self.renames[words[0]] = words[1]
            self._renames_changed()

    def _unlearn(self, sub: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
        """The output kept the text where ``sub`` would have changed it: not a change that repeats."""
        skipped = sub[0]
        same_start = self.substitutions.get(skipped[0], {})
        if skipped in same_start:
            del same_start[skipped]
            if not same_start:
                del self.substitutions[skipped[0]]
        else:  # a rename: every word it changes in this token is kept here
            piece = self.spelling.token_bytes(skipped[0]).decode("utf-8", "replace")
            for word in set(self._renamed.findall(piece)):
                del self.renames[word]
            self._renames_changed()

    def _step(self, token: int) -> bool:
        if self._pending:
            if self._pending[0] != token:
                return False
            self._pending = self._pending[1:]
            return True
        if self.at >= len(self.text):
            return False
        sub = self._substitution_at(self.at)
        if sub is not None and sub[1][0] == token:
            self.at += len(sub[0])
            self._pending = sub[1][1:]
        elif self.text[self.at] == token:
            if sub is not None:  # the output kept the text here: that change was not one that repeats
                self._unlearn(sub)
            self.at += 1
        else:
            return False
        return True

    def _learn_when_confirmed(self) -> None:
        if self._candidate is None:
            return
        self._confirming += 1
        if self._confirming >= CONFIRM:
            skipped, written = self._candidate
            self.substitutions.setdefault(skipped[0], {})[skipped] = written
            self._rename(skipped, written)
            self._candidate = None

    def _change(self, context: Sequence[int], n: int, end: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """What the output wrote instead of which text, from where it left the text to where its
        last ``n`` tokens rejoined it (ending before ``end``); None unless a short change."""
        if self.left is None:
            return None
        left_at, left_pos = self.left
        skipped = tuple(self.text[left_at:end - n])
        written = tuple(context[left_pos:len(context) - n])
        if not 0 < len(skipped) <= MAX_SKIPPED or not 0 < len(written) <= MAX_WRITTEN:
            return None  # an insertion or a deletion, or a change too long to come again
        return skipped, written


class PromptLookup:
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

class MemoryLookup:
    """Prompt lookup in the n-gram memory (``ngrammemory``): copies what followed the end of
    the context where this machine wrote or read it before (a regenerated answer, a document
    quoted again). The match length is how far back the memory agrees with the context."""

    source = Source.MEMORY

    def __init__(self, memory) -> None:
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


class PredictionDrafter:
    """Predicted Outputs as drafts: the client says what it expects back, we propose it.

    OpenAI's ``prediction`` (the file being edited, the document being reformatted) is a
    draft that is mostly right. A ``CopyCursor`` into the predicted tokens keeps it aligned
    with the output; when the cursor is lost it is found again at the next place where the
    output's latest tokens occur in the prediction, searching forward from where it was
    first. ``Match.length`` tells the policy how much to trust a draft: the number of output
    tokens in a row that followed the prediction (a fresh re-alignment on one common token is weak).
    """

    source = Source.PREDICTION

    def __init__(self, spelling: Spelling | None = None) -> None:
        self.predicted: list[int] = []
        self.spelling = spelling
        self._index: dict[tuple[int, ...], list[int]] = {}  # n-gram -> sorted positions after it
        self._origin = 0  # where the output starts in the context
        self._seen = 0  # context length already followed
        self._cursor = CopyCursor(self.predicted, spelling)

    @classmethod
    def build(cls, inputs: DrafterInputs) -> "PredictionDrafter":
        return cls(Spelling.of(inputs.target))

    @property
    def substitutions(self) -> dict[int, dict[tuple[int, ...], tuple[int, ...]]]:
        return self._cursor.substitutions

    def expect(self, tokens: Sequence[int]) -> None:
        """The next generation's prediction (empty: none)."""
        self.predicted = list(tokens)
        index: dict[tuple[int, ...], list[int]] = {}
        for end in range(1, len(self.predicted) + 1):
            for n in range(1, min(MAX_ALIGN, end) + 1):
                index.setdefault(tuple(self.predicted[end - n:end]), []).append(end)
        self._index = index
        self._cursor = CopyCursor(self.predicted, self.spelling)  # an edit learnt on one file says nothing of the next

    def begin(self, context: Sequence[int]) -> None:
        self._origin = self._seen = len(context)
        self._cursor.start(0 if self.predicted else None, START_RUN)

    def match(self, context: Sequence[int]) -> Match:
        """Where the output stands in the prediction; ``available`` predicted tokens follow."""
        if not self.predicted:
            return NO_MATCH
        self._follow(context)
        cursor = self._cursor
        if not cursor.remaining:
            return NO_MATCH
        return Match(cursor.at - 1, cursor.run, cursor.remaining)

    def propose(self, context: Sequence[int], k: int, choice: Choice, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        _, run, _ = self.match(context) if k > 0 else NO_MATCH
        if run <= 0 or run < choice.min_match:
            return Draft(source=self.source)
        tokens = self._cursor.expected(k)
        return Draft(tokens, self.source, None, [1.0] * len(tokens), run)

    def accept(self, context: Sequence[int]) -> None:
        if self.predicted:
            self._follow(context)

    def _follow(self, context: Sequence[int]) -> None:
        """Advance the cursor over output tokens not yet seen; re-align when they leave the prediction."""
        if len(context) < self._seen:  # the context went back (should not happen within a generation)
            self.begin(context)
            return
        for pos in range(self._seen, len(context)):
            self._cursor.follow(context[pos], pos)
        self._seen = len(context)
        if self._cursor.at is None:
            self._realign(context)

    def _realign(self, context: Sequence[int]) -> None:
        """The longest suffix of the output found in the prediction, nearest at or after the anchor."""
        output = context[self._origin:]
        for n in range(min(MAX_ALIGN, len(output)), 0, -1):
            ends = self._index.get(tuple(output[len(output) - n:]))
            if not ends:
                continue
            at = bisect_left(ends, self._cursor.anchor)
            end = ends[at] if at < len(ends) else ends[-1]  # else: the output went back in the text
            if end < len(self.predicted):
                self._cursor.found(end, n, context)
                return


# Source -> drafter class. Order is the order drafters begin and accept in.
DRAFTERS: dict[Source, type] = {
    Source.MODEL: ModelDrafter,
    Source.LOOKUP: PromptLookup,
    Source.MEMORY: MemoryLookup,  # needs an n-gram memory
    Source.PREDICTION: PredictionDrafter,
    Source.MTP: MtpDrafter,  # needs a target with NextN layers
}


def build_drafters(inputs: DrafterInputs) -> dict[Source, Drafter]:
    """Every registered drafter the inputs allow (the model drafter needs a draft model)."""
    built = {source: cls.build(inputs) for source, cls in DRAFTERS.items()}
    return {source: drafter for source, drafter in built.items() if drafter is not None}
