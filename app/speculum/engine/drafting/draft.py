"""What every drafter shares: the policy's ``Choice``, the ``Draft`` it returns, the
``Drafter`` interface (the whole of it, with defaults) and the ``DrafterInputs`` it is built
from. The drafters live beside this module, one each; ``drafters.py`` lists them.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np

from ..backend import Backend, CachedSequence
from ..promptcache import PromptCache
from ..sampling import SamplingParams, distribution, gumbel_max, sample
from ..vocabulary import Source
from .ngrammemory import NgramMemory

if TYPE_CHECKING:
    from ..grammar.state import Follows, GrammarState


@dataclass(frozen=True)
class Choice:
    """The policy's pick for one cycle: which drafter, how many tokens, and its thresholds."""

    source: Source
    k: int
    min_confidence: float = 0.0  # model drafts stop below this draft probability
    min_match: int = 1  # lookup drafts need a suffix match at least this long
    fallback: Source = Source.NONE  # hybrid: the drafter to use when the first has nothing
    # The answer's grammar state at the end of the context (set by the decoder, not the policy):
    # a model draft is drawn from the model's distribution kept to what the grammar allows.
    grammar: "GrammarState | None" = field(default=None, compare=False)


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    source: Source = Source.NONE
    # Per drafted token, the draft's distribution q (rows, V) when sampling; None means a
    # point mass on each token (greedy drafts and lookup drafts).
    q: np.ndarray | None = None
    confidence: list[float] = field(default_factory=list)  # the draft's own p of each token
    match_length: int = 0  # lookup: length of the context suffix that matched
    first_s: float = 0.0  # model drafts: seconds to catch up and propose the first token
    caught_up: int = 0  # model drafts: context tokens decoded before the first (a new prompt: many)
    # Model drafts: single-token decodes after the first token. One more than the tokens after
    # the first when the draft stopped early: the token it refused had to be decoded to be judged.
    steps: int = 0

    def __len__(self) -> int:
        return len(self.tokens)


class Match(NamedTuple):
    """Where a copying drafter's text matches the context's end: the copy it would make."""

    end: int  # position of its last token (-1: none)
    length: int  # matched suffix length in tokens (0: none)
    available: int  # tokens after it that a draft could copy


NO_MATCH = Match(-1, 0, 0)


class Drafter(ABC):
    """Everything the decoder and the policy ask of a drafter, as llama.cpp's
    ``common_speculative`` declares its whole interface for every drafter. ``build`` and
    ``propose`` are each drafter's own; the rest has defaults for the drafters that do nothing
    there (most of them)."""

    source: Source
    # The most tokens one draft can have (None: no cap of its own); chained MTP heads: one per head.
    max_k: int | None = None
    # The drafter's own model sequence, whose states the prompt cache keeps (None: it holds none).
    sequence: CachedSequence | None = None

    @classmethod
    @abstractmethod
    def build(cls, inputs: DrafterInputs) -> "Drafter | None":
        """The drafter these inputs allow; None when they do not allow one (no draft model, no NextN layers)."""

    @abstractmethod
    def propose(self, context: Sequence[int], k: int, choice: Choice, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Up to k tokens following ``context``."""

    def begin(self, context: Sequence[int]) -> None:
        """A generation starts from ``context``."""

    def accept(self, context: Sequence[int]) -> None:
        """The target kept ``context``: drop the rest."""

    def expect(self, tokens: Sequence[int]) -> None:
        """The next generation's predicted output (a client's Predicted Outputs; empty: none)."""

    def constrain(self, state: "Follows | None") -> None:
        """The answer's grammar state at the context's end, before each choice (None: no grammar)."""

    def match(self, context: Sequence[int]) -> Match:
        """A copying drafter's match at the end of ``context`` (the policy's acceptance tables
        are per match length); NO_MATCH for a drafter that does not copy."""
        return NO_MATCH

    def behind(self, context: Sequence[int]) -> int:
        """Tokens of ``context`` it would read before its first draft token (its cost the policy
        weighs); 0 for a drafter with no model of its own to catch up."""
        return 0

    def holds(self, context: Sequence[int]) -> bool:
        """Whether its own model's context holds ``context`` (it may be smaller than the target's)."""
        return True

    def read(self, context: Sequence[int], stop: threading.Event | None = None,
             on_chunk: Callable[[int, int], None] | None = None, chunk: int | None = None) -> None:
        """Read ``context`` into its own model now, as part of reading the prompt (where it drafts
        every cycle); nothing for a drafter with no model of its own."""


@dataclass(frozen=True)
class DrafterInputs:
    """What a drafter may be built from."""

    target: Backend
    draft: Backend | None = None  # a second model of the same tokenizer
    clock: Callable[[], float] = time.perf_counter
    max_ngram: int | None = None  # lookup: cap on the match length (None: as long as the text allows)
    prompt_cache: PromptCache | None = None  # a drafting model's saved states too
    memory: NgramMemory | None = None  # what this machine wrote and read before


def draft_one_by_one(logits: np.ndarray, k: int, next_logits: Callable[[int, int], np.ndarray], choice: Choice,
                     sampling: SamplingParams, rng: np.random.Generator, since: float,
                     clock: Callable[[], float],
                     position: int) -> tuple[list[int], np.ndarray | None, list[float], float, int]:
    """A model's draft, a token at a time from ``logits``: greedy or sampled, stopping early
    once a token's own probability falls below ``choice.min_confidence``. ``position``: the first
    drafted token's in the sequence (the context's length): drafter-invariant sampling draws
    each with the noise the target will use there (``gumbel_max``).
    ``next_logits(i, token)`` decodes the i-th drafted token and returns the logits after it.
    Returns the tokens, their q rows when sampling, their confidences, the seconds from
    ``since`` to the first token, and how many times ``next_logits`` ran."""
    tokens: list[int] = []
    qs: list[np.ndarray] = []
    conf: list[float] = []
    first_s = 0.0
    steps = 0
    walk = choice.grammar.clone() if choice.grammar is not None else None  # the grammar down the draft
    for i in range(k):
        if sampling.greedy:
            tok = int(np.argmax(logits)) if walk is None else walk.best(logits)
            # (unmasked: a lower bound on the masked confidence, without a whole-vocabulary mask)
            c = 1.0 / float(np.exp(np.asarray(logits, np.float32) - logits[tok]).sum())
        else:
            q = distribution(logits, sampling)
            if walk is not None:  # the proposal is kept to what the grammar allows
                head = None if sampling.filtered else walk.masked_head(q)
                q = head if head is not None else distribution(walk.mask(logits), sampling)
            if not sampling.drafter_invariant:
                tok = sample(q, rng)
            elif walk is None:
                tok = gumbel_max(logits, sampling, position + i)
            else:  # as the target's row is read under the grammar (verify.TargetRows.gumbel)
                tok = (gumbel_max(walk.mask(logits), sampling, position + i) if sampling.filtered
                       else gumbel_max(logits[:walk.n_vocab], sampling, position + i, allows=walk.allowed_among))
            qs.append(q)
            c = float(q[tok])
        if tokens and c < choice.min_confidence:
            break
        tokens.append(tok)
        conf.append(c)
        if i == 0:
            first_s = clock() - since
        if i + 1 < k:
            if walk is not None:
                walk.accept(tok)
            logits = next_logits(i, tok)
            steps += 1
    return tokens, np.stack(qs[: len(tokens)]) if qs else None, conf, first_s, steps
