"""Whether this build and machine give a row the same logits whatever its pass's size.

Speculative output is plain decoding's token for token only if a verify pass of k+1 rows
computes each row exactly as a single step would: greedy verification compares the target's
argmax, and at a near tie (two top logits 0.03 apart is common) a row computed by another
kernel can take the other token. ``check_rows`` decodes the same tokens one at a time and in
one pass and compares the rows bit for bit; the doctor, the self-test and the tests ask it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .backend import Backend


@dataclass(frozen=True)
class RowCheck:
    pass_size: int
    identical: int  # rows of the pass equal to their single step, bit for bit
    max_difference: float  # the largest |logit difference| over those rows

    @property
    def invariant(self) -> bool:
        return self.identical == self.pass_size


def check_rows(model: Backend, prompt: Sequence[int], follow: Sequence[int]) -> RowCheck:
    """Read ``prompt``, then compare ``follow`` decoded one token at a time with ``follow``
    decoded in one pass. The model's cache is left empty."""
    return next(iter(check_passes(model, prompt, follow, (len(follow),)).values()))


def _read(model: Backend, prompt: Sequence[int], chunk: int | None) -> None:
    """The prompt read afresh, in pieces of ``chunk`` tokens (None: as prefill reads it)."""
    model.trim(0)
    if chunk is None:
        model.prefill(list(prompt))
        return
    for start in range(0, len(prompt), chunk):
        model.decode(list(prompt[start:start + chunk]), rows=())


def check_passes(model: Backend, prompt: Sequence[int], follow: Sequence[int], sizes: Sequence[int],
                 chunks: Sequence[int | None] = (None,)) -> dict[str, RowCheck]:
    """Each row of ``follow`` decoded in passes of each of ``sizes``, after ``prompt`` read in
    each of ``chunks``, against the same row decoded alone after the prompt read whole."""
    _read(model, prompt, None)
    base = model.n_past
    singles = np.stack([model.decode([token], rows=(0,))[0].copy() for token in follow])
    checks = {}
    for chunk in chunks:
        for size in sizes:
            _read(model, prompt, chunk)
            assert model.n_past == base, "the prompt's length changed with its chunking"
            rows = []
            for start in range(0, len(follow), size):
                piece = list(follow[start:start + size])
                rows.append(model.decode(piece, rows=range(len(piece))).copy())
            together = np.concatenate(rows)
            equal = sum(bool(np.array_equal(a, b)) for a, b in zip(singles, together))
            checks[f"pass of {size}, prompt in {chunk or 'one'}"] = RowCheck(
                len(follow), equal, float(np.max(np.abs(singles - together))))
    model.trim(0)
    return checks
