"""Summarising a document longer than the model's context: parts, then the combine step.

The document is cut at paragraph, then line, sentence and word boundaries into parts
that each fit the token budget; joined again they give back the whole text, so nothing
is silently dropped. Each part is summarised, and the part summaries are combined (in
further rounds when even they do not fit).
"""

from __future__ import annotations

import re
from typing import Callable, Iterator, Sequence

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
