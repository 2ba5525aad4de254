"""A client's prediction (OpenAI Predicted Outputs) as drafts, kept aligned with the output."""

from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

import numpy as np

from ..sampling import SamplingParams
from ..vocabulary import Source
from .copycursor import MAX_ALIGN, START_RUN, CopyCursor, Spelling
from .draft import NO_MATCH, Choice, Draft, Drafter, DrafterInputs, Match


class PredictionDrafter(Drafter):
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
