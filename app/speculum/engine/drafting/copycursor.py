"""Copying with edits: where the output stands in a text it copies (the context, a client's
prediction), followed token by token, and the substitutions and renames learnt on the way."""

from __future__ import annotations

import re
from typing import Callable, NamedTuple, Sequence

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
# A copy rejoined within MAX_SKIPPED tokens of where the output left the text (a typo fixed, a
# word or a line's end changed) goes on as the same copy, its match length the tokens found there
# plus up to REJOIN_TRUST of its run before the change: drafted at once, as a mid-length match
# whose own rates judge it, not after three more tokens written plainly (EXPLORE_MATCH). Only a
# copy that had run REJOIN_AFTER tokens: after short ones, a token found a few places on was
# chance. On scripts/sim_policy.py (8 seeds, flat and steep curves) against no rejoining: document
# summary +4% / +6%, typo fixing +14% / +1% (its worst seed 1.07x plain against 1.005x), the rest
# within 0.5%; carrying the whole run, or after 8-token runs, open chat and code writing lost
# 2-4% (long copies drafted on a chance rejoin).
REJOIN_MIN = 1  # the output's latest tokens that must be found there
REJOIN_AFTER = 16
REJOIN_TRUST = 5


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
        self._left_run = 0  # the run the copy had when the output left it

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
            self._left_run = self.run
        self.at, self._pending, self.run, self._candidate = None, (), 0, None
        return False

    def rejoin(self, context: Sequence[int]) -> bool:
        """Lost since a change, the output's latest tokens (the end of ``context``) found in the text
        within MAX_SKIPPED tokens after where it left: the copy goes on there, as long as it was
        (a typo fixed, then the sentence copied on: its next token, not three tokens later, is
        drafted with the copy's trust). The longest such tail, at its first place there."""
        if self.at is not None or self.left is None or self._left_run < REJOIN_AFTER:
            return False
        left_at, left_pos = self.left
        written = len(context) - left_pos
        for n in range(min(written, MAX_ALIGN), REJOIN_MIN - 1, -1):
            if written - n > MAX_WRITTEN:
                break  # (shorter tails leave more written: none fits)
            tail = list(context[-n:])
            # (before where the output left off writing it: the text holds the output too)
            for place in range(left_at, min(left_at + MAX_SKIPPED, left_pos - n) + 1):
                if self.text[place:place + n] == tail:
                    self.found(place + n, n, context)
                    self.run = n + min(self._left_run, REJOIN_TRUST)
                    return True
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
