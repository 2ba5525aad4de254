"""Auto mode: speculation that measures the machine and never makes things slower.

A cost model measured live on the running machine, kept per model pair between runs:

- ``verify_s[n]``: the target's pass time with n tokens in the batch (1..MAX_BATCH),
- ``draft_first_s`` / ``draft_step_s``: the draft model's time for its first token of a
  cycle (it first catches up on the tokens the target just emitted) and for each next one,
- acceptance per draft position, per drafter (lookup also per n-gram match length),
  as decaying Beta counts so estimates follow the text within a few cycles.

Each cycle the policy picks the drafter and k maximising expected tokens per second,
E[tokens | acceptance, k] / (T_verify(k+1) + k·T_draft), against plain decoding
(k = 0), which wins whenever nothing else pays. On a 2-core CPU verifying 4 tokens
costs ~2.5 single steps and model drafts rarely pay; on a GPU verification is nearly
flat in k and the same arithmetic picks long drafts.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .. import paths
from .backend import Backend
from .costs import MAX_BATCH, CostModel
from .cycle import PolicyReport
from .drafters import Choice, Draft, Drafter
from .vocabulary import Mode, Source

MAX_K = 15  # lookup drafts are nearly free to make: long copies can pay
MAX_K_MODEL = 8
DECAY = 0.8  # per observation: old evidence fades, a collapse shows within a few cycles
CONFIDENCE_BINS = 10
# Now and then the runner-up is tried even if the cost model says no: a load spike
# during calibration must not lock speculation out for good. Rare enough to cost <1%.
EXPLORE_EVERY = 128
EXPLORE_FLOOR = 0.6  # only options expected at >= 60% of the best
# A client's prediction: acceptance by how many output tokens in a row followed it
# (bucket upper bounds). One token in common with it means little (unrelated text shares
# newlines and brackets); a long run is an edit copying the file, right nearly every time.
PREDICTION_RUNS = (1, 3, 7, 15)
PREDICTION_PRIORS = (0.1, 0.5, 0.75, 0.85, 0.9)


def prediction_bucket(run: int) -> int:
    return next((i for i, top in enumerate(PREDICTION_RUNS) if run <= top), len(PREDICTION_RUNS))


@dataclass
class Rate:
    """Acceptance of one draft position as decaying Beta counts around a prior."""

    accepted: float = 0.0
    rejected: float = 0.0
    prior: float = 0.5
    weight: float = 2.0  # pseudo-observations the prior is worth

    def observe(self, ok: bool) -> None:
        self.forget()
        self.accepted += ok
        self.rejected += not ok

    def forget(self) -> None:
        self.accepted *= DECAY
        self.rejected *= DECAY

    @property
    def value(self) -> float:
        return self.value_with(self.prior)

    def value_with(self, prior: float) -> float:
        return (self.accepted + prior * self.weight) / (self.accepted + self.rejected + self.weight)

    @property
    def evidence(self) -> float:
        return self.accepted + self.rejected


def chained(rates: Sequence[Rate]) -> list[float]:
    """Acceptance per position; a position with little evidence leans on the one before it
    (after a run of accepted copies the next is usually right too)."""
    out: list[float] = []
    for i, r in enumerate(rates):
        out.append(r.value if i == 0 else r.value_with(0.5 * (r.prior + out[-1])))
    return out


def expected_tokens(rates: Sequence[float]) -> float:
    """1 (the correction or bonus token) + sum over j of P(first j drafts accepted)."""
    total, run = 1.0, 1.0
    for a in rates:
        run *= a
        total += run
    return total


class AutoPolicy:
    """Picks (drafter, k) per cycle by expected tokens per second; k = 0 when nothing pays.

    Its inputs are narrow: the drafters it may choose from, the compute backend's name,
    a clock and a file to remember costs and acceptance in; ``calibrated`` hands it the
    costs the decoder measured.
    """

    # auto: any drafter or none; draft / lookup / mtp: that drafter, always drafting. A client's
    # prediction (there only when a request brings one) is offered in every mode.
    MODE_SOURCES = {Mode.AUTO: (Source.MODEL, Source.LOOKUP, Source.PREDICTION, Source.MTP),
                    Mode.DRAFT: (Source.MODEL, Source.PREDICTION), Mode.LOOKUP: (Source.LOOKUP, Source.PREDICTION),
                    Mode.MTP: (Source.MTP, Source.PREDICTION)}

    def __init__(self, drafters: Mapping[Source, Drafter], mode: Mode = Mode.AUTO, backend: str = "CPU",
                 store: Path | None = None, clock: Callable[[], float] = time.perf_counter):
        self.mode = Mode(mode)
        self.sources = [s for s in self.MODE_SOURCES[self.mode] if s in drafters]
        self.lookup = drafters.get(Source.LOOKUP)
        self.prediction = drafters.get(Source.PREDICTION)
        self.min_k = 0 if self.mode == Mode.AUTO else 1  # forced modes keep drafting; auto may choose plain decoding
        self.store = store
        self.clock = clock
        self.costs = CostModel(gpu=backend != "CPU")
        self.model_rates = [Rate(prior=0.6) for _ in range(MAX_K_MODEL)]
        self.mtp_rates = [Rate(prior=0.6) for _ in range(MAX_K_MODEL)]  # the target's own NextN head
        # Lookup acceptance by n-gram match length (1..max) and position.
        # Priors from the default bench suite: 1- and 2-token matches are right ~20% and
        # ~35% of the time; the longest matches are where copying pays, so they start
        # optimistic and are tried at once (a miss is learned within a few cycles).
        n_max = self.lookup.max_ngram if self.lookup is not None else 3
        self.lookup_rates = {n: [Rate(prior=0.7 if n == n_max else 0.05 + 0.15 * n) for _ in range(MAX_K)]
                             for n in range(1, n_max + 1)}
        self.prediction_rates = self._fresh_prediction_rates()
        # Draft-model acceptance by its own confidence, to tune the early-stop threshold.
        self.confidence_rates = [Rate(prior=(i + 0.5) / CONFIDENCE_BINS) for i in range(CONFIDENCE_BINS)]
        self.min_confidence = 0.0
        self.last: Choice = Choice(Source.NONE, 0)
        self.last_estimate: dict = {}
        self.cycles_since_explore = 0
        self._load()

    # -- costs ----------------------------------------------------------------------------

    @property
    def needs_calibration(self) -> bool:
        """Once per machine and pair: a remembered cost model is not measured again."""
        return not self.costs.calibrated

    def calibrated(self, measured: CostModel) -> None:
        self.costs.update(measured)

    # -- choosing -------------------------------------------------------------------------

    def plain_tokens_per_s(self) -> float:
        return 1.0 / self.costs.verify(1)

    def _options(self, context: Sequence[int]) -> list[tuple[float, Choice, float]]:
        """(expected tokens/s, choice, expected tokens per pass) for every candidate."""
        c = self.costs
        options = []
        if self.min_k == 0:
            options.append((1.0 / c.verify(1), Choice(Source.NONE, 0), 1.0))
        if Source.LOOKUP in self.sources:
            match = self.lookup.match(context)
            if match.length > 0:
                rates = chained(self.lookup_rates[match.length])
                for k in range(1, min(MAX_K, match.available, MAX_BATCH - 1) + 1):
                    e = expected_tokens(rates[:k])
                    options.append((e / (c.verify(k + 1) + c.lookup_s),
                                    Choice(Source.LOOKUP, k, min_match=match.length), e))
        if Source.PREDICTION in self.sources:
            match = self.prediction.match(context)
            if match.length > 0:
                rates = chained(self.prediction_rates[prediction_bucket(match.length)])
                for k in range(1, min(MAX_K, match.available, MAX_BATCH - 1) + 1):
                    e = expected_tokens(rates[:k])
                    options.append((e / (c.verify(k + 1) + c.lookup_s),
                                    Choice(Source.PREDICTION, k, min_match=match.length), e))
        if Source.MODEL in self.sources:
            rates = chained(self.model_rates)
            for k in range(1, min(MAX_K_MODEL, MAX_BATCH - 1) + 1):
                e = expected_tokens(rates[:k])
                options.append((e / (c.verify(k + 1) + c.draft(k)), Choice(Source.MODEL, k, self.min_confidence), e))
        if Source.MTP in self.sources:
            rates = chained(self.mtp_rates)
            for k in range(1, min(MAX_K_MODEL, MAX_BATCH - 1) + 1):
                e = expected_tokens(rates[:k])
                options.append((e / (c.verify(k + 1) + c.mtp(k)), Choice(Source.MTP, k), e))
        return options

    def choose(self, context: Sequence[int] = ()) -> Choice:
        options = self._options(context)
        if not options:  # forced lookup with no match: a plain step
            self.last = Choice(Source.NONE, 0)
            self.last_estimate = {"expected_tokens_per_s": round(self.plain_tokens_per_s(), 2)}
            return self.last
        options.sort(key=lambda o: o[0], reverse=True)
        speed, choice, e = options[0]
        self.cycles_since_explore += 1
        if self.cycles_since_explore >= EXPLORE_EVERY:
            n_best = choice.k + 1
            runner = next((o for o in options[1:] if o[1].k + 1 != n_best and o[0] >= EXPLORE_FLOOR * speed), None)
            if runner is not None:
                self.cycles_since_explore = 0
                speed, choice, e = runner
        if choice.source in (Source.MODEL, Source.MTP):
            # Hybrid: a confident lookup match goes first, the model (or MTP head) drafts when it has none.
            look = [o for o in options if o[1].source == Source.LOOKUP]
            if look:
                best_look = max(look, key=lambda o: o[0])
                if best_look[0] >= 0.9 * speed:
                    drafter = choice.source
                    speed, choice, e = best_look
                    choice = Choice(Source.LOOKUP, choice.k, min_match=choice.min_match, fallback=drafter)
        self.last = choice
        self.last_estimate = {"expected_tokens_per_s": round(speed, 2), "expected_tokens_per_pass": round(e, 3)}
        return choice

    # -- learning -------------------------------------------------------------------------

    def observe(self, draft: Draft, n_accepted: int, draft_s: float, verify_s: float) -> None:
        n = 1 + len(draft.tokens)
        if n <= MAX_BATCH and verify_s > 0:
            self.costs.observe_verify(n, verify_s)
        if not draft.tokens:
            return
        if draft.source == Source.MODEL:
            self.costs.observe_draft(len(draft.tokens), draft_s, draft.first_s or draft_s)
            rates = self.model_rates
        elif draft.source == Source.MTP:
            self.costs.observe_mtp(len(draft.tokens), draft_s, draft.first_s or draft_s)
            rates = self.mtp_rates
        elif draft.source == Source.PREDICTION:
            rates = self.prediction_rates[prediction_bucket(draft.match_length)]
        else:
            self.costs.lookup_s = 0.8 * self.costs.lookup_s + 0.2 * draft_s
            match = max(1, min(draft.match_length, len(self.lookup_rates)))
            rates = self.lookup_rates[match]
        seen = min(len(draft.tokens), n_accepted + 1, len(rates))
        for i, rate in enumerate(rates):
            if i < seen:
                rate.observe(i < n_accepted)
            else:  # unseen positions forget too, so an old low estimate cannot trap k short
                rate.forget()
        if draft.source == Source.MODEL and draft.confidence:
            self._tune_confidence(draft.confidence, n_accepted)

    def _tune_confidence(self, confidence: Sequence[float], n_accepted: int) -> None:
        for i, c in enumerate(confidence[: n_accepted + 1]):
            self.confidence_rates[min(int(c * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)].observe(i < n_accepted)
        # Stop drafting where one more token is expected to cost more than it returns:
        # it returns a(c) tokens for (T_draft + dT_verify) seconds, vs plain speed.
        c = self.costs
        marginal = (c.draft(2) - c.draft(1) + c.verify(3) - c.verify(2)) / c.verify(1)
        for i, rate in enumerate(self.confidence_rates):
            if rate.value >= marginal:
                self.min_confidence = i / CONFIDENCE_BINS
                break
        else:
            self.min_confidence = 1.0

    def report(self) -> PolicyReport:
        c = self.last
        plain = self.plain_tokens_per_s()
        expected = self.last_estimate.get("expected_tokens_per_s")
        mtp = Source.MTP in (c.source, c.fallback) or self.mode == Mode.MTP  # its costs and rates shown
        drafting, rates = (self.costs.mtp, self.mtp_rates) if mtp else (self.costs.draft, self.model_rates)
        return PolicyReport(
            source=c.source if c.k else Source.NONE, k=c.k, mode=self.mode,
            plain_tokens_per_s=round(plain, 2),
            verify_cost={n: round(self.costs.verify(n) / self.costs.verify(1), 3) for n in (2, 3, 5, 9)},
            draft_cost={k: round(drafting(k) / self.costs.verify(1), 3) for k in (1, 3)},
            model_acceptance=[round(r.value, 3) for r in rates[:4]],
            min_confidence=round(self.min_confidence, 2),
            expected_tokens_per_s=expected,
            expected_tokens_per_pass=self.last_estimate.get("expected_tokens_per_pass"),
            lookup_match=c.min_match if c.source == Source.LOOKUP else None,
            expected_speedup=round(expected / plain, 3) if expected else None,
        )

    # -- memory between runs --------------------------------------------------------------

    def _load(self) -> None:
        if not self.store or not self.store.is_file():
            return
        try:
            d = json.loads(self.store.read_text())
            self.costs = CostModel.from_json(d["costs"])
            for r, v in zip(self.model_rates, d.get("model", [])):
                r.prior = float(v)
            for r, v in zip(self.mtp_rates, d.get("mtp", [])):
                r.prior = float(v)
            for n, saved in d.get("lookup", {}).items():
                for r, v in zip(self.lookup_rates.get(int(n), []), saved):
                    r.prior = float(v)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged memory only costs a re-measurement

    def save(self) -> None:
        if not self.store:
            return
        d = {"costs": self.costs.to_json(), "model": [r.value for r in self.model_rates],
             "mtp": [r.value for r in self.mtp_rates],
             "lookup": {n: [r.value for r in rs] for n, rs in self.lookup_rates.items()}}
        try:
            paths.write_json_atomic(self.store, d)
        except OSError:
            pass  # a memory that cannot be written only costs a re-measurement next time

    @staticmethod
    def _fresh_prediction_rates() -> list[list[Rate]]:
        return [[Rate(prior=p) for _ in range(MAX_K)] for p in PREDICTION_PRIORS]

    def finish(self) -> None:
        # Each request brings its own prediction: what one taught says nothing of the next.
        self.prediction_rates = self._fresh_prediction_rates()
        self.save()


def default_store(target: Backend, draft: Backend | None) -> Path | None:
    """One small file per model pair and machine under the user data folder."""
    target_path = getattr(target, "path", None)
    if target_path is None:
        return None
    draft_path = getattr(draft, "path", None)
    facts = getattr(target, "facts", None)
    ident = "|".join([
        Path(target_path).name, str(Path(target_path).stat().st_size),
        Path(draft_path).name if draft_path else "-", str(Path(draft_path).stat().st_size) if draft_path else "-",
        platform.node(), platform.machine(), getattr(facts, "backend", "?"),
        str(getattr(target, "n_threads", "?")),
    ])
    return paths.data_dir() / "policy" / (hashlib.sha1(ident.encode()).hexdigest()[:16] + ".json")
