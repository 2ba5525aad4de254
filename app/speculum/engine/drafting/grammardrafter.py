"""The text an answer's grammar forces next, drafted: a key the JSON schema requires after the
last value, a tool call's ``{"name": "`` after its opening, the punctuation between them.

A schema's keys are in the grammar, not in the prompt, so prompt lookup cannot copy them, and a
draft model guesses them token by token; the grammar knows them. ``GrammarDrafter`` asks the
grammar state at the context's end which single characters may come next, one at a time: where
it allows one, that character is forced; where it allows blanks beside one other character
(JSON's optional spaces), habit decides (what followed the same one or two characters before, in
the answer or the prompt's end: ``": "`` once it has been written so), or where there is none,
JSON as models write it (a blank after ``:`` and ``,``); where it allows more (a value's own
text), the draft ends. The text is then tokenized as the model writes text, and the target verifies it as any
copy: a wrong guess costs its pass, never a token.

Its ``match`` is a copying drafter's: ``length`` the characters before the first guess no habit
confirmed (the policy learns acceptance by it; a text that would begin with such a guess is not
drafted: models differ there, ``{"`` against ``{ "``), ``available`` the draft's tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..sampling import SamplingParams
from ..vocabulary import Source
from .draft import NO_MATCH, Choice, Draft, Drafter, DrafterInputs, Match

if TYPE_CHECKING:
    from ..backend import Backend
    from ..grammar.state import Follows

BLANKS = " \t\n\r"
# Characters a forced text may hold: one token each in the vocabulary, asked about all at once.
PROBED = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
MAX_CHARS = 64  # longer than any key and its punctuation; the policy's k cuts it anyway
HABIT_LOOKS = 8  # earlier places a habit is looked for at
HABIT_TOKENS = 1024  # of the prompt's last tokens, whose text shows habits too
# Before the answer has shown its habit, a blank follows these (``{"a": 1, "b": 2}``), and none
# follows the rest: JSON as models write it, Qwen's tool calls included.
BLANK_AFTER = ":,"


class GrammarDrafter(Drafter):
    source = Source.GRAMMAR

    def __init__(self, target: "Backend"):
        self.target = target
        self._chars: dict[int, str] | None = None  # token -> its one character, made on first use
        self._ids = np.zeros(0, np.int32)
        self._state: "Follows | None" = None
        self._text: str | None = None  # the prompt's end and the answer so far: its habits
        self._read = 0  # context tokens read into it
        self._at = -1  # the context length ``_draft`` was made for
        self._draft: tuple[list[int], int] = ([], 0)

    @classmethod
    def build(cls, inputs: DrafterInputs) -> "GrammarDrafter":
        return cls(inputs.target)

    def begin(self, context: Sequence[int]) -> None:
        # The prompt's end is where the habits start: an agent's earlier calls and its tools'
        # JSON are spaced as the model will space this answer's. Read on first use (``_follow``):
        # most answers have no grammar.
        self._read, self._text = len(context), None
        self._at, self._state = -1, None

    def constrain(self, state: "Follows | None") -> None:
        if state is not self._state:
            self._state, self._at = state, -1

    def match(self, context: Sequence[int]) -> Match:
        tokens, sure = self._forced(context)
        return Match(len(context) - 1, sure, len(tokens)) if tokens else NO_MATCH

    def propose(self, context: Sequence[int], k: int, choice: Choice, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        tokens, sure = self._forced(context) if k > 0 else ([], 0)
        if not tokens or sure < choice.min_match:
            return Draft(source=self.source)
        tokens = tokens[:k]
        return Draft(tokens, self.source, None, [1.0] * len(tokens), sure)

    def _forced(self, context: Sequence[int]) -> tuple[list[int], int]:
        """The forced text's tokens after ``context`` and its sure characters (``_walk``); none
        where it would begin with a guess."""
        if self._state is None:
            return [], 0
        if self._at != len(context):
            self._follow(context)
            text, sure = self._walk(*self._start())
            tokens = self.target.tokenize(text, add_special=False, parse_special=False) if sure and text.strip(BLANKS) else []
            self._draft, self._at = (tokens, sure), len(context)
        return self._draft

    def _follow(self, context: Sequence[int]) -> None:
        if len(context) < self._read:  # went back (not within a generation): begin again
            state = self._state
            self.begin(context)
            self._state = state
        if self._text is None:
            self._text = self._decoded(context[max(0, self._read - HABIT_TOKENS):self._read])
        self._text += self._decoded(context[self._read:])
        self._read = len(context)

    def _decoded(self, tokens: Sequence[int]) -> str:
        return b"".join(self.target.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def _probe_table(self) -> tuple[dict[int, str], np.ndarray]:
        if self._chars is None:
            chars = {}
            for c in PROBED:
                ids = self.target.tokenize(c, add_special=False, parse_special=False)
                if len(ids) == 1:
                    chars[ids[0]] = c
            self._chars, self._ids = chars, np.array(sorted(chars), np.int32)
        return self._chars, self._ids

    def _habit(self, before: str, options: str) -> str | None:
        """What followed ``before`` the last time one of ``options`` did, in the prompt's end or the
        answer (None: none did; ``HABIT_LOOKS`` places back at most)."""
        text, end = self._text, len(self._text) - 1
        for _ in range(HABIT_LOOKS):
            at = text.rfind(before, 0, end)
            if at < 0:
                return None
            after = at + len(before)
            if after < len(text) and text[after] in options:
                return text[after]
            end = at + len(before) - 1
        return None

    def _start(self) -> tuple["Follows | None", str, bool]:
        """Where the walk starts: the state; the text before it (a lazy grammar's trigger the answer
        has begun, ``name"`` after ``{"``); whether that text is sure (the trigger written whole
        before, in the prompt's calls). A lazy grammar's free text forces nothing: (None, "", False)."""
        state = self._state
        if state.triggered:
            return state, "", True
        begun = state.begun_trigger()
        if begun is None:
            return None, "", False
        trigger, rest, after = begun
        return after, rest.decode("utf-8", "replace"), trigger.decode("utf-8", "replace") in self._text

    def _walk(self, state: "Follows | None", lead: str = "", sure_lead: bool = True) -> tuple[str, int]:
        """Characters forced from ``state`` on, one at a time (see the module's docstring), after
        ``lead``, and how many lead the text before the first guess no habit confirmed."""
        chars, ids = self._probe_table()
        if state is None or not len(ids):
            return "", 0
        walk = state.clone()
        out, sure = lead, None if sure_lead else 0
        while len(out) < MAX_CHARS:
            allowed = ids[walk.allowed_among(ids)]
            if len(allowed) == 1:
                token = int(allowed[0])
            else:
                solid = [int(t) for t in allowed if chars[int(t)] not in BLANKS]
                if len(solid) > 1 or not len(allowed):
                    break  # the model's own choice (a value), or only the end
                written = (self._text[-2:] + out)[-2:]  # the habit's key: the last one or two characters
                options = "".join(chars[int(t)] for t in allowed)
                habit = next((h for n in (2, 1) if len(written) >= n
                              for h in [self._habit(written[-n:], options)] if h is not None), None)
                token = next((int(t) for t in allowed if chars[int(t)] == habit), None)
                if token is None:  # no habit here yet: JSON as models write it
                    if sure is None:
                        sure = len(out)
                    blank = " " if written[-1:] in BLANK_AFTER else None
                    token = next((int(t) for t in allowed if chars[int(t)] == blank), solid[0] if solid else None)
                    if token is None:
                        break
            walk.follow(token)
            out += chars[token]
        return out, len(out) if sure is None else sure
