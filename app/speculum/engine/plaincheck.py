"""An answer checked against plain decoding: the proof, on demand, that speculation changed nothing.

The answer's prompt is read afresh, as a cold plain decode reads it (in the decoder's chunks,
nothing taken from the prompt cache), and then the answer's own tokens are decoded one at a
time, each row computed as plain decoding computes it. Up to the first token where the greedy
choice of a row differs from the answer's token, that is plain decoding: so the answer is
plain decoding's if and only if every row's argmax is the answer's next token. Where they part,
the row tells both tokens' logits (how near the tie was).

Only the target decides a greedy answer, so only its rows are computed. Whether identity is
promised on this build (``not_promised``) is said beside the result, never instead of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..errors import ContextFullError, SpeculumError
from .vocabulary import Device, Word

if TYPE_CHECKING:
    from .decoder import Decoder

Progress = Callable[[int, int], None]  # (answer tokens checked, of how many)
CONTEXT_CHARS = 40  # of the answer's text before a difference, shown to find it by


class Outcome(Word):
    IDENTICAL = "identical"
    DIFFERS = "differs"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class TokenAt:
    """A token at the row where the two part, with the target's logit of it in that row."""
    token: int
    text: str  # as the vocabulary spells it (special tokens by name): model output, shown as plain text
    logit: float

    @property
    def shown(self) -> str:
        """Quoted, with newlines and other invisible characters escaped."""
        return repr(self.text)


@dataclass(frozen=True)
class PlainCheck:
    outcome: Outcome
    tokens: int  # the answer's tokens
    checked: int  # of them, found equal to plain decoding's before it parted or was cancelled
    answer: TokenAt | None = None  # where it differs: the answer's token there
    plain: TokenAt | None = None  # and plain decoding's
    not_promised: str = ""  # why this build does not promise identity ("" where it does)
    before: str = ""  # where it differs: the end of the answer's text before that token, to find it by

    @property
    def index(self) -> int | None:
        """The first token (from 0) where the answer parts from plain decoding."""
        return self.checked if self.outcome == Outcome.DIFFERS else None

    def words(self) -> str:
        """The result in one sentence, then (where it is so) that identity is not promised here."""
        if self.outcome == Outcome.IDENTICAL:
            said = f"Identical to plain decoding ({self.tokens:,} tokens)."
        elif self.outcome == Outcome.CANCELLED:
            said = f"Check cancelled: the first {self.checked:,} of {self.tokens:,} tokens are plain decoding's."
        else:
            after = f", after {'…' * (len(self.before) == CONTEXT_CHARS)}{self.before!r}" if self.before else ""
            said = (f"Differs from plain decoding at token {self.index:,} of {self.tokens:,}{after}: "
                    f"{self.answer.shown} (id {self.answer.token}, logit {self.answer.logit:.4f}) "
                    f"vs plain {self.plain.shown} (id {self.plain.token}, logit {self.plain.logit:.4f}).")
        return said + (f" {self.not_promised}" if self.not_promised else "")

    def to_json(self) -> dict:
        out = {"outcome": self.outcome, "tokens": self.tokens, "checked": self.checked,
               "promised": not self.not_promised, "words": self.words()}
        if self.outcome == Outcome.DIFFERS:
            out["index"] = self.index
            out["before"] = self.before
            for name, at in (("answer", self.answer), ("plain", self.plain)):
                out[name] = {"token": at.token, "text": at.text, "logit": at.logit}
        return out


def not_promised(decoder: Decoder) -> str:
    """Why this build and these settings do not promise that a speculative answer at temperature
    0 is plain decoding's, in words; "" where they do (the target on the CPU, with Speculum's
    row-invariance switch built and on: docs/notes/issue46-exact.md)."""
    from .llama import cpu_settings

    facts = decoder.target.facts
    device = facts.device if facts is not None else Device.CPU
    if device != Device.CPU:
        return (f"Identity is not promised here: the target runs on {facts.backend}, whose kernels the "
                "row-invariance switch does not cover.")
    if not cpu_settings.build_has_row_switch():
        return ("Identity is not promised on this build: its llama.cpp has no row-invariance switch "
                "(scripts/setup-env.sh builds one that has).")
    if not cpu_settings.rows_invariant_asked(cpu_settings.in_effect()):
        return ("Identity is not promised with exact speculation off: a verify pass may compute a row "
                "unlike a single step (--exact turns it on; in the window, Settings ▸ Exactness).")
    return ""


def check_plain(decoder: Decoder, prompt: Sequence[int], answer: Sequence[int],
                progress: Progress | None = None, cancelled: Callable[[], bool] = lambda: False) -> PlainCheck:
    """Decode ``prompt`` afresh and then ``answer`` one token at a time on ``decoder``'s target,
    comparing each row's greedy token with the answer's. ``progress(checked, total)`` after the
    prompt and after each token; ``cancelled()`` is asked between decodes. The target's cache
    holds the prompt and the checked tokens afterwards (what the prompt cache saved is kept)."""
    from .decoder import PROMPT_CHUNK  # (here: the window unpickles this module's results without the decoder)

    target, sequence = decoder.target, decoder.sequence
    prompt, answer = [int(t) for t in prompt], [int(t) for t in answer]
    words = not_promised(decoder)
    if not prompt or not answer:
        raise SpeculumError("There is nothing to check: the answer has no tokens.")
    if any(not 0 <= t < target.n_vocab for t in prompt + answer):
        raise SpeculumError("The answer's tokens are not this model's: load the model that wrote it.")
    if len(prompt) + len(answer) - 1 > target.n_ctx:
        raise ContextFullError(f"The prompt and the answer take {len(prompt) + len(answer) - 1:,} tokens, more "
                               f"than the context of {target.n_ctx:,}: load the model with a larger context.")
    sequence.keep()  # what the conversation holds now stays in the prompt cache for its next turn
    sequence.sync([])  # read afresh: no state from the speculative run serves the check
    report = progress or (lambda checked, total: None)
    report(0, len(answer))
    row = None
    for start in range(0, len(prompt), PROMPT_CHUNK):  # as the decoder reads a cold prompt
        if cancelled():
            return PlainCheck(Outcome.CANCELLED, len(answer), 0, not_promised=words)
        final = start + PROMPT_CHUNK >= len(prompt)
        rows = sequence.feed(prompt[start:start + PROMPT_CHUNK], last_row=final)
        row = rows[0] if final else None  # the prompt's last token's row gives the first token
    for i, token in enumerate(answer):
        if i:
            if cancelled():
                return PlainCheck(Outcome.CANCELLED, len(answer), i, not_promised=words)
            row = np.array(sequence.decode([answer[i - 1]], rows=(0,))[0])  # one plain step
        best = int(np.argmax(row))  # greedy verification's and plain decoding's choice
        if best != token:
            return PlainCheck(Outcome.DIFFERS, len(answer), i, _at(target, row, token), _at(target, row, best), words,
                              target.detokenize(answer[:i])[-CONTEXT_CHARS:])
        report(i + 1, len(answer))
    return PlainCheck(Outcome.IDENTICAL, len(answer), len(answer), not_promised=words)


def _at(target, row: np.ndarray, token: int) -> TokenAt:
    return TokenAt(token, target.token_text(token, special=True), float(row[token]))
