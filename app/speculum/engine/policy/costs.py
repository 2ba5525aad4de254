"""What a pass costs on this machine: the target by batch size, the draft model and the
target's MTP head per token.

Learned from the passes the engine makes anyway (each cycle's verify pass, the prompt's
chunks), and, while the engine is idle after loading, from ``calibrate``, which can be
interrupted between passes. Until a size is measured, its cost is interpolated from
what is known, or from defaults: the first generation never waits for a calibration.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..backend import Backend

MAX_BATCH = 64  # the longest pass priced and timed: a recalled copy's (auto.RECALL_K drafts and the pending token)
CURVE_BATCH = 16  # the passes every cycle prices: any other draft's (auto.MAX_K and the pending token)
# Batch sizes measured once per machine and pair: CPU kernels make some sizes cheaper
# than smaller ones (4 rows at once with repacked weights), so no curve is assumed.
CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16)
# A size's cost that is above the default curve and not timed for a while moves this share
# of the way down to it per cycle (see CostModel.age).
STALE_PULL = 0.03


@dataclass
class CostModel:
    """Seconds per target pass by batch size, and per draft-model token."""

    verify_s: dict[int, float] = field(default_factory=dict)
    draft_first_s: float | None = None
    draft_step_s: float | None = None
    catch_up_s: float | None = None  # the draft model's time per token it catches up on, beyond ~2
    lookup_s: float = 2e-5
    gpu: bool = False
    mtp_first_s: float | None = None  # the MTP head: catch-up on the confirmed tokens + first draft
    mtp_step_s: float | None = None
    # Prompt chunk decodes (tokens, seconds): their per-token cost hints at the curve's
    # slope before any batched verify pass has been timed.
    prefill: tuple[int, float] | None = None
    observations: int = 0  # verify passes timed, calibration's included
    # The policy's current guess at the slope while no batch beyond one token is timed
    # (a Thompson draw: a machine whose batches are cheap gets found out, not assumed away).
    slope_guess: float | None = field(default=None, compare=False)
    extrapolation_scale: float = field(default=1.0, compare=False)

    @property
    def calibrated(self) -> bool:
        return all(n in self.verify_s for n in CALIBRATION_SIZES[:6])

    @property
    def learning(self) -> bool:
        """Few passes timed yet, or the cost of batches beyond one token only guessed."""
        return not self.calibrated and (self.observations < 24 or len(self.verify_s) < 3)

    def update(self, measured: "CostModel") -> None:
        """Take what ``measured`` holds, keep the rest."""
        self.verify_s.update(measured.verify_s)
        self.verify_s = plausible(self.verify_s)
        self.observations += measured.observations
        if measured.draft_first_s is not None:
            self.draft_first_s = measured.draft_first_s
        if measured.draft_step_s is not None:
            self.draft_step_s = measured.draft_step_s
        if measured.mtp_first_s is not None:
            self.mtp_first_s = measured.mtp_first_s
        if measured.mtp_step_s is not None:
            self.mtp_step_s = measured.mtp_step_s
        self._plausible_steps()

    def _plausible_steps(self) -> None:
        """A drafter's next token never costs more than its first, which also reads the tokens
        the last cycle confirmed: a step above it was timed while something else held the
        cores. (A 0.5B draft once read 7 target steps per token; forced draft mode then stopped
        every draft after one token, and a draft of one token never times a step again.)"""
        if self.draft_step_s is not None and self.draft_first_s is not None:
            self.draft_step_s = min(self.draft_step_s, self.draft_first_s)
        if self.mtp_step_s is not None and self.mtp_first_s is not None:
            self.mtp_step_s = min(self.mtp_step_s, self.mtp_first_s)

    # A pass the OS preempted can take 10x longer; clipping keeps one hiccup from
    # steering several cycles, while a real slowdown still shows within a few passes.
    def observe_verify(self, n: int, seconds: float) -> None:
        old = self.verify_s.get(n)
        self.verify_s[n] = _ema(old, seconds)
        self.observations += 1
        if old:
            # A shared machine's speed drifts, and sizes timed rarely would keep the speed of
            # their day (a curve once read 2.8 steps for 2 tokens; in forced draft mode, where
            # single steps are never timed, 2 tokens read cheaper than 1 and k stuck at 1): the
            # whole curve follows each pass, fully the single step's (auto mode's most common),
            # half another size's, so the shape is still learned.
            factor = (self.verify_s[n] / old) ** (1.0 if n == 1 else 0.5)
            for size in self.verify_s:
                if size != n:
                    self.verify_s[size] *= factor
        one = self.verify_s.get(1)
        if one is not None:  # no size above what its tokens cost one at a time
            for size, seconds in self.verify_s.items():
                self.verify_s[size] = min(seconds, size * one)

    def age(self, timed: int) -> None:
        """Once per cycle (``timed``: the size its pass had): sizes not timed drift down toward
        the default curve, never up. A cost measured in a bad moment (a calibration while
        another program held the cores read 3 tokens at 67 single steps) keeps every draft of
        that size out, so the size is never timed again and auto mode never drafts; drifting,
        it comes back within reach, is tried, and is timed for what it is. A size the drift
        makes too cheap is tried sooner and timed too: optimism that evidence corrects.
        Forced modes never time a single step: their curve drifts against its estimate (without
        it, a size timed slow once in draft mode stayed slow, and k stayed short)."""
        if not self.verify_s:
            return
        one = self.verify(1, drawn=False)  # the model's estimate, not the cycle's draw
        # Toward a line no less steep than the cautious default: a prompt chunk's slope fits large
        # batches, and small ones cost more per token (2 tokens 1.5-1.8 steps where a chunk said
        # 1.25). Drifting to the chunk's line, small sizes read ever cheaper than timed, and
        # copies of 1-2 tokens that lose looked cheap enough to explore (open chat 0.96x plain).
        slope = max(self.slope_hint() or 0.0, 0.05 if self.gpu else 0.5)
        for size, seconds in self.verify_s.items():
            prior = one * (1 + slope * (size - 1))
            if size != timed and seconds > prior:
                self.verify_s[size] = seconds - STALE_PULL * (seconds - prior)

    def observe_prefill(self, n: int, seconds: float) -> None:
        if n >= 8 and seconds > 0:
            self.prefill = (n, seconds)

    def observe_draft(self, steps: int, seconds: float, first_s: float, first: bool = True,
                      caught_up: int = 0) -> None:
        """A model draft: ``steps`` single-token decodes after its first token, in ``seconds``
        all told. (Counted as the tokens after the first, a draft that stopped early on a token
        it then refused read twice its step cost after two tokens, and k stuck at 1.)"""
        if steps > 0:
            self.draft_step_s = _ema(self.draft_step_s, (seconds - first_s) / steps)
        if first:
            self.draft_first_s = _ema(self.draft_first_s, first_s)
        else:
            if self.draft_first_s is None and self.draft_step_s is not None:
                # The first draft of all read a prompt with its first token: what that token costs
                # alone, as two tokens read at once, on the target's curve. (Taken whole, a catch-up
                # of 6 tokens read as the cost of every first token, and a draft model that doubled
                # the speed was never tried again.)
                self.draft_first_s = self.draft_step_s * self.verify(2, drawn=False) / self.verify(1, drawn=False)
            if caught_up > 2 and self.draft_first_s is not None:  # a long catch-up: its cost per token
                self.catch_up_s = _ema(self.catch_up_s, max(first_s - self.draft_first_s, 0.0) / (caught_up - 2))
        self._plausible_steps()

    def drafting_timed(self, mtp: bool = False) -> bool:
        """Whether the draft model's (or MTP head's) costs, its first token and each next, have
        been measured, by a draft or by calibration."""
        first, step = (self.mtp_first_s, self.mtp_step_s) if mtp else (self.draft_first_s, self.draft_step_s)
        return first is not None and step is not None

    def catch_up(self, behind: int) -> float:
        """Seconds for the draft model to read ``behind`` tokens it missed (while plain steps
        or other drafters ran) beyond the ~2 every cycle's first draft token includes."""
        if behind <= 2:
            return 0.0
        per = self.catch_up_s if self.catch_up_s is not None else 0.15 * self.draft(1)
        return (behind - 2) * per

    def observe_mtp(self, steps: int, seconds: float, first_s: float) -> None:
        self.mtp_first_s = _ema(self.mtp_first_s, first_s)
        if steps > 0:
            self.mtp_step_s = _ema(self.mtp_step_s, (seconds - first_s) / steps)
        self._plausible_steps()

    def mtp(self, k: int) -> float:
        """Seconds for the MTP head to propose k tokens (unmeasured: a layer and the LM head,
        guessed at a fifth of a target pass)."""
        first = self.mtp_first_s if self.mtp_first_s is not None else 0.2 * self.verify(1)
        step = self.mtp_step_s if self.mtp_step_s is not None else 0.2 * self.verify(1)
        return first + (k - 1) * step

    def draft(self, k: int) -> float:
        """Seconds for the draft model to propose k tokens."""
        first = self.draft_first_s if self.draft_first_s is not None else 0.6 * self.verify(1)
        step = self.draft_step_s if self.draft_step_s is not None else 0.4 * self.verify(1)
        return first + (k - 1) * step

    def verify(self, n: int, drawn: bool = True) -> float:
        """Seconds for a pass of n tokens. Untimed sizes follow the policy's current draws
        (``slope_guess``, ``extrapolation_scale``); with ``drawn`` False, the model's own estimate."""
        if n in self.verify_s:
            return self.verify_s[n]
        return self._estimate(n, sorted(self.verify_s.items()), drawn)

    def curve(self, drawn: bool = True, largest: int = CURVE_BATCH) -> list[float]:
        """``verify(n, drawn)`` for n = 0 (0.0) .. ``largest``, in one sweep: the policy reads the
        curve every cycle, and sorting the timed sizes per size was most of its cost."""
        known = sorted(self.verify_s.items())
        return [0.0] + [self.verify_s[n] if n in self.verify_s else self._estimate(n, known, drawn)
                        for n in range(1, min(largest, MAX_BATCH) + 1)]

    def _estimate(self, n: int, known: list[tuple[int, float]], drawn: bool) -> float:
        """An untimed size's cost from the timed ones (``known``, sorted by size)."""
        if not known:
            return 0.05 * (1 + (0.05 if self.gpu else 0.5) * (n - 1))
        # Linear in the batch size between / beyond the measured sizes; never cheaper than one fewer.
        i = bisect.bisect_left(known, (n,))
        lower, upper = known[:i], known[i:]
        if lower and upper:
            (k0, v0), (k1, v1) = lower[-1], upper[0]
            return v0 + (v1 - v0) * (n - k0) / (k1 - k0)
        if len(known) >= 2 and lower:
            # Beyond the largest size timed. A batch's cost per extra token does not grow with
            # its size (bigger matrix products run no less efficiently), so the slope is at
            # most the average one from the smallest size; the last two sizes alone, a few
            # noisy passes, once put 16 tokens at 26 single steps where 4 was true, and a size
            # never tried could never be measured. ``extrapolation_scale`` is the policy's
            # draw below that bound, so larger batches get tried until they are timed.
            (k0, v0), (k1, v1), (kf, vf) = known[-2], known[-1], known[0]
            slope = max(min((v1 - v0) / (k1 - k0), (v1 - vf) / (k1 - kf)), 0.0) * (
                self.extrapolation_scale if drawn else 1.0)
            return v1 + slope * (n - k1)
        if len(known) >= 2:  # below the smallest size timed (forced modes never time 1)
            (k0, v0), (k1, v1) = known[0], known[1]
            slope = max((v1 - v0) / (k1 - k0), 0.0)
            # Two noisy sizes can slope steeply: never below what 0.6 steps per token allows.
            return max(v0 - slope * (k0 - n), v0 / (1 + 0.6 * (k0 - n)))
        k0, v0 = known[0]
        slope = self._default_slope(k0, v0, drawn)
        per = v0 / (1 + slope * (k0 - 1))
        return per * (1 + slope * (n - 1))

    @property
    def slope_measured(self) -> bool:
        """Whether two batch sizes have been timed, so the curve's slope is known."""
        return len(self.verify_s) >= 2

    def slope_hint(self) -> float | None:
        """The slope a prompt chunk's decode suggests (None: no chunk timed, or no single step)."""
        if self.prefill is None or 1 not in self.verify_s:
            return None
        n, seconds = self.prefill
        return min(max(1.3 * (seconds / self.verify_s[1] - 1) / (n - 1), 0.1), 0.5)

    def _default_slope(self, k0: int, v0: float, drawn: bool = True) -> float:
        """Extra cost per token in a batch, in single steps, before two sizes are measured:
        from a prompt chunk's decode when one was timed (it computes no logits, so a verify
        pass costs somewhat more: kept between 0.1 and 0.5), else 0.5 on a CPU (a cautious
        guess: machines measured 0.2-0.5) and 0.05 on a GPU."""
        if self.slope_guess is not None and drawn:
            return self.slope_guess
        hint = self.slope_hint() if k0 == 1 else None
        if hint is not None:
            return hint
        return 0.05 if self.gpu else 0.5

    def to_json(self) -> dict:
        return {"verify_s": {str(k): v for k, v in self.verify_s.items()}, "draft_first_s": self.draft_first_s,
                "draft_step_s": self.draft_step_s, "gpu": self.gpu, "observations": self.observations,
                "mtp_first_s": self.mtp_first_s, "mtp_step_s": self.mtp_step_s}

    @classmethod
    def from_json(cls, d: dict) -> "CostModel":
        """A saved model; each figure that cannot be a cost (not a number, infinite, not positive,
        a batch size out of range) is left out, to be measured again."""
        saved = d.get("verify_s", {})
        verify_s = {int(n): s for n, v in saved.items()
                    if str(n).isdigit() and 1 <= int(n) <= MAX_BATCH and (s := _seconds(v)) is not None}
        try:
            observations = int(d.get("observations", 3 * len(saved)))  # files from before it: a full calibration
        except (TypeError, ValueError):
            observations = 0
        costs = cls(plausible(verify_s),
                    _seconds(d.get("draft_first_s")), _seconds(d.get("draft_step_s")), gpu=d.get("gpu") is True,
                    mtp_first_s=_seconds(d.get("mtp_first_s")), mtp_step_s=_seconds(d.get("mtp_step_s")),
                    observations=max(observations, 0))
        costs._plausible_steps()
        return costs


