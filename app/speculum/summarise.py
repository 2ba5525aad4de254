"""Summarising a document longer than the model's context: parts, then the combine step.

The document is cut at paragraph, then line, sentence and word boundaries into parts
that each fit the token budget; joined again they give back the whole text, so nothing
is silently dropped. Each part is summarised, and the part summaries are combined (in
further rounds when even they do not fit).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator, Sequence

from .engine.chat import chat_tokens
from .engine.prompts import build_messages, document_message
from .engine.vocabulary import Finish
from .errors import SpeculumError

CountTokens = Callable[[str], int]

# Coarse to fine; each keeps its separator at the end of the piece before it.
_BOUNDARIES = (r"(?<=\n\n)", r"(?<=\n)", r"(?<=[.!?]\s)", r"(?<=\s)")


def part_request(number: int, total: int) -> str:
    return (f"The document above is part {number} of {total} of a longer document. "
            "Summarise this part in one short paragraph.")


def combine_request(n_parts: int) -> str:
    return (f"Above are summaries of the {n_parts} consecutive parts of one document, in order. "
            "Combine them into one summary of the whole document in a few short paragraphs.")


def joined_summaries(summaries: Sequence[str]) -> str:
    return "\n\n".join(f"Part {i}: {s.strip()}" for i, s in enumerate(summaries, 1))


def _atoms(text: str, count: CountTokens, budget: int, level: int = 0) -> Iterator[str]:
    """Pieces of ``text`` in order, each within ``budget`` tokens."""
    if count(text) <= budget:
        yield text
        return
    if level == len(_BOUNDARIES):
        # A single "word" longer than the budget: cut by characters.
        step = max(1, len(text) * budget // max(count(text), 1) // 2)
        for start in range(0, len(text), step):
            yield from _atoms(text[start:start + step], count, budget, level)
        return
    pieces = [p for p in re.split(_BOUNDARIES[level], text) if p]
    if len(pieces) == 1:
        yield from _atoms(text, count, budget, level + 1)
        return
    for piece in pieces:
        yield from _atoms(piece, count, budget, level + 1) if count(piece) > budget else iter((piece,))


def split_by_tokens(text: str, count: CountTokens, budget: int) -> list[str]:
    """Consecutive parts of ``text``, each at most ``budget`` tokens; ``"".join(parts) == text``."""
    if budget < 1:
        raise ValueError("budget must be at least one token")
    parts: list[str] = []
    current = ""
    current_tokens = 0
    for atom in _atoms(text, count, budget):
        n = count(atom)
        # Token counts are nearly additive; check the real count only near the limit.
        if current and (current_tokens + n > budget or
                        (current_tokens + n > budget * 0.8 and count(current + atom) > budget)):
            parts.append(current)
            current, current_tokens = atom, n
        else:
            current += atom
            current_tokens += n
    if current:
        parts.append(current)
    # Whitespace-only parts would make an empty request: fold them into a neighbour.
    merged: list[str] = []
    for part in parts:
        if merged and not part.strip():
            merged[-1] += part
        else:
            merged.append(part)
    return merged


def copied_spans(document: str, copies: Sequence[str], min_chars: int = 4) -> list[tuple[int, int]]:
    """Where in ``document`` each copied text sits, as merged (start, end) character spans.

    ``copies`` are the texts the answer took through accepted lookup drafts, in answer
    order; the search continues from the last match, since summaries tend to follow
    the document, and falls back to the start.
    """
    spans: list[tuple[int, int]] = []
    cursor = 0
    for text in copies:
        needle = text.strip()
        if len(needle) < min_chars:
            continue
        at = document.find(needle, cursor)
        if at < 0:
            at = document.find(needle)
        if at < 0:
            continue
        spans.append((at, at + len(needle)))
        cursor = at + len(needle)
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


# A summary (and each part's) when the user set no limit: room for the document stays beside it.
PART_ANSWER_TOKENS = 512

COMBINING = "Combining"  # the stage that combines the part summaries into one

# (messages) -> one generation answering them (engine.decoder.Generation: its cycles, its stats).
Generate = Callable[[list], Iterable]


class DocumentSummary:
    """A summary of ``document``, in parts when it is longer than the context.

    The window and ``speculum generate --document`` both run it. Iterating yields
    ``(stage, cycle, generation)`` for every target pass of every generation: stage is
    "" for a one-part answer, "Part 2 of 5" (", round 2" in later rounds) or "Combining";
    generation, what ``generate`` returned for that stage (its stats, its prompt's size).
    Afterwards ``text`` is the answer, ``part_summaries`` the first round's part summaries,
    and ``stopped_at`` the stage a Stop ended (then ``text`` holds the part summaries so far).
    """

    def __init__(self, target, document: str, max_tokens: int, generate: Generate, request: str | None = None):
        self.target = target
        self.document = document
        self.request = request  # what to do with a document that fits whole (default: summarise it)
        self.max_tokens = max_tokens
        self.generate = generate
        self.on_stage: Callable[[str], None] | None = None  # a stage begins (before its prompt is read)
        self.text = ""
        self.part_summaries: list[str] = []
        self.stopped_at = ""

    def _fits(self, messages: list[dict]) -> bool:
        return self._count_messages(messages) + self.max_tokens <= self.target.n_ctx

    def _count_messages(self, messages: list[dict]) -> int:
        return len(chat_tokens(self.target, messages))

    def _answer(self, messages: list[dict], stage: str) -> Iterator[tuple[str, object, object]]:
        """Yield the cycles of one answer; its text lands in ``self._last_text``."""
        pieces = []
        self._last_finish = None
        if self.on_stage is not None:
            self.on_stage(stage)
        generation = self.generate(messages)
        for cycle in generation:
            pieces.append(cycle.text)
            self._last_finish = cycle.finish
            yield stage, cycle, generation
        self._last_text = "".join(pieces)

    def __iter__(self) -> Iterator[tuple[str, object, object]]:
        whole = build_messages(self.request, document=self.document)
        # Room for the document: the context, less the answer and the prompt around the document.
        overhead = self._count_messages(build_messages(part_request(99, 99), document=""))
        budget = self.target.n_ctx - self.max_tokens - overhead - 16
        if budget < 64:
            raise SpeculumError(f"The context of {self.target.n_ctx:,} tokens leaves no room for a document "
                                f"next to an answer of {self.max_tokens} tokens. Raise the context "
                                "size or lower max tokens.")
        if self._fits(whole):
            yield from self._answer(whole, "")
            self.text = self._last_text
            return

        # Too long: summarise in parts, then combine (in rounds, if even the summaries are long).
        count = lambda s: len(self.target.tokenize(s))  # noqa: E731
        texts = split_by_tokens(self.document, count, budget)
        round_no = 0
        while True:
            round_no += 1
            summaries = []
            for i, part in enumerate(texts, 1):
                stage = f"Part {i} of {len(texts)}" + (f" (round {round_no})" if round_no > 1 else "")
                messages = build_messages(document_message(part, part_request(i, len(texts))))
                yield from self._answer(messages, stage)
                summaries.append(self._last_text)
                if self._last_finish == Finish.STOPPED:
                    self.part_summaries = self.part_summaries or summaries
                    self.text = joined_summaries(summaries)
                    self.stopped_at = stage
                    return
            if round_no == 1:
                self.part_summaries = summaries
            combine = build_messages(combine_request(len(summaries)), document=joined_summaries(summaries))
            if self._fits(combine):
                break
            texts = split_by_tokens(joined_summaries(summaries), count, budget)
        yield from self._answer(combine, COMBINING)
        self.text = self._last_text
