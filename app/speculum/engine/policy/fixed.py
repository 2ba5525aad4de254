"""Which drafter to use and how many tokens to draft, cycle by cycle.

``FixedPolicy`` drafts k tokens with one drafter every cycle (k = 0: plain decoding).
The adaptive policy (``auto.py``) answers the same questions from measurements.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from ...errors import SpeculumError
from .costs import CostModel
from ..cycle import PolicyReport
from ..drafting.draft import Choice, Draft
from ..vocabulary import Mode, Source


class Policy(Protocol):
    sources: Sequence[Source]  # the drafters it may choose

    @property
    def needs_calibration(self) -> bool: ...  # idle time is worth measuring costs in (``Decoder.calibrate``)
    def calibrated(self, measured: CostModel) -> None: ...
    def observe_prompt(self, n_tokens: int, seconds: float) -> None: ...  # a prompt chunk's decode
    def begin(self, repeatable: bool) -> None: ...  # an answer starts (``AutoPolicy.begin``)
    def choose(self, context: Sequence[int]) -> Choice: ...
    def observe(self, draft: Draft, n_accepted: int, draft_s: float, verify_s: float) -> None: ...
    def report(self) -> PolicyReport: ...
    def finish(self) -> None: ...  # after the last cycle


NO_MTP = ("MTP mode needs a model with its own multi-token prediction (NextN) layers, and this one has none: "
          "use --mode draft with a draft model, or --mode lookup.")


class FixedPolicy:
    """The same choice every cycle."""

    needs_calibration = False

    def __init__(self, choice: Choice):
        self.choice = choice
        self.sources = (choice.source,)

    @classmethod
    def for_mode(cls, mode: Mode, k: int | None, has_draft_model: bool = True,
                 has_mtp: bool = True) -> "FixedPolicy":
        if mode == Mode.DRAFT and not has_draft_model:
            raise SpeculumError("Draft mode needs a draft model: pass --draft, or use --mode lookup.")
        if mode == Mode.MTP and not has_mtp:
            raise SpeculumError(NO_MTP)
        k = k or 0
        return cls({
            Mode.OFF: Choice(Source.NONE, 0),
            Mode.DRAFT: Choice(Source.MODEL, k),
            Mode.LOOKUP: Choice(Source.LOOKUP, k),
            Mode.MTP: Choice(Source.MTP, k),
        }[mode])

    def calibrated(self, measured: CostModel) -> None:
        pass

    def observe_prompt(self, n_tokens: int, seconds: float) -> None:
        pass

    def begin(self, repeatable: bool) -> None:
        pass

    def choose(self, context: Sequence[int] = ()) -> Choice:
        return self.choice

    def observe(self, draft: Draft, n_accepted: int, draft_s: float, verify_s: float) -> None:
        pass

    def report(self) -> PolicyReport:
        return PolicyReport(self.choice.source, self.choice.k)

    def finish(self) -> None:
        pass
