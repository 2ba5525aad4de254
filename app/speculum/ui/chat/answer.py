"""An answer as the window keeps it: its cycles, each with its stage of a long document.

While a long document is summarised in parts, every cycle belongs to a stage ("Part 2 of 5",
"Combining"), and its part to a prompt of its own; a one-part answer's stage is "". The stage
travels with its cycle: as the ``runner.CycleEvent`` received while generating, or as a
``StagedCycle`` (made from the events, or read back for replay). Both have ``.cycle`` and
``.stage``; the part's prompt counts are a StagedCycle's ``.prompt``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from PySide6.QtCore import QElapsedTimer

from ...conversations import Conversation, Message
from ...engine.cycle import Cycle
from ...engine.prompts import document_message
from ...engine.vocabulary import Finish, Source
from ...summarise import COMBINING, copied_spans
from ...protocol import PartPrompt, PlainBasis, replay_snapshots


class AnswerKind(Enum):
    CHAT = "chat"  # a question's answer (or a Continue)
    SUMMARY = "summary"  # a document's summary


class StagedCycle(NamedTuple):
    cycle: Cycle
    stage: str = ""
    prompt: PartPrompt | None = None  # its part's own prompt, in an answer in parts


@dataclass
class LiveAnswer:
    """The answer being written, and where it goes."""
    conversation: Conversation
    kind: AnswerKind
    restore: str = ""  # the question, put back in the input box when the generation fails
    continues: int | None = None  # the index of the answer this one writes on from (Continue)
    before: str = ""  # that answer's text so far
    events: list = field(default_factory=list)  # the CycleEvents received, in order
    answer_clock: QElapsedTimer = field(default_factory=QElapsedTimer)  # since the Markdown answer was drawn
    stats_clock: QElapsedTimer = field(default_factory=QElapsedTimer)  # since the stats panel was

    @property
    def snapshot(self):
        """The stats after the last cycle received; None before the first."""
        return self.events[-1].snapshot if self.events else None

    def answer_due(self, interval_ms: int) -> bool:
        return _due(self.answer_clock, interval_ms)

    def stats_due(self, interval_ms: int) -> bool:
        return _due(self.stats_clock, interval_ms)

    @property
    def text(self) -> str:
        """The answer as shown while it is written (after the text it continues)."""
        return self.before + answer_so_far(self.events)

    def keep_partial(self, mode: str, note: str) -> bool:
        """Keep the answer as it stands after the last cycle received, as a stopped one; False
        when nothing was written (no empty turn is kept)."""
        text = "".join(e.cycle.text for e in self.events)
        messages = self.conversation.messages
        staged = with_stages([e.cycle for e in self.events], self.events)
        if self.continues is not None:
            extend_answer(messages[self.continues], text, staged, Finish.STOPPED, note)
            return True
        if not text.strip():
            return False
        messages.append(Message("assistant", text, cycles=cycle_records(staged),
                                stats=answer_stats(self.snapshot) if self.snapshot else {}, mode=mode,
                                finish=Finish.STOPPED, note=note))
        return True


def _due(clock: QElapsedTimer, interval_ms: int) -> bool:
    if clock.isValid() and clock.elapsed() < interval_ms:
        return False
    clock.start()
    return True


def with_stages(cycles, events) -> list[StagedCycle]:
    """A result's ``cycles`` (the ones whose ``events`` were received, in order) with their stages
    and part prompts."""
    return [StagedCycle(cycle, events[i].stage, events[i].snapshot.part_prompt) if i < len(events)
            else StagedCycle(cycle) for i, cycle in enumerate(cycles)]


def document_copies(document: str, cycles) -> list[list[int]]:
    """Where in ``document`` the passages that prompt lookup copied into its summary sit, as
    [start, end) spans (what the document pane highlights, and the conversation keeps)."""
    copies = ["".join(c.drafted_text[:c.n_accepted]) for c in cycles if c.source == Source.LOOKUP and c.n_accepted]
    return [[start, end] for start, end in copied_spans(document, copies)]


def answer_so_far(staged) -> str:
    """The answer as it stood after ``staged``: while a long document is summarised in parts,
    each part written so far under its stage name (part 1 stays while part 2 is written)."""
    stage = staged[-1].stage if staged else ""
    if not stage:
        return "".join(s.cycle.text for s in staged)
    parts: dict[str, list[str]] = {}
    for s in staged:
        parts.setdefault(s.stage, []).append(s.cycle.text)
    return "\n\n".join(f"*{name}{'…' if name == stage else ''}*\n\n" + "".join(texts).strip()
                       for name, texts in parts.items())


def cycle_records(staged) -> list[dict]:
    """The cycles stored with an answer, each tagged with its stage of a long document; a part's
    first cycle carries its prompt's counts, [decoded, total, reused]."""
    records = []
    for s in staged:
        record = s.cycle.to_json()
        if s.stage:
            record["stage"] = s.stage
            if s.prompt is not None and s.cycle.index == 0:
                record["prompt"] = [s.prompt.tokens, s.prompt.total, s.prompt.reused]
        records.append(record)
    return records


def staged_cycles(records: list[dict]) -> list[StagedCycle]:
    """Stored cycle records read back (older ones have no "stage" or "prompt"; a damaged prompt
    count is left out); a damaged record replays nothing."""
    try:
        cycles = [Cycle.from_json(d) for d in records]
    except ValueError:  # checked when the conversation was read
        return []
    staged, prompt = [], None
    for cycle, record in zip(cycles, records):
        stage = record.get("stage", "")
        stage = stage if isinstance(stage, str) else ""
        if cycle.index == 0:  # a part begins: its own prompt, where one is stored
            prompt = _part_prompt(stage, record.get("prompt"))
        staged.append(StagedCycle(cycle, stage, prompt if stage else None))
    return staged