def _seconds(value) -> float | None:
    """A saved time in seconds, or None where it cannot be one."""
    if isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def plausible(verify_s: dict[int, float]) -> dict[int, float]:
    """The sizes whose cost is possible: a pass of n tokens never costs more than n single
    steps (decoding them one at a time does the same work), so a size above that was timed
    while something else held the cores, and is dropped to be timed again."""
    one = verify_s.get(1)
    if one is None:
        return dict(verify_s)
    return {n: s for n, s in verify_s.items() if s > 0 and s <= n * one * 1.05}


def _ema(old: float | None, new: float) -> float:
    return new if old is None else 0.8 * old + 0.2 * min(new, 3 * old)


def calibrate(target: Backend, draft: Backend | None, token: int, clock: Callable[[], float],
              interrupted: Callable[[], bool] = lambda: False, skip: Sequence[int] = ()) -> CostModel:
    """Time the target's pass by batch size (and the draft model's first and next token; an
    MTP head's cost is learned from the cycles that use it).

    Decodes ``token`` repeated after what each KV cache holds, and trims it away again:
    the caches end as they began. Meant for idle time: ``interrupted`` is asked before
    each pass, and what was measured until then is returned. Sizes in ``skip`` are
    already known.
    """

    def timed(model: Backend, tokens: Sequence[int]) -> float:
        keep = model.n_past
        t = clock()
        model.decode(tokens, rows=range(len(tokens)))
        seconds = clock() - t
        model.trim(keep)
        return seconds

    measured = CostModel()
    if interrupted():
        return measured
    # A recurrent target cannot undo a whole pass (only drafts within one): it is timed live.
    recurrent = target.max_rollback is not None
    sizes = [n for n in CALIBRATION_SIZES if target.n_past + n <= target.n_ctx and n not in skip and not recurrent]
    if sizes:
        timed(target, [token])  # warm-up: the first pass after loading pages weights in
    for _ in range(3):  # rounds across all sizes: a passing hiccup spoils one sample, not a size
        for n in sizes:
            if interrupted():
                return measured
            measured.verify_s[n] = min(measured.verify_s.get(n, float("inf")), timed(target, [token] * n))
            measured.observations += 1
    # A size read above n single steps (impossible: see plausible) would be dropped and leave the
    # curve unmeasured, and a server measures only once, before its first request. A busy moment
    # that spoiled its every round passes: it is timed again. A machine whose speed keeps changing
    # (another program on the cores; one lucky fast single step) does not: such a size is priced
    # at the most it can cost, n single steps, and the passes that follow correct it.
    for _ in range(3):
        for n in [n for n in sizes if n not in plausible(measured.verify_s)]:
            if interrupted():
                return measured
            measured.verify_s[n] = min(measured.verify_s[n], timed(target, [token] * n))
            measured.observations += 1
    one, kept = measured.verify_s.get(1), plausible(measured.verify_s)  # (all kept without a single step)
    measured.verify_s = {n: kept[n] if n in kept else n * one for n in measured.verify_s}
    if draft is not None and draft.n_past + 2 <= draft.n_ctx and not interrupted():
        timed(draft, [token])
        # A cycle's first draft token follows a catch-up on ~2 new tokens.
        measured.draft_first_s = min(timed(draft, [token] * 2) for _ in range(2))
        measured.draft_step_s = min(timed(draft, [token]) for _ in range(3))
    return measured
