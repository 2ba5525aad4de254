"""Which drafter to use and how many tokens to draft, cycle by cycle.

``FixedPolicy`` drafts k tokens with one drafter every cycle (k = 0: plain decoding).
The adaptive policy (``auto`` mode) lives beside it and answers the same questions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from .cycle import Cycle
from .drafters import LOOKUP, MODEL, NONE

MODES = ("off", "draft", "lookup", "auto")


@dataclass(frozen=True)
class Choice:
    source: str  # MODEL, LOOKUP, or NONE
    k: int
    min_confidence: float = 0.0  # model drafts stop below this draft probability
    min_match: int = 1  # lookup drafts need an n-gram match at least this long
    fallback: str = NONE  # hybrid: the drafter to use when the first has nothing


class Policy(Protocol):
    def prepare(self, sequence, last_token: int) -> None: ...  # before the first cycle
    def choose(self, context: Sequence[int]) -> Choice: ...
    def observe(self, cycle: Cycle) -> None: ...
    def describe(self) -> dict: ...
    def finish(self) -> None: ...  # after the last cycle


class FixedPolicy:
    def __init__(self, mode: str, k: int = 4, has_draft_model: bool = True):
        if mode == "draft" and not has_draft_model:
            from ..errors import SpeculumError
            raise SpeculumError("Draft mode needs a draft model: pass --draft, or use --mode lookup.")
        self.choice = {
            "off": Choice(NONE, 0),
            "draft": Choice(MODEL, k),
            "lookup": Choice(LOOKUP, k),
        }[mode]

    def prepare(self, sequence, last_token: int) -> None:
        pass

    def choose(self, context: Sequence[int] = ()) -> Choice:
        return self.choice

    def observe(self, cycle: Cycle) -> None:
        pass

    def describe(self) -> dict:
        return {"source": self.choice.source, "k": self.choice.k}

    def finish(self) -> None:
        pass