def _part_prompt(stage: str, counts) -> PartPrompt | None:
    """A stored part prompt, [decoded, total, reused]; None where it is missing or makes no sense.
    (Stored before the last token was counted as decoded, a whole part read one short: counted now.)"""
    if (not isinstance(counts, list) or len(counts) != 3 or any(type(n) is not int or n < 0 for n in counts)
            or counts[0] > counts[1] or counts[2] > counts[1]):
        return None
    return PartPrompt.of(stage, *counts)


def answer_stats(snap) -> dict:
    """The numbers stored with an answer (shown in its header, used by replay)."""
    return {"tokens_per_s": round(snap.tokens_per_s, 3), "tokens": snap.tokens,
            "acceptance_rate": round(snap.acceptance_rate, 4), "tokens_per_pass": round(snap.tokens_per_pass, 4),
            "prompt_tokens": snap.prompt_tokens, "prompt_total": snap.prompt_total,
            "prompt_reused": snap.prompt_reused,
            "seconds": round(snap.seconds, 4),
            # The plain rate the answer began with: replay measures its speedup as the answer did.
            **({"plain_known": round(snap.plain_known, 3)} if snap.plain_known else {}),
            **({"plain_age_s": round(snap.plain_age_s, 1)} if snap.plain_age_s is not None else {})}


def plain_basis(stats: dict, fallback: float | None = None) -> PlainBasis:
    """The plain rate an answer began with, as stored (``fallback``: answers saved before it was)."""
    return PlainBasis(stats.get("plain_known", fallback), stats.get("plain_age_s"))


def extend_answer(message: Message, text: str, staged, finish, note: str) -> None:
    """Continue: the answer grows in place by ``text`` and the cycles that wrote it; its numbers
    are the whole answer's, as replay computes them."""
    offset = len(message.cycles)
    records = cycle_records(staged)
    for record in records:
        record["index"] = record.get("index", 0) + offset
    message.content += text
    message.cycles = message.cycles + records
    cycles = [s.cycle for s in staged_cycles(message.cycles)]
    if cycles:
        stats = message.stats
        snap = replay_snapshots(cycles, plain_basis(stats), stats.get("prompt_tokens", 0), stats.get("prompt_total", 0),
                                stats.get("prompt_reused"))[-1]
        message.stats = answer_stats(snap)
    message.finish, message.note = finish, note


def document_question(text: str, name: str) -> Message:
    """The user's turn asking for a summary of ``text`` (shown by its name and length)."""
    return Message("user", document_message(text), display=f"Summarise {name} ({len(text.split()):,} words)")


def stopped_note(text: str, snap, document: bool = False) -> str:
    """How a stopped answer ended, in words: with what it wrote, or before it wrote anything (the
    prompt's counts as its progress bar showed them; a part's own in an answer in parts)."""
    if text.strip():
        return "Stopped; the answer so far is kept."
    part = snap.part_prompt
    read, total = ((part.tokens + part.reused, part.total) if part is not None
                   else (snap.prompt_tokens + snap.prompt_reused, snap.prompt_total))
    if 0 <= read < total:
        counts = f"{read:,} of {total:,} tokens read"
        if document:
            where = f" {part.stage.lower()}" if part is not None else ""
            return f"Stopped while reading{where} ({counts}; Summarise resumes)"
        return f"Stopped while reading the prompt ({counts}); nothing was written."
    return "Stopped before the answer began; nothing was written."


def wrote_nothing(result) -> bool:
    """A generation stopped before any of its parts wrote a token (while its prompt was read)."""
    return result.finish == Finish.STOPPED and not any(c.emitted for c in result.cycles)


def finished_answer(conv: Conversation, result, records: list[dict], document: bool = False) -> Message:
    """The stored answer of a finished generation, with a note on how it ended. After a long
    document summarised in parts, the question no longer carries the whole document. One stopped
    before it wrote anything is only its note: no text, numbers or cycles to show or replay."""
    if result.part_summaries:
        # The whole document no longer fits the context: later turns see the summary instead.
        user = conv.messages[-1] if conv.messages and conv.messages[-1].role == "user" else None
        if user is not None:
            user.content = f"Summarise the document {conv.document_name or ''} (too long to include here)."
    if wrote_nothing(result):
        return Message("assistant", "", mode=result.mode, finish=Finish.STOPPED,
                       note=stopped_note("", result.snapshot, document))
    note = result.note
    if result.finish == Finish.STOPPED and not note:
        note = stopped_note(result.text, result.snapshot, document)
    text = result.text
    display = ""
    if result.part_summaries:
        n = len(result.part_summaries)
        if result.finish == Finish.STOPPED:
            display = "**Part summaries so far**\n\n" + text
            note += " Its numbers are totals over the parts written."
        else:
            note = (note + " " if note else "") + (f"Summarised in {n} parts, then combined; its numbers are "
                                                   "totals over the parts and the combining step.")
    return Message("assistant", text, display=display, cycles=records, stats=answer_stats(result.snapshot),
                   mode=result.mode, finish=result.finish, note=note)


def stages_scope(staged) -> str:
    """What the numbers of an answer written in stages add up, in words; "" for one in one piece."""
    stages = list(dict.fromkeys(s.stage for s in staged if s.stage))
    if not stages:
        return ""
    parts = [s for s in stages if s != COMBINING]
    scope = f"totals over {len(parts)} part{'s' * (len(parts) != 1)}"
    return scope + (" and the combining step" if COMBINING in stages else "")
