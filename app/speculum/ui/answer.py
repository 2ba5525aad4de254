"""An answer as the window keeps it: its cycles, each with its stage of a long document.

While a long document is summarised in parts, every cycle belongs to a stage ("Part 2 of 5",
"Combining"); a one-part answer's stage is "". The stage travels with its cycle: as the
``runner.CycleEvent`` received while generating, or as a ``StagedCycle`` read back for replay.
Both have ``.cycle`` and ``.stage``, and everything here takes either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from PySide6.QtCore import QElapsedTimer

from ..conversations import Conversation
from ..engine.cycle import Cycle


class StagedCycle(NamedTuple):
    cycle: Cycle
    stage: str = ""


@dataclass
class LiveAnswer:
    """The answer being written, and where it goes."""
    conversation: Conversation
    kind: str  # "chat" or "summary"
    restore: str = ""  # the question, put back in the input box when the generation fails
    events: list = field(default_factory=list)  # the CycleEvents received, in order
    answer_clock: QElapsedTimer = field(default_factory=QElapsedTimer)  # since the Markdown answer was drawn
    stats_clock: QElapsedTimer = field(default_factory=QElapsedTimer)  # since the stats panel was

    @property
    def snapshot(self):
        """The stats after the last cycle received; None before the first."""
        return self.events[-1].snapshot if self.events else None


def with_stages(cycles, events) -> list[StagedCycle]:
    """A result's ``cycles`` (the ones whose ``events`` were received, in order) with their stages."""
    return [StagedCycle(cycle, events[i].stage if i < len(events) else "") for i, cycle in enumerate(cycles)]


def answer_so_far(staged) -> str:
    """The answer as it stood after ``staged``: while a long document is summarised in parts,
    the part being written under its stage name."""
    stage = staged[-1].stage if staged else ""
    if not stage:
        return "".join(s.cycle.text for s in staged)
    return f"*{stage}…*\n\n" + "".join(s.cycle.text for s in staged if s.stage == stage)


def cycle_records(staged) -> list[dict]:
    """The cycles stored with an answer, each tagged with its stage of a long document."""
    records = []
    for s in staged:
        record = s.cycle.to_json()
        if s.stage:
            record["stage"] = s.stage
        records.append(record)
    return records


def staged_cycles(records: list[dict]) -> list[StagedCycle]:
    """Stored cycle records read back (older ones have no "stage"); a damaged record replays nothing."""
    try:
        return [StagedCycle(Cycle.from_json(d), d.get("stage", "")) for d in records]
    except ValueError:  # checked when the conversation was read
        return []


def answer_stats(snap) -> dict:
    """The numbers stored with an answer (shown in its header, used by replay)."""
    return {"tokens_per_s": round(snap.tokens_per_s, 3), "tokens": snap.tokens,
            "acceptance_rate": round(snap.acceptance_rate, 4), "tokens_per_pass": round(snap.tokens_per_pass, 4),
            "prompt_tokens": snap.prompt_tokens, "prompt_total": snap.prompt_total,
            "seconds": round(snap.seconds, 4)}
