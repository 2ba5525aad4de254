"""Auto mode: speculation that measures the machine and never makes things slower.

A cost model measured live on the running machine, kept per model pair between runs:

- ``verify_s[n]``: the target's pass time with n tokens in the batch (1..MAX_BATCH),
- ``draft_first_s`` / ``draft_step_s``: the draft model's time for its first token of a
  cycle (it first catches up on the tokens the target just emitted) and for each next one,
- acceptance per draft position, per drafter (lookup also per match-length bucket),
  as decaying Beta counts so estimates follow the text within a few cycles; choices
  are made on Thompson draws from them, so untried draft lengths keep being tried.

Each cycle the policy picks the drafter and k maximising expected tokens per second,
E[tokens | acceptance, k] / (T_verify(k+1) + k·T_draft), against plain decoding
(k = 0), which wins whenever nothing else pays. On a 2-core CPU verifying 4 tokens
costs ~2.5 single steps and model drafts rarely pay; on a GPU verification is nearly
flat in k and the same arithmetic picks long drafts.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

from ... import paths
from ..backend import Backend
from ..cycle import PolicyReport
from ..drafting.draft import Choice, Draft, Drafter
from ..vocabulary import Device, Mode, Source
from .acceptance import (GRAMMAR_BUCKETS, GRAMMAR_PRIORS, IDLE_DECAY, LOOKUP_BUCKETS, LOOKUP_PRIORS, MEMORY_PRIORS,
                         PREDICTION_BUCKETS, PREDICTION_PRIORS, Rate, Table, bucket_of, chained, observe_positions)
from .costs import CURVE_BATCH, MAX_BATCH, CostModel

MAX_K = 15  # lookup drafts are nearly free to make: long copies can pay
# A recalled text (the memory began an earlier text as this whole context does: the same prompt
# again) is copied up to this long, its positions past MAX_K at the rate of the last one learned.
# Qwen2.5 1.5B on 2 cores: 16 tokens a pass cost 3.3 single steps, 64 cost 10.3 (4.8 against 6.2
# tokens a step when all are right), and llama-server's ngram-mod copies up to 64.
RECALL_K = MAX_BATCH - 1
MAX_K_MODEL = 8
CONFIDENCE_BINS = 10
CATCH_UP_CYCLES = 4  # model cycles a catch-up's cost is spread over
CATCH_UP = 2  # tokens a model cycle's draft catches up on after its last (its last draft, the correction)
SEED = 14  # the policy's own randomness: reproducible, and never the sampling RNG
# Auto mode's promise: never much slower than plain decoding, also while it explores copies.
# Over each answer, what its cycles cost beyond plain steps for the same tokens may not
# exceed this share of plain decoding's time (a conservative bandit): an exploratory copy
# runs only when even its worst outcome (nothing accepted) keeps within it; what good drafts
# saved pays for more. The horizon, in plain steps, lets an answer's first cycles try a short
# copy. (Measured before it: code writing 0.93x plain, its losses lookup drafts on 1-3 token
# matches; see _affordable.)
# 0.6% over a 64-step horizon: 0.38 steps of room at an answer's start, and a 128-token answer's
# bound 0.991x plain (issue 47: probing where nothing pays may cost 1% at most). On
# scripts/sim_policy.py (8 seeds; the steep curve of this project's 2-core Zen 4, then a flat one)
# against 1% over 96 steps, the bound 0.983x: code writing 0.989x vs 0.983x plain (flat 0.998 vs
# 0.989), open chat 0.995 vs 0.990, code explanation 0.995 vs 0.990; the copy-heavy prompts within
# 1.5% on the steep curve (code editing 1.832 vs 1.836, typo fixing 1.102 vs 1.098), 2-5% lower on
# the flat one (code editing 2.40 vs 2.48, typo fixing 1.34 vs 1.42): a first copy waits for a
# longer match there. (Before: 1% over 96 steps against 2% over 48, 4 seeds: code writing 1.017x
# vs 0.992x.)
LOSS_SHARE = 0.006
LOSS_HORIZON = 64
# A copy counts as sure, outside the budget, only when its mean rates beat plain decoding by
# this much: at the margin, a prior a little too hopeful or a verify cost not yet timed
# turns "pays on the means" into a loss (code writing: 1-3 token matches, 44% accepted).
SURE_MARGIN = 1.1
# Copies of shorter matches than this are never sure: how often a copy of 1-8 tokens of context
# is right depends on the text, and rates a document taught made them look sure in the chat that
# followed it, which then ran at 0.95x plain (priced on the verify curve). They stay within the
# budget, which what they save in a text they suit soon makes room in; a long match is right
# in any text.
SURE_MATCH = 9
# ... and a long match's copy is sure only once its bucket has been seen (evidence, decaying,
# of about one copy): on its prior alone, a fresh policy's first answer (code writing) copied 14
# tokens from a restated function signature and lost all of them, 0.94-0.96x plain priced on
# the verify curve in three fresh runs. Within the budget, the first copy is short; once seen,
# the next can be long.
SURE_EVIDENCE = 0.5
# ... but short copies this answer has shown right (at least this many tried, 3 in 4 right at
# their first token) are sure again: the text they suit is this one. Priced, 4 seeds: verbatim
# 2.19x vs 2.09x, document summary 1.77x vs 1.74x, the rest the same (a passage restated from
# its first word matches 1, 2 ... 8 tokens while the model writes it plainly).
SHORT_SURE_AFTER = 2
# Lookup's copies from matches shorter than this are never explored (drafted within the budget):
# 1-2 tokens of context (a newline, a bracket, a common word) say little of what follows, and
# probing them spent the budget that copies from longer matches could have used. Such a copy
# is drafted once sure (this answer's short copies right, above). On the simulator
# (scripts/sim_policy.py, 64 seeds, three curves) against exploring every match: open chat
# 0.985 -> 0.998x plain, code editing 2.486 -> 2.528x, verbatim 2.799 -> 2.833x, code writing
# and document summary within +-0.5%; at 4 or 6 tokens copies were found later (document
# summary -2 to -4%). Where a failed probe costs next to nothing (a GPU's nearly flat verify
# curve: under CHEAP_PROBE of a plain step beyond it), every match is explored still (on the
# simulator with 16 tokens at 1.4 steps, the floor alone cost code editing 16% and document
# summary 12%).
EXPLORE_MATCH = 3
CHEAP_PROBE = 0.25


class Option(NamedTuple):
    """A candidate for the next cycle: expected tokens/s and tokens per pass on this cycle's
    draws (acceptance rates, and the costs of batch sizes not timed yet); tokens/s on the means
    and the cost model's own estimates, and the seconds it is then expected to take."""

    speed: float
    choice: Choice
    tokens: float
    mean_speed: float
    seconds: float


