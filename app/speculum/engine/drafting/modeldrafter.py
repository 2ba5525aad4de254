"""The draft model: a small model of the same tokenizer drafts for the target, its KV cache
kept in step with the target's (synced to the accepted context before every proposal)."""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import numpy as np

from ..backend import Backend, CachedSequence
from ..promptcache import PromptCache
from ..sampling import SamplingParams
from ..vocabulary import Role, Source
from .draft import Choice, Draft, Drafter, DrafterInputs, draft_one_by_one


class ModelDrafter(Drafter):
    source = Source.MODEL

    def __init__(self, model: Backend, clock: Callable[[], float] = time.perf_counter,
                 prompt_cache: PromptCache | None = None):
        self.model = model
        self.sequence = CachedSequence(model, prompt_cache, owner=Role.DRAFT)
        self.clock = clock
        self._drafted = False  # since the last accept: only then is there anything to drop
        # A new prompt since the draft model last read: its first read resumes from the prompt
        # cache. Not before: auto mode may never draft with the model on this prompt.
        self._new_prompt = True

    @classmethod
    def build(cls, inputs: DrafterInputs) -> "ModelDrafter | None":
        return cls(inputs.draft, inputs.clock, inputs.prompt_cache) if inputs.draft is not None else None

    def _sync(self, context: Sequence[int]) -> int:
        if self._new_prompt:
            self._new_prompt = False
            return self.sequence.resume(context)
        return self.sequence.sync(context)

    def propose(self, context: Sequence[int], k: int, choice: Choice, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Up to k tokens following ``context``; stops early below ``choice.min_confidence``."""
        if k <= 0:
            return Draft(source=self.source)
        seq = self.sequence
        have = self._sync(context)
        if have == len(context):  # nothing new to decode: step back one to get logits
            seq.trim(have - 1)
            have -= 1
        # Room in the draft's own context: it may be smaller than the target's.
        k = min(k, self.model.n_ctx - len(context))
        if k <= 0:
            return Draft(source=self.source)
        start = self.clock()
        pending = list(context[have:])
        if len(pending) <= self.model.n_batch:
            logits = seq.decode(pending, rows=(len(pending) - 1,))[0]
        else:  # a long catch-up (a new chat turn): in chunks, logits from the last one
            seq.feed(pending[:-1])
            logits = seq.decode(pending[-1:])[0]
        tokens, q, conf, first_s, steps = draft_one_by_one(logits, k, lambda i, tok: seq.decode([tok])[0], choice,
                                                    sampling, rng, start, self.clock, len(context))
        self._drafted = bool(tokens)
        return Draft(tokens, self.source, q, conf, first_s=first_s, caught_up=len(pending), steps=steps)

    def behind(self, context: Sequence[int]) -> int:
        """Tokens of ``context`` the draft model would read before its first draft token."""
        # The whole common prefix, not a guess from its end: with a longer earlier prompt in its
        # cache, a guess read a new 1,300-token document as 8 tokens behind, and auto mode
        # tried the draft model there and paid seconds to read it (0.95x plain).
        return len(context) - self.sequence.reusable(context)

    def read(self, context: Sequence[int], stop: threading.Event | None = None,
             on_chunk: Callable[[int, int], None] | None = None, chunk: int | None = None) -> None:
        """Read ``context`` into the draft model's cache now, as part of reading the prompt
        (``CachedSequence.feed``'s arguments). Where it drafts every cycle, its first draft would
        otherwise read a whole new document inside the first cycle, seconds with no progress
        shown. Nothing is read that its own context could not hold."""
        if self.holds(context):
            self.sequence.feed(context[self.sequence.resume(context):], stop, on_chunk, chunk=chunk)

    def holds(self, context: Sequence[int]) -> bool:
        """Whether the draft model's own context (it may be smaller than the target's) holds this."""
        return len(context) < self.model.n_ctx

    def begin(self, context: Sequence[int]) -> None:
        """Nothing to read yet: ``propose`` syncs the KV cache to the context it is given."""
        self._new_prompt = True

    def accept(self, context: Sequence[int]) -> None:
        """Drop drafted tokens the target rejected (the next propose syncs anyway)."""
        if self._drafted:
            self.sequence.sync(context)
            self._drafted = False
