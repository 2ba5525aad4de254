"""Speculative decoding: one generator of ``Cycle`` events per generation.

Each cycle: the policy picks a drafter and k; the drafter proposes; the target checks
``[last token] + draft`` in one pass; verification keeps a prefix and adds the
target's own token; the target's KV cache is trimmed to what was kept.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from ..errors import ContextFullError, SpeculumError
from .policy.auto import AutoPolicy, default_store
from .backend import Backend, CachedSequence
from .policy.costs import calibrate
from .cycle import Cycle
from .drafting.draft import Choice, Draft, Drafter, DrafterInputs
from .drafting.drafters import build_drafters
from .drafting.ngrammemory import NgramMemory
from .policy.fixed import FixedPolicy, Policy
from .promptcache import PromptCache
from .sampling import RowProbs, SamplingParams
from .stats import Stats
from .verify import Constraints, TargetRows, Verdict, verify
from .vocabulary import Device, Finish, Mode, Role, Source

FIRST_TOKEN = Choice(Source.NONE, 0)  # every generation's first cycle: plain (see _cycles)

if TYPE_CHECKING:
    from .grammar.state import Grammar


# Prompt tokens per decode while someone watches the progress: small enough for a steady
# "340 / 1,200", large enough to keep batched decoding's speed.
PROMPT_CHUNK = 128


class Generation:
    """One generation: iterating it yields its Cycles. ``stats`` are its own, filled as it runs
    (the prompt's counts once the first cycle is out), and ``prompt_total`` is its prompt's size."""

    def __init__(self, cycles: Iterator[Cycle], stats: Stats, prompt_total: int):
        self._cycles = cycles
        self.stats = stats
        self.prompt_total = prompt_total

    def __iter__(self) -> Iterator[Cycle]:
        return self

    def __next__(self) -> Cycle:
        return next(self._cycles)


class Decoder:
    """Owns the target (and optional draft) model and their KV caches across generations."""

    def __init__(self, target: Backend, draft: Backend | None = None, max_ngram: int | None = None,
                 clock=time.perf_counter, prompt_cache: PromptCache | None = None,
                 memory: NgramMemory | None = None):
        self.clock = clock  # tests pass a fake clock that synthetic models advance
        self.target = target
        self.draft = draft
        # Saved states of earlier sequences, both models' (None: only the live one is reused).
        self.prompt_cache = prompt_cache
        self.sequence = CachedSequence(target, prompt_cache, owner=Role.TARGET)
        self.memory = memory  # what this machine wrote and read before, for the memory drafter
        # Every registered drafter the models allow, by source (drafters.DRAFTERS).
        self.drafters: dict[Source, Drafter] = build_drafters(
            DrafterInputs(target, draft, clock, max_ngram, prompt_cache, memory))
        self.latest = Generation(iter(()), Stats(), 0)  # the last generation asked for
        self.policies: dict[Mode, Policy] = {}
        # A recurrent target rolls back only so many rejected drafts (llama.cpp's snapshots).
        self.max_draft = 1 << 30 if target.max_rollback is None else target.max_rollback

    def policy_for(self, mode: Mode | str, k: int | None = None) -> Policy:
        """auto: the measured policy; draft / lookup: that drafter, k adapted (None) or fixed; off: plain."""
        mode = Mode(mode)
        has_draft_model = Source.MODEL in self.drafters
        has_mtp = Source.MTP in self.drafters
        if mode == Mode.MTP and not has_mtp and self.target.mtp_unavailable:
            raise SpeculumError(self.target.mtp_unavailable)
        assistant = self.target.assistant_path
        if mode == Mode.DRAFT and not has_draft_model and assistant is not None:
            raise SpeculumError(f"{assistant.name} is a Gemma 4 assistant: it drafts in MTP mode (--mode mtp), "
                                "on the target's own KV cache, not as a draft model.")
        fixed = mode == Mode.OFF or (k is not None and mode != Mode.AUTO)  # auto always picks k itself
        if (fixed or (mode == Mode.DRAFT and not has_draft_model)
                or (mode == Mode.MTP and not has_mtp)):  # (no drafter: FixedPolicy's plain-words error)
            return FixedPolicy.for_mode(mode, k, has_draft_model, has_mtp)
        if mode not in self.policies:  # one per mode, learning across this decoder's generations
            device = self.target.facts.device if self.target.facts is not None else Device.CPU
            self.policies[mode] = AutoPolicy(self.drafters, mode, device, default_store(self.target, self.draft),
                                             self.clock)
        return self.policies[mode]

    @property
    def stats(self) -> Stats:
        """The latest generation's stats, for scripts and tests: the engine reads its Generation's."""
        return self.latest.stats

    def generate(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int = 256,
        sampling: SamplingParams = SamplingParams(),
        policy: Policy | Mode | str = Mode.OFF,
        k: int | None = None,
        stop: threading.Event | None = None,
        want_probs: bool = False,
        on_prompt: Callable[[int, int], None] | None = None,
        prediction: Sequence[int] = (),
        grammar: Grammar | None = None,
        logprobs: int | None = None,
        origin: str | None = None,
    ) -> Generation:
        """One Cycle per target pass until end of generation, max tokens, stop or full context,
        with the generation's own Stats and prompt size (``Generation``).

        ``k``: None lets draft and lookup modes adapt the draft length; a number fixes it.
        ``on_prompt(read, total)``: prompt tokens read so far, after each chunk of the prompt (in
        draft mode both models read it, and both reads count).
        ``prediction``: tokens the caller expects the answer to hold (auto mode drafts from them).
        ``grammar``: the answer follows it (engine.grammar), and ends where it allows only the end.
        ``logprobs``: None, or n: each emitted token's log-probability and the n likeliest (Cycle).
        ``origin``: whose context the n-gram memory keeps it under (a conversation's id, "api"),
        once the generation has ended and its last event been taken; None: it is not kept.
        Raises ContextFullError before decoding when the prompt alone does not fit.
        """
        stats = Stats()
        self.latest = Generation(self._cycles(prompt, stats, max_tokens, sampling, policy, k, stop, want_probs,
                                              on_prompt, prediction, grammar, logprobs, origin), stats,
                                 len(prompt))
        return self.latest

    def _cycles(self, prompt, stats, max_tokens, sampling, policy, k, stop, want_probs, on_prompt,
                prediction, grammar, logprobs, origin) -> Iterator[Cycle]:
        if isinstance(policy, str):
            policy = self.policy_for(policy, k)
        for drafter in self.drafters.values():
            drafter.expect(prediction)  # the prediction drafter's; empty clears the previous generation's
        context, pending = self._prefill(prompt, policy, stop, on_prompt, stats)
        constraints = Constraints.start(self.target, grammar, sampling, context)
        rng = np.random.default_rng(sampling.seed)
        # Greedy, or noise keyed by a seed: the answer is a function of its prompt, and an earlier
        # answer to it may be recalled whole (rejection sampling's draws depend on the drafts).
        policy.begin(repeatable=sampling.greedy or sampling.drafter_invariant)
        detok = self.target.detokenizer()
        generated = 0
        for index in itertools.count():
            start = self.clock()
            finish, message = self._ending(context, generated, max_tokens, stop)
            if finish:
                policy.finish()
                yield self._record(index, policy, Draft(), 0, [], 0, detok.flush(), generated, finish, message=message)
                self._remember(context, origin)
                return

            # Draft: the policy's choice, never past the context or max tokens. The first token
            # comes from one plain pass (none when the prompt's last chunk gave its row), as
            # llama-server's does: drafting first would hold it back by a draft and a wider pass.
            if index:
                for drafter in self.drafters.values():
                    drafter.constrain(constraints.grammar)
            choice = constraints.guide(policy.choose(context)) if index else FIRST_TOKEN
            k_now = min(choice.k, self.target.n_ctx - len(context) - 1, max_tokens - generated - 1,
                        self.max_draft)
            draft = self._propose(choice, context, k_now, sampling, rng, constraints) if k_now > 0 else Draft()
            t_drafted = self.clock()

            # Verify: one target pass over the pending last token and the draft, each row shaped
            # (penalties, grammar) by what precedes it. Plain decoding's first cycle has its row
            # from the prompt's last chunk (``pending``): no pass, and no pass time to learn.
            if pending is None:
                logits = self.sequence.decode([context[-1]] + draft.tokens, rows=range(len(draft) + 1))
                t_verified = self.clock()
            else:
                logits, t_verified, pending = pending, t_drafted, None
            rows = constraints.rows(logits, draft)
            verdict = verify(rows, draft, sampling, rng, position=len(context))
            probs = _display_probs(rows, draft, verdict) if want_probs else (verdict.p_drafted, [])

            # Keep: the accepted drafts and the target's own token, cut at end of generation.
            emitted, finish = self._keep(verdict.tokens, generated, max_tokens)
            n_accepted = min(verdict.n_accepted, len(emitted))
            scored = rows.logprobs(emitted, logprobs) if logprobs is not None else ([], [], [])
            constraints.follow(rows, emitted, n_accepted)  # (rows read the answer before it: last)
            context.extend(emitted)
            generated += len(emitted)

            # Trim: the target and drafters forget what was not kept.
            self._trim(context)

            text = "".join(detok.feed(t) for t in emitted if not self.target.is_eog(t))
            text += detok.flush() if finish else ""
            policy.observe(draft, n_accepted, t_drafted - start, t_verified - t_drafted)
            cycle = self._record(index, policy, draft, k_now, emitted, n_accepted, text, generated, finish,
                                 times=(start, t_drafted, t_verified), probs=probs, scored=scored)
            stats.add(cycle)
            yield cycle
            if finish:
                policy.finish()
                self._remember(context, origin)
                return

    # -- the steps --------------------------------------------------------------------------

    def _prefill(self, prompt: Sequence[int], policy: Policy, stop: threading.Event | None,
                 on_prompt: Callable[[int, int], None] | None = None,
                 stats: Stats | None = None) -> tuple[list[int], np.ndarray | None]:
        """Check the prompt fits, decode what the cache lacks of it (``_read_prompt``) and start
        the drafters; returns the context and, where the prompt's last token was read with the
        rest, its row of logits. No calibration here: the policy learns costs from the passes
        made anyway (a prompt chunk's decode is one of them)."""
        context = list(prompt)
        if not context:
            raise ValueError("empty prompt")
        if len(context) >= self.target.n_ctx:
            raise ContextFullError(
                f"The prompt is {len(context):,} tokens but the model's context holds "
                f"{self.target.n_ctx:,}. Shorten it, or summarise the document in parts."
            )
        stats = stats if stats is not None else Stats()  # the generation's own
        t0 = self.clock()
        known = context[:-1]  # the last token is decoded by the first cycle, for its logits
        # Live, or put back from the prompt cache. The same prompt again: its last token's row
        # was kept with it, and the first token needs no pass.
        have = self.sequence.resume(context if self.sequence.keeps_rows else known)
        held = self.sequence.last_row(context) if have == len(context) else None
        if held is None and have > len(known):
            have = self.sequence.sync(known)
        stats.prompt_cached = have
        to_read = len(known) - min(have, len(known))
        last = [t0]
        # Where the draft model drafts every cycle (draft mode), it reads the prompt here too,
        # after the target: progress counts both reads.
        model = self.drafters.get(Source.MODEL)
        reads_ahead = model is not None and [s for s in policy.sources if s != Source.PREDICTION] == [Source.MODEL]
        draft_behind = model.behind(known) if reads_ahead and model.holds(known) else 0
        total = len(known) + draft_behind

        def chunk_read(n_read: int, n_chunk: int) -> None:
            now = self.clock()
            policy.observe_prompt(n_chunk, now - last[0])
            last[0] = now
            if on_prompt is not None:
                on_prompt(have + n_read, total)

        def draft_read(n_read: int, n_chunk: int) -> None:
            on_prompt(len(known) + n_read, total)

        if on_prompt is not None and (to_read or draft_behind):
            on_prompt(len(known) - to_read, total)
        chunk = PROMPT_CHUNK if on_prompt else None
        # The last token is read with the prompt: its row gives the first token, with no pass of its own.
        pending = held if held is not None else self._read_prompt(known[have:], context[-1], stop, chunk_read, chunk)
        # Less than to_read when stopped; the last token is the first cycle's, as when it decodes it.
        stats.prompt_tokens = max(0, min(len(self.sequence.tokens), len(known)) - have)
        if draft_behind and not (stop is not None and stop.is_set()):
            model.read(known, stop, draft_read if on_prompt else None, chunk=chunk)
        stats.prompt_s = self.clock() - t0
        for drafter in self.drafters.values():
            drafter.begin(context)
        return context, pending

    def _read_prompt(self, tokens: Sequence[int], last: int, stop: threading.Event | None,
                     on_chunk: Callable[[int, int], None], chunk: int | None) -> np.ndarray | None:
        """Decode ``tokens`` (the prompt's unread part before its last token) and the ``last``
        token with them, in their last chunk: its row of logits (a copy) is returned for the
        first cycle, which then needs no pass of its own. None when the prompt was all cached
        (the first cycle reads the last token) or when ``stop`` ended the reading."""
        if not tokens:
            return None
        return self.sequence.feed([*tokens, last], stop, lambda read, size: on_chunk(min(read, len(tokens)), size),
                                  chunk=chunk, last_row=True)

    def _remember(self, context: list[int], origin: str | None) -> None:
        """Keep the prompt and its answer in the n-gram memory, and the models' states in the
        prompt cache (after the answer is out: a file write, and copies of the KV caches that the
        next prompt would otherwise make before its first token)."""
        if self.memory is not None and origin is not None:
            self.memory.remember(context, origin)
        for sequence in self._sequences():
            sequence.keep()

    def _sequences(self) -> list[CachedSequence]:
        """The target's sequence, and each drafter's own (the draft model's; a stand-in drafter
        may hold none)."""
        return [self.sequence] + [d.sequence for d in self.drafters.values() if d.sequence is not None]

    def forget_prompts(self) -> None:
        """Nothing of any prompt cached any more, in either model: the next one is read cold."""
        for sequence in self._sequences():
            sequence.sync([])
        if self.prompt_cache is not None:
            self.prompt_cache.clear()

    def calibrate(self, interrupted: Callable[[], bool] = lambda: False, mode: Mode = Mode.AUTO) -> bool:
        """Measure the verify curve (and the draft model's cost) for ``mode``'s policy, one pass
        at a time, stopping as soon as ``interrupted()``: for idle time after loading, while
        the user types. True when the policy's costs are now fully measured."""
        policy = self.policy_for(mode)
        if not isinstance(policy, AutoPolicy) or not policy.needs_calibration:
            return True
        draft = self.draft if Source.MODEL in self.drafters else None
        token = self.sequence.tokens[-1] if self.sequence.tokens else 0
        measured = calibrate(self.target, draft, token, self.clock, interrupted)
        policy.calibrated(measured)
        for other in self.policies.values():  # draft / lookup modes share the machine's costs
            if other is not policy and isinstance(other, AutoPolicy):
                other.calibrated(measured)
        policy.save()
        return not policy.needs_calibration

    def _ending(self, context: list[int], generated: int, max_tokens: int,
                stop: threading.Event | None) -> tuple[Finish | None, str]:
        """Why the generation ends before another pass (and words for the user), or (None, "")."""
        if stop is not None and stop.is_set():
            return Finish.STOPPED, ""
        if generated >= max_tokens:
            return Finish.MAX_TOKENS, ""
        if len(context) >= self.target.n_ctx:  # no position left after the pending last token
            return Finish.CONTEXT_FULL, (f"The context of {self.target.n_ctx:,} tokens is full; the answer so far "
                                         "is kept. Start a new conversation or raise the context size.")
        return None, ""

    def _propose(self, choice: Choice, context: list[int], k: int, sampling: SamplingParams,
                 rng: np.random.Generator, constraints: Constraints = Constraints()) -> Draft:
        """The chosen drafter's draft, within the grammar; when it has none, the fallback's (hybrid)."""
        for source in (choice.source, choice.fallback):
            drafter = self.drafters.get(source)
            draft = drafter.propose(context, k, choice, sampling, rng) if drafter is not None else None
            if draft is not None:
                draft = constraints.within(draft)
            if draft is not None and draft.tokens:
                return draft
        return Draft()

    def _keep(self, tokens: list[int], generated: int, max_tokens: int) -> tuple[list[int], Finish | None]:
        """The verified tokens up to and including an end-of-generation token, within max tokens."""
        for i, tok in enumerate(tokens):
            if self.target.is_eog(tok):
                return tokens[: i + 1], Finish.EOG
        if generated + len(tokens) >= max_tokens:
            return tokens[: max_tokens - generated], Finish.MAX_TOKENS
        return tokens, None

    def _trim(self, context: list[int]) -> None:
        # All but the new last token stay cached in the target; it is decoded with the next draft.
        self.sequence.trim(len(context) - 1)
        if len(self.sequence.tokens) < len(context) - 1:  # a recurrent state had to start over
            self.sequence.feed(context[len(self.sequence.tokens):-1])
        for drafter in self.drafters.values():
            drafter.accept(context)

    def _record(self, index: int, policy: Policy, draft: Draft, k: int, emitted: list[int], n_accepted: int, text: str,
                generated: int, finish: Finish | None, message: str = "",
                times: tuple[float, float, float] | None = None,
                probs: tuple[list[float], list[float]] = ([], []),
                scored: tuple[list[float], list[list[int]], list[list[float]]] = ([], [], [])) -> Cycle:
        """The Cycle event; ``times`` = (start, drafted, verified) clock readings, None for the end event."""
        start, t_drafted, t_verified = times or (0.0, 0.0, 0.0)
        token_text = self.target.token_text
        return Cycle(
            index=index, source=draft.source, k=k if draft.tokens else 0,
            drafted=draft.tokens, drafted_text=[token_text(t, special=False) for t in draft.tokens],
            n_accepted=n_accepted,
            emitted=emitted, emitted_text=[token_text(t, special=False) for t in emitted], text=text,
            p_drafted=probs[0], p_emitted=probs[1][: len(emitted)],
            logprobs=scored[0], top_tokens=scored[1], top_logprobs=scored[2],
            draft_confidence=draft.confidence, match_length=draft.match_length,
            draft_s=t_drafted - start, draft_first_s=draft.first_s, verify_s=t_verified - t_drafted,
            n_generated=generated, finish=finish, message=message, policy=policy.report(),
            # Everything after the target's pass: verification, bookkeeping, this event.
            overhead_s=self.clock() - t_verified if times else 0.0,
        )


def _display_probs(rows: TargetRows, draft: Draft, verdict: Verdict) -> tuple[list[float], list[float]]:
    """Target p of each drafted and each emitted token, for display (temperature 1 when greedy)."""
    p_drafted = verdict.p_drafted
    look_up_drafts = not p_drafted and draft.tokens
    n = max(len(verdict.tokens), len(draft.tokens) if look_up_drafts else 0)
    probs = RowProbs(rows.raw[:n] if rows.plain else np.stack([rows.shown(i) for i in range(n)]))
    if look_up_drafts:
        p_drafted = probs.at(draft.tokens)
    return p_drafted, probs.at(verdict.tokens)