class AutoPolicy:
    """Picks (drafter, k) per cycle by expected tokens per second; k = 0 when nothing pays.

    Its inputs are narrow: the drafters it may choose from, where the target runs,
    a clock and a file to remember costs and acceptance in; ``calibrated`` hands it costs
    measured while the engine was idle. Nothing is measured inside a generation beyond
    the passes it makes anyway: until the costs are known it runs on defaults and says so
    (``learning`` in its report).

    Acceptance is kept per source in tables of per-position rates: one for the draft
    model, one per match-length bucket for copying drafters. Choices are made on Thompson
    draws from those rates (with the policy's own RNG), so a draft length the policy has
    not tried stays uncertain, not fixed at its prior, and is tried until it proves itself.
    """

    # auto: any drafter or none; draft / lookup / mtp: that drafter, always drafting. A client's
    # prediction (there only when a request brings one) is offered in every mode.
    MODE_SOURCES = {Mode.AUTO: (Source.MODEL, Source.LOOKUP, Source.MEMORY, Source.PREDICTION, Source.MTP,
                                Source.GRAMMAR),
                    Mode.DRAFT: (Source.MODEL, Source.PREDICTION),
                    Mode.LOOKUP: (Source.LOOKUP, Source.PREDICTION),
                    Mode.MTP: (Source.MTP, Source.PREDICTION)}
    # Copying drafters (``match(context)`` -> Match): acceptance by match-length bucket.
    # A new one is one more entry here.
    MATCH_TABLES = {Source.LOOKUP: (LOOKUP_BUCKETS, LOOKUP_PRIORS), Source.MEMORY: (LOOKUP_BUCKETS, MEMORY_PRIORS),
                    Source.PREDICTION: (PREDICTION_BUCKETS, PREDICTION_PRIORS),
                    Source.GRAMMAR: (GRAMMAR_BUCKETS, GRAMMAR_PRIORS)}
    # Sources whose acceptance belongs to one request (each brings its own prediction).
    PER_REQUEST = (Source.PREDICTION,)
    # Sources whose match is evidence of its own, sure on the margin alone: a prediction's (this
    # request's output agreeing with it) and the grammar's (text the grammar forces).
    SURE_ON_MARGIN = (Source.PREDICTION, Source.GRAMMAR)

    def __init__(self, drafters: Mapping[Source, Drafter], mode: Mode = Mode.AUTO, device: Device = Device.CPU,
                 store: Path | None = None, clock: Callable[[], float] = time.perf_counter, seed: int = SEED):
        self.mode = Mode(mode)
        self.sources = [s for s in self.MODE_SOURCES[self.mode] if s in drafters]
        self.drafters = drafters
        self.min_k = 0 if self.mode == Mode.AUTO else 1  # forced modes keep drafting; auto may choose plain decoding
        self.store = store
        self.clock = clock
        self.rng = np.random.default_rng(seed)
        self.costs = CostModel(gpu=device != Device.CPU)  # a GPU's (or workers') passes: nearly flat in size
        self._cycle = 0  # cycles observed: what idle tables age by (Table.aged)
        self._model_rates = Table(Rate(prior=0.6) for _ in range(MAX_K_MODEL))
        self._mtp_rates = Table(Rate(prior=0.6) for _ in range(MAX_K_MODEL))  # the target's own NextN head
        # Per copying source, per match-length bucket, per position.
        self._match_rates = {source: self._fresh_tables(source) for source in self.MATCH_TABLES}
        # Draft-model acceptance by its own confidence, to tune the early-stop threshold.
        self.confidence_rates = [Rate(prior=(i + 0.5) / CONFIDENCE_BINS) for i in range(CONFIDENCE_BINS)]
        self.min_confidence = 0.0
        self.last: Choice = Choice(Source.NONE, 0)
        self.last_estimate: dict = {}
        self._plain_s = 0.0  # this answer: what plain steps would have taken for its tokens so far
        self._spent_s = 0.0  # and what its cycles took (draft + verify)
        self._short = [0, 0]  # this answer's copies of short matches: right at their first token, tried
        # Whether a remembered answer to this same prompt is written again: this answer is a function
        # of its prompt (``begin``), and no recalled copy has failed in it yet.
        self._recall = True
        self._recalling = False  # the last choice copies a recalled text
        self._load()

    def _fresh_tables(self, source: Source) -> list[Table]:
        return [Table((Rate(prior=p) for _ in range(MAX_K)), self._cycle) for p in self.MATCH_TABLES[source][1]]

    def _aged(self, table: Table) -> Table:
        """``table`` with the idle aging of the cycles since it was last aged applied."""
        idle = self._cycle - table.aged
        if idle > 0:
            factor = IDLE_DECAY ** idle
            for rate in table:
                rate.forget(factor)
            table.aged = self._cycle
        return table

    @property
    def model_rates(self) -> Table:
        return self._aged(self._model_rates)

    @property
    def mtp_rates(self) -> Table:
        return self._aged(self._mtp_rates)

    @property
    def lookup_rates(self) -> list[Table]:
        return [self._aged(t) for t in self._match_rates[Source.LOOKUP]]

    # -- costs ----------------------------------------------------------------------------

    @property
    def needs_calibration(self) -> bool:
        """Whether idle time is worth spending on measuring the verify curve (never done
        inside a generation: ``Decoder.calibrate`` runs while the engine waits)."""
        return not self.costs.calibrated

    @property
    def learning(self) -> bool:
        """Still running on default costs for part of what it may choose."""
        return self.costs.learning

    def calibrated(self, measured: CostModel) -> None:
        self.costs.update(measured)

    def observe_prompt(self, n_tokens: int, seconds: float) -> None:
        """A prompt chunk's decode: a free hint at the verify curve's slope."""
        self.costs.observe_prefill(n_tokens, seconds)

    def begin(self, repeatable: bool) -> None:
        """An answer starts. ``repeatable``: it is a function of its prompt (greedy decoding, or
        sampling whose noise is keyed by a seed): the memory's earlier answer to the same prompt is
        then recalled whole. Otherwise (T > 0 without a seed) that copy is only a copy, judged by
        its rates and budget like any other: recalled whole, a creative answer's repeat drafted
        the last answer 63 tokens at a time and lost nearly all of each pass."""
        self._recall = repeatable

    # -- choosing -------------------------------------------------------------------------

    def plain_tokens_per_s(self) -> float:
        return 1.0 / self.costs.verify(1)

    @staticmethod
    def _draft_options(rates: tuple[Sequence[float], Sequence[float]], k_max: int, extra: Callable[[int], float],
                       choice: Callable[[int], Choice], verify: tuple[Sequence[float], Sequence[float]]
                       ) -> list[Option]:
        """Drafts of 1..k_max tokens; ``rates``: (drawn, mean) acceptance per position; ``verify``:
        (drawn, estimated) seconds per pass by size; ``extra(k)``: drafting k tokens' seconds."""
        drawn, mean = rates
        out = []
        e = e_mean = run = run_mean = 1.0
        for k in range(1, min(k_max, len(drawn), len(verify[0]) - 2) + 1):
            run *= drawn[k - 1]
            run_mean *= mean[k - 1]
            e += run
            e_mean += run_mean
            drafting = extra(k)
            s, s_mean = verify[0][k + 1] + drafting, verify[1][k + 1] + drafting
            out.append(Option(e / s, choice(k), e, e_mean / s_mean, s_mean))
        return out

    def _options(self, context: Sequence[int]) -> list[Option]:
        """Every candidate, with its expected tokens/s and tokens per pass on this cycle's Thompson
        draws of the acceptance rates, and its tokens/s on their means."""
        c = self.costs
        matches = {source: self.drafters[source].match(context) for source in self.MATCH_TABLES
                   if source in self.sources}
        k_max = {source: RECALL_K if self._recalled(source, m.length, len(context)) else MAX_K
                 for source, m in matches.items()}
        # Each size once per cycle, not per option: on this cycle's draws of the untimed sizes'
        # costs, and on the cost model's own estimate (the means, and an option's worst case).
        largest = max([CURVE_BATCH, *(k + 1 for k in k_max.values())])
        verify = (c.curve(drawn=True, largest=largest), c.curve(drawn=False, largest=largest))
        options = []
        if self.min_k == 0:
            step = verify[1][1]
            options.append(Option(1.0 / step, Choice(Source.NONE, 0), 1.0, 1.0 / step, step))

        def rates(table: Sequence[Rate], k: int = MAX_K) -> tuple[list[float], list[float]]:
            drawn, mean = chained(table, self.rng), chained(table)
            deeper = max(0, k - len(drawn))
            return drawn + drawn[-1:] * deeper, mean + mean[-1:] * deeper

        for source, match in matches.items():
            if match.length > 0:
                options += self._draft_options(
                    rates(self._match_table(source, match.length), k_max[source]),
                    min(k_max[source], match.available), lambda k: c.lookup_s,
                    lambda k, s=source, m=match.length: Choice(s, k, min_match=m), verify)
        if Source.MODEL in self.sources:
            # The draft model first reads what it missed since it last drafted: drafting now
            # and then costs more per cycle than drafting every cycle. Paid once for the run
            # of model cycles it starts, so it is spread over a few.
            catch_up = c.catch_up(self.drafters[Source.MODEL].behind(context)) / CATCH_UP_CYCLES
            options += self._draft_options(rates(self.model_rates), MAX_K_MODEL, lambda k: c.draft(k) + catch_up,
                                           lambda k: Choice(Source.MODEL, k), verify)
        if Source.MTP in self.sources:
            # Chained heads draft at most one token per head: no option beyond them.
            k_max = min(MAX_K_MODEL, self.drafters[Source.MTP].max_k or MAX_K_MODEL)
            options += self._draft_options(rates(self.mtp_rates), k_max, c.mtp, lambda k: Choice(Source.MTP, k),
                                           verify)
        return options

    def _guess_costs(self) -> None:
        """Until two batch sizes are timed, the verify curve's slope is a draw: around the prompt
        chunk's hint when there is one, else anywhere from a GPU's 0.03 to a slow CPU's 0.6
        single steps per token. Trying a draft once measures it for good."""
        c = self.costs
        # Batches larger than any timed: somewhere between free and the measured slope. Past a
        # timed CURVE_BATCH (a recalled copy's), the average slope from one token: near what
        # large batches cost (Qwen2.5 1.5B, 2 cores: 10.8 single steps for 64, 10.3 timed).
        c.extrapolation_scale = 1.0 if max(c.verify_s, default=0) >= CURVE_BATCH else float(self.rng.uniform(0.3, 1.0))
        if c.slope_measured:
            c.slope_guess = None
            return
        hint = c.slope_hint()
        low, high = (hint / 2, hint * 1.5) if hint is not None else (0.03, 0.6)
        c.slope_guess = float(np.exp(self.rng.uniform(np.log(low), np.log(high))))

    def choose(self, context: Sequence[int] = ()) -> Choice:
        self._guess_costs()
        # The plain rate the choice is weighed against, kept for its report: the pass it leads to
        # is timed before the report is made, and against that newer rate a plain step read
        # 0.86x plain on a fresh machine's first cycle (its cost a default until then).
        plain = 1.0 / self.costs.verify(1, drawn=False)
        options = self._options(context)
        if not options:  # forced lookup with no match: a plain step
            self.last, self._recalling = Choice(Source.NONE, 0), False
            self.last_estimate = {"expected_tokens_per_s": round(plain, 2), "plain_tokens_per_s": plain}
            return self.last
        if self.min_k == 0:
            options = self._affordable(options, len(context))
        speed, choice, e, *_ = max(options, key=lambda o: o.speed)
        # Hybrid: a confident copy goes first, the model (or MTP head) drafts when it has none:
        # the copy when it is the best or close to the drafter's best, the drafter behind it
        # when its own drafts beat a plain step.
        look = [o for o in options if o.choice.source in self.MATCH_TABLES]
        drafting = [o for o in options if o.choice.source in (Source.MODEL, Source.MTP) and o.speed > plain]
        if look and drafting:
            best_look = max(look, key=lambda o: o.speed)
            drafter = max(drafting, key=lambda o: o.speed)
            if best_look.speed >= 0.9 * max(speed, drafter.speed):
                speed, choice, e, *_ = best_look
                choice = Choice(choice.source, choice.k, min_match=choice.min_match, fallback=drafter.choice.source)
        self._recalling = self._recalled(choice.source, choice.min_match or 0, len(context))
        if Source.MODEL in (choice.source, choice.fallback):
            self.min_confidence = self._threshold(speed, self.rng)
            choice = replace(choice, min_confidence=self.min_confidence)
        self.last = choice
        self.last_estimate = {"expected_tokens_per_s": round(speed, 2), "expected_tokens_per_pass": round(e, 3),
                              "plain_tokens_per_s": plain}
        return choice

    def _affordable(self, options: list[Option], context_length: int) -> list[Option]:
        """The options to choose among: plain steps, drafts that surely pay on the mean
        acceptance rates and estimated costs (SURE_MARGIN), and exploratory copies (paying only
        on this cycle's draws) whose worst case keeps this answer within LOSS_SHARE of plain
        decoding. A pass always yields at least the target's own token, so the worst a draft can
        do is cost its pass minus one plain step, priced on the cost model's estimate: on this
        cycle's draw, a fresh policy's guess that batches were nearly free let long copies through
        that cost 2-3 steps each (code writing at 0.90x plain on its first answer).
        Lookup's copies of matches shorter than EXPLORE_MATCH are not explored, only drafted when sure,
        unless their pass costs little more than a plain step (CHEAP_PROBE).
        Sure means the means pay by SURE_MARGIN, and: on a match of SURE_MATCH tokens or more,
        its bucket has been seen (SURE_EVIDENCE); on a shorter one, this answer's short copies were
        right (SHORT_SURE_AFTER); a client's prediction, whose match is this request's own output
        agreeing with it, the grammar's forced text, and a memory's copy of an earlier text that
        began as this whole context does (the same prompt again, an answer regenerated: greedy
        decoding writes it again), need only the margin.
        A draft model (or MTP head) is sure once it has been seen and its means pay; while its
        costs are untimed, a draft of up to two tokens is (only a try times them); else its drafts
        are exploration too. (Left to its draws, a fresh policy on a 2-core CPU tried the draft
        model in open chat again and again, each try reading the prompt into it first: 0.86x plain
        priced on the verify curve, one seed 0.72x; 0.97x within the budget. Where drafting is
        cheap, as on a GPU, its first tries fit the budget at once and its means soon pay.)"""
        step = self.costs.verify(1)
        slack = LOSS_SHARE * (self._plain_s + LOSS_HORIZON * step) - (self._spent_s - self._plain_s)

        def sure(o: Option) -> bool:
            source, match = o.choice.source, o.choice.min_match or 0
            if source not in self.MATCH_TABLES and not self.costs.drafting_timed(mtp=source == Source.MTP):
                return o.choice.k <= 2  # its cost a default guess: the shortest try that times it all
            if o.mean_speed * step < SURE_MARGIN:
                return False
            if source in self.SURE_ON_MARGIN:
                return True
            if self._recalled(source, match, context_length):
                # A one-token probe first cost a pass of a 128-token answer's ten.
                return True
            if source not in self.MATCH_TABLES:
                return self._drafted_from(source)[0].evidence >= SURE_EVIDENCE
            if match < SURE_MATCH:
                right, tried = self._short
                return tried >= SHORT_SURE_AFTER and right >= 0.75 * tried
            seen = self._match_table(source, match)[0].evidence
            # Unseen, a one-token probe: else an answer whose budget an early miss used up never
            # starts copying (code editing once ran at 0.95x plain).
            return seen >= SURE_EVIDENCE or o.choice.k == 1

        def explored(o: Option) -> bool:  # may be tried on this cycle's draws, within the budget
            return (o.choice.source not in (Source.LOOKUP, Source.MEMORY) or (o.choice.min_match or 0) >= EXPLORE_MATCH
                    or o.seconds - step <= CHEAP_PROBE * step)

        return [o for o in options
                if o.choice.source == Source.NONE or sure(o) or (explored(o) and o.seconds - step <= slack)]

    def _recalled(self, source: Source, match: int, context_length: int) -> bool:
        """Whether a match is the memory's of an earlier text that began as this whole context
        does (the same prompt again, an answer regenerated: greedy decoding writes it again), in
        an answer that writes it again (``begin``; a recalled copy that failed ends that)."""
        return self._recall and source == Source.MEMORY and match >= max(context_length, SURE_MATCH)

    # -- learning -------------------------------------------------------------------------

    def _drafted_from(self, source: Source) -> list[Rate]:
        """A drafting model's acceptance per position."""
        return self.mtp_rates if source == Source.MTP else self.model_rates

    def _match_table(self, source: Source, length: int) -> Table:
        """A copying source's acceptance per position for a match of ``length`` tokens."""
        return self._aged(self._match_rates[source][bucket_of(length, self.MATCH_TABLES[source][0])])

    def observe(self, draft: Draft, n_accepted: int, draft_s: float, verify_s: float) -> None:
        n = 1 + len(draft.tokens)
        if n <= MAX_BATCH and verify_s > 0:
            self.costs.observe_verify(n, verify_s)
        self.costs.age(n)
        plain = (n_accepted + 1) * self.costs.verify(1)
        self._plain_s += plain
        # A plain step costs what plain decoding does, however long the machine made it take:
        # the budget counts what drafting cost.
        self._spent_s += draft_s + verify_s if draft.tokens else plain
        observed = self._observe_draft(draft, n_accepted, draft_s)
        # What was not tried this cycle ages (IDLE_DECAY, applied when next read): a drafter that
        # failed a few times long ago is uncertain again after a while and gets tried again
        # (never locked out for good). The table drafted from does not.
        self._cycle += 1
        if observed is not None:
            observed.aged = self._cycle

    def _observe_draft(self, draft: Draft, n_accepted: int, draft_s: float) -> Table | None:
        """Learn from a draft's fate; the table of rates it taught (None: no draft)."""
        if not draft.tokens:
            return None
        if draft.source == Source.MODEL:
            # A first draft after a new prompt caught up on all of it: not a cycle's usual cost.
            self.costs.observe_draft(draft.steps, draft_s, draft.first_s or draft_s,
                                     first=draft.caught_up <= CATCH_UP, caught_up=draft.caught_up)
            rates = self.model_rates
        elif draft.source == Source.MTP:
            self.costs.observe_mtp(draft.steps, draft_s, draft.first_s or draft_s)
            rates = self.mtp_rates
        elif draft.source in self.MATCH_TABLES:
            if draft.source == Source.LOOKUP:
                self.costs.lookup_s = 0.8 * self.costs.lookup_s + 0.2 * draft_s
            rates = self._match_table(draft.source, max(1, draft.match_length))
            if n_accepted < len(draft.tokens) and self._recalling:
                # The answer left the remembered one (its sampling, or a near tie decided
                # otherwise): the rest is not a repeat, and a long pass would be lost again.
                self._recall = False
            if draft.source not in self.SURE_ON_MARGIN and draft.match_length < SURE_MATCH:
                self._short[0] += n_accepted > 0
                self._short[1] += 1
        else:
            return None
        observe_positions(rates, len(draft.tokens), n_accepted)
        if draft.source == Source.MODEL and draft.confidence:
            for i, conf in enumerate(draft.confidence[: n_accepted + 1]):
                self.confidence_rates[min(int(conf * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)].observe(i < n_accepted)
        return rates

    def _threshold(self, tokens_per_s: float, rng: np.random.Generator | None = None) -> float:
        """The draft model's early stop: the lowest confidence at which one more drafted token
        is expected to return what it costs at the rate the cycle is expected to run at,
        a(c) >= (dT_draft + dT_verify) * tokens_per_s. (Against the plain rate, as before,
        forced draft mode, which must draft even when plain would be faster, stopped after
        one token where three paid.)

        Never above the top bin's lower edge: the most confident drafts always go on, so
        acceptance there keeps being measured (a threshold of 1.0 stopped every draft after
        its first token and could never learn it was wrong)."""
        c = self.costs
        marginal = (c.draft(2) - c.draft(1) + c.verify(3) - c.verify(2)) * tokens_per_s
        for i, rate in enumerate(self.confidence_rates):
            a = rate.value if rng is None else rate.sample_with(rate.prior, rng)
            if a >= marginal:
                return i / CONFIDENCE_BINS
        return (CONFIDENCE_BINS - 1) / CONFIDENCE_BINS

    def report(self) -> PolicyReport:
        c = self.last
        plain = self.last_estimate.get("plain_tokens_per_s") or self.plain_tokens_per_s()
        expected = self.last_estimate.get("expected_tokens_per_s")
        mtp = Source.MTP in (c.source, c.fallback) or self.mode == Mode.MTP  # its costs and rates shown
        drafting, rates = (self.costs.mtp, self.mtp_rates) if mtp else (self.costs.draft, self.model_rates)
        curve = self.costs.curve()  # every cycle: one sweep, not a sort per size
        return PolicyReport(
            source=c.source if c.k else Source.NONE, k=c.k, mode=self.mode,
            plain_tokens_per_s=round(plain, 2),
            verify_cost={n: round(curve[n] / curve[1], 3) for n in (2, 3, 5, 9, 16)},
            draft_cost={k: round(drafting(k) / curve[1], 3) for k in (1, 3)},
            model_acceptance=[round(r.value, 3) for r in rates[:4]],
            min_confidence=round(c.min_confidence if c.source == Source.MODEL else self.min_confidence, 2),
            expected_tokens_per_s=expected,
            expected_tokens_per_pass=self.last_estimate.get("expected_tokens_per_pass"),
            lookup_match=c.min_match if c.source in self.MATCH_TABLES else None,
            expected_speedup=round(expected / plain, 3) if expected else None,
            learning=self.learning,
        )

    # -- memory between runs --------------------------------------------------------------

    def _load(self) -> None:
        if not self.store or not self.store.is_file():
            return
        try:
            d = json.loads(self.store.read_text())
            costs = CostModel.from_json(d["costs"])
            model = [float(v) for v in d.get("model", [])]
            mtp = [float(v) for v in d.get("mtp", [])]
            # "lookup": {bucket lower bound: [per position]}. Files from before buckets held
            # n-gram lengths 1..3, which are the first three buckets' bounds.
            lookup = {bucket_of(int(n)): [float(v) for v in vs] for n, vs in d.get("lookup", {}).items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return  # a damaged memory only costs a re-measurement
        self.costs = costs
        for rates, saved in ((self.model_rates, model), (self.mtp_rates, mtp), *(
                (self.lookup_rates[b], saved) for b, saved in lookup.items())):
            for r, v in zip(rates, saved):
                if math.isfinite(v):  # NaN would pass the clamp and poison every draw
                    r.prior = min(max(v, 0.01), 0.99)

    def save(self) -> None:
        if not self.store:
            return
        d = {"costs": self.costs.to_json(), "model": [r.value for r in self.model_rates],
             "mtp": [r.value for r in self.mtp_rates],
             "lookup": {str(LOOKUP_BUCKETS[b]): [r.value for r in rs] for b, rs in enumerate(self.lookup_rates)}}
        try:
            paths.write_json_atomic(self.store, d)
        except OSError:
            pass  # a memory that cannot be written only costs a re-measurement next time

    def finish(self) -> None:
        self._plain_s = self._spent_s = 0.0  # the loss budget is per answer
        self._short = [0, 0]
        self._recall = True
        # Each request brings its own prediction: what one taught says nothing of the next.
        for source in self.PER_REQUEST:
            self._match_rates[source] = self._fresh_tables(source)
        self.save()


def default_store(target: Backend, draft: Backend | None) -> Path | None:
    """One small file per model pair and machine under the user data folder."""
    target_path = target.path
    if target_path is None:
        return None
    draft_path = draft.path if draft is not None else None
    ident = "|".join([
        Path(target_path).name, str(Path(target_path).stat().st_size),
        Path(draft_path).name if draft_path else "-", str(Path(draft_path).stat().st_size) if draft_path else "-",
        platform.node(), platform.machine(), target.facts.backend if target.facts is not None else "?",
        str(target.n_threads),
    ])
    return paths.data_dir() / "policy" / (hashlib.sha1(ident.encode()).hexdigest()[:16] + ".json")
