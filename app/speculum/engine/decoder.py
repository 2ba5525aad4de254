"""Speculative decoding: one generator of ``Cycle`` events per generation.

Each cycle: the policy picks a drafter and k; the drafter proposes; the target checks
``[last token] + draft`` in one pass; verification keeps a prefix and adds the
target's own token; the target's KV cache is trimmed to what was kept.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator, Sequence

import numpy as np

from ..errors import ContextFullError
from .backend import Backend, CachedSequence
from .cycle import CONTEXT_FULL, EOG, MAX_TOKENS, STOPPED, Cycle
from .drafters import LOOKUP, MODEL, NONE, Draft, ModelDrafter, PromptLookup
from .policy import Choice, FixedPolicy, Policy
from .sampling import RowProbs, SamplingParams
from .stats import Stats
from .verify import verify


class Decoder:
    """Owns the target (and optional draft) model and their KV caches across generations."""

    def __init__(self, target: Backend, draft: Backend | None = None, max_ngram: int = 3,
                 clock=time.perf_counter):
        self.clock = clock  # tests pass a fake clock that synthetic models advance
        self.target = target
        self.draft = draft
        self.sequence = CachedSequence(target)
        self.model_drafter = ModelDrafter(draft, clock) if draft is not None else None
        self.lookup = PromptLookup(max_ngram=max_ngram)
        self.stats = Stats()
        self.policies: dict[str, Policy] = {}

    def drafter(self, source: str) -> ModelDrafter | PromptLookup | None:
        return {MODEL: self.model_drafter, LOOKUP: self.lookup}.get(source)

    def policy_for(self, mode: str, k: int = 4, fixed_k: bool = False) -> Policy:
        """auto: the measured policy; draft / lookup: that drafter, k adapted (or fixed); off: plain."""
        if mode == "off" or fixed_k:
            return FixedPolicy(mode, k, has_draft_model=self.model_drafter is not None)
        if mode == "draft" and self.model_drafter is None:
            return FixedPolicy(mode, k, has_draft_model=False)  # raises the plain-words error
        if mode not in self.policies:  # one per mode, learning across this decoder's generations
            from .auto import AutoPolicy
            self.policies[mode] = AutoPolicy.for_decoder(self, mode)
        return self.policies[mode]

    def _propose(self, choice: Choice, context: list[int], k: int, sampling: SamplingParams,
                 rng: np.random.Generator) -> Draft:
        for source in (choice.source, choice.fallback):
            drafter = self.drafter(source)
            if drafter is None:
                continue
            if source == LOOKUP:
                draft = drafter.propose(context, k, min_match=choice.min_match)
            else:
                draft = drafter.propose(context, k, sampling, rng, choice.min_confidence)
            if draft.tokens:
                return draft
        return Draft(source=NONE)

    def generate(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int = 256,
        sampling: SamplingParams = SamplingParams(),
        policy: Policy | str = "off",
        k: int = 4,
        fixed_k: bool = False,
        stop: threading.Event | None = None,
        want_probs: bool = False,
    ) -> Iterator[Cycle]:
        """Yield one Cycle per target pass until end of generation, max tokens, stop or full context.

        Raises ContextFullError before decoding when the prompt alone does not fit.
        """
        if isinstance(policy, str):
            policy = self.policy_for(policy, k, fixed_k)
        target = self.target
        context = list(prompt)
        if not context:
            raise ValueError("empty prompt")
        if len(context) >= target.n_ctx:
            raise ContextFullError(
                f"The prompt is {len(context):,} tokens but the model's context holds "
                f"{target.n_ctx:,}. Shorten it, or summarise the document in parts."
            )
        rng = np.random.default_rng(sampling.seed)
        stats = self.stats = Stats()
        detok = target.detokenizer()

        # Prompt: reuse the cached prefix, decode the rest but the last token in chunks.
        t0 = self.clock()
        seq = self.sequence
        have = seq.sync(context[:-1])
        stats.prompt_tokens = len(context) - 1 - have
        seq.feed(context[have:-1], stop)
        if not (stop is not None and stop.is_set()):
            policy.prepare(seq, context[-1])
        stats.prompt_s = self.clock() - t0
        for drafter in (self.model_drafter, self.lookup):
            if drafter is not None:
                drafter.begin(context)

        generated = 0
        index = 0
        while True:
            start = self.clock()
            finish = None
            message = ""
            room = target.n_ctx - len(context)  # positions left after the pending last token
            if stop is not None and stop.is_set():
                finish = STOPPED
            elif generated >= max_tokens:
                finish = MAX_TOKENS
            elif room < 1:
                finish = CONTEXT_FULL
                message = (f"The context of {target.n_ctx:,} tokens is full; the answer so far is kept. "
                           "Start a new conversation or raise the context size.")
            if finish:
                policy.finish()
                tail = detok.flush()
                yield Cycle(index, NONE, 0, [], [], 0, [], [], tail, n_generated=generated,
                            finish=finish, message=message, policy=policy.describe())
                return

            choice = policy.choose(context)
            k_now = min(choice.k, room - 1, max_tokens - generated - 1)
            draft = Draft(source=NONE)
            if k_now > 0 and choice.source != NONE:
                draft = self._propose(choice, context, k_now, sampling, rng)
            t_drafted = self.clock()

            batch = [context[-1]] + draft.tokens
            logits = seq.decode(batch, rows=range(len(batch)))
            t_verified = self.clock()

            verdict = verify(logits, draft, sampling, rng)
            emitted = verdict.tokens
            p_drafted = verdict.p_drafted
            p_emitted: list[float] = []
            if want_probs:
                look_up_drafts = not p_drafted and draft.tokens
                probs = RowProbs(logits[:max(len(emitted), len(draft.tokens) if look_up_drafts else 0)])
                p_emitted = probs.at(emitted)
                if look_up_drafts:
                    p_drafted = probs.at(draft.tokens)

            for i, tok in enumerate(emitted):
                if target.is_eog(tok):
                    emitted = emitted[: i + 1]
                    finish = EOG
                    break
            if generated + len(emitted) >= max_tokens and finish is None:
                emitted = emitted[: max_tokens - generated]
                finish = MAX_TOKENS
            n_accepted = min(verdict.n_accepted, len(emitted))
            context.extend(emitted)
            generated += len(emitted)
            # Roll back what the target did not keep: all but the new last token stay cached.
            seq.trim(len(context) - 1)
            if self.model_drafter is not None and draft.source == MODEL:
                self.model_drafter.accept(context)
            self.lookup.accept(context)

            text = "".join(detok.feed(t) for t in emitted if not target.is_eog(t))
            if finish:
                text += detok.flush()
            cycle = Cycle(
                index=index,
                source=draft.source,
                k=k_now if draft.tokens else 0,
                drafted=draft.tokens,
                drafted_text=[target.token_text(t, special=False) for t in draft.tokens],
                n_accepted=n_accepted,
                emitted=emitted,
                emitted_text=[target.token_text(t, special=False) for t in emitted],
                text=text,
                p_drafted=p_drafted,
                p_emitted=p_emitted[: len(emitted)],
                draft_confidence=draft.confidence,
                match_length=draft.match_length,
                draft_s=t_drafted - start,
                draft_first_s=draft.first_s,
                verify_s=t_verified - t_drafted,
                n_generated=generated,
                finish=finish,
            )
            policy.observe(cycle)
            cycle.policy = policy.describe()
            cycle.overhead_s = self.clock() - t_verified
            stats.add(cycle)
            yield cycle
            if finish:
                policy.finish()
                return
            index += 1
