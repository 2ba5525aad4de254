"""What a pass costs on this machine: the target by batch size, the draft model and the
target's MTP head per token.

``calibrate`` measures it once per machine and pair, before the first cycle; the policy
then keeps it current from every cycle's timings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .backend import Backend

MAX_BATCH = 16
# Batch sizes measured once per machine and pair: CPU kernels make some sizes cheaper
# than smaller ones (4 rows at once with repacked weights), so no curve is assumed.
CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16)


@dataclass
class CostModel:
    """Seconds per target pass by batch size, and per draft-model token."""

    verify_s: dict[int, float] = field(default_factory=dict)
    draft_first_s: float | None = None
    draft_step_s: float | None = None
    lookup_s: float = 2e-5
    gpu: bool = False
    mtp_first_s: float | None = None  # the MTP head: catch-up on the confirmed tokens + first draft
    mtp_step_s: float | None = None

    @property
    def calibrated(self) -> bool:
        return all(n in self.verify_s for n in CALIBRATION_SIZES[:6])

    def update(self, measured: "CostModel") -> None:
        """Take what ``measured`` holds, keep the rest."""
        self.verify_s.update(measured.verify_s)
        if measured.draft_first_s is not None:
            self.draft_first_s = measured.draft_first_s
        if measured.draft_step_s is not None:
            self.draft_step_s = measured.draft_step_s
        if measured.mtp_first_s is not None:
            self.mtp_first_s = measured.mtp_first_s
        if measured.mtp_step_s is not None:
            self.mtp_step_s = measured.mtp_step_s

    # A pass the OS preempted can take 10x longer; clipping keeps one hiccup from
    # steering several cycles, while a real slowdown still shows within a few passes.
    def observe_verify(self, n: int, seconds: float) -> None:
        self.verify_s[n] = _ema(self.verify_s.get(n), seconds)

    def observe_draft(self, k: int, seconds: float, first_s: float) -> None:
        self.draft_first_s = _ema(self.draft_first_s, first_s)
        if k > 1:
            self.draft_step_s = _ema(self.draft_step_s, (seconds - first_s) / (k - 1))

    def draft(self, k: int) -> float:
        """Seconds for the draft model to propose k tokens."""
        first = self.draft_first_s if self.draft_first_s is not None else 0.6 * self.verify(1)
        step = self.draft_step_s if self.draft_step_s is not None else 0.4 * self.verify(1)
        return first + (k - 1) * step

    def observe_mtp(self, k: int, seconds: float, first_s: float) -> None:
        self.mtp_first_s = _ema(self.mtp_first_s, first_s)
        if k > 1:
            self.mtp_step_s = _ema(self.mtp_step_s, (seconds - first_s) / (k - 1))

    def mtp(self, k: int) -> float:
        """Seconds for the MTP head to propose k tokens (unmeasured: a layer and the LM head,
        guessed at a fifth of a target pass)."""
        first = self.mtp_first_s if self.mtp_first_s is not None else 0.2 * self.verify(1)
        step = self.mtp_step_s if self.mtp_step_s is not None else 0.2 * self.verify(1)
        return first + (k - 1) * step

    def verify(self, n: int) -> float:
        if n in self.verify_s:
            return self.verify_s[n]
        known = sorted(self.verify_s.items())
        if not known:
            return 0.05 * (1 + (0.05 if self.gpu else 0.5) * (n - 1))
        # Linear in the batch size between / beyond the measured sizes; never cheaper than one fewer.
        lower = [(k, v) for k, v in known if k < n]
        upper = [(k, v) for k, v in known if k > n]
        if lower and upper:
            (k0, v0), (k1, v1) = lower[-1], upper[0]
            return v0 + (v1 - v0) * (n - k0) / (k1 - k0)
        if len(known) >= 2:
            (k0, v0), (k1, v1) = (known[-2], known[-1]) if lower else (known[0], known[1])
            slope = max((v1 - v0) / (k1 - k0), 0.0)
            base_k, base_v = (k1, v1) if lower else (k0, v0)
            return max(base_v + slope * (n - base_k), base_v if n > base_k else 0.0)
        k0, v0 = known[0]
        per = v0 / (1 + (0.05 if self.gpu else 0.5) * (k0 - 1))
        return per * (1 + (0.05 if self.gpu else 0.5) * (n - 1))

    def to_json(self) -> dict:
        return {"verify_s": {str(k): v for k, v in self.verify_s.items()}, "draft_first_s": self.draft_first_s,
                "draft_step_s": self.draft_step_s, "gpu": self.gpu,
                "mtp_first_s": self.mtp_first_s, "mtp_step_s": self.mtp_step_s}

    @classmethod
    def from_json(cls, d: dict) -> "CostModel":
        return cls({int(k): float(v) for k, v in d.get("verify_s", {}).items()}, d.get("draft_first_s"),
                   d.get("draft_step_s"), gpu=bool(d.get("gpu", False)),
                   mtp_first_s=d.get("mtp_first_s"), mtp_step_s=d.get("mtp_step_s"))


def _ema(old: float | None, new: float) -> float:
    return new if old is None else 0.8 * old + 0.2 * min(new, 3 * old)


def calibrate(target: Backend, draft: Backend | None, token: int, clock: Callable[[], float],
              mtp=None, context: Sequence[int] = ()) -> CostModel:
    """Time the target's pass by batch size (and the draft model's, or the MTP drafter's on
    ``context``, first and next token).

    Decodes ``token`` repeated after what each KV cache holds, and trims it away again:
    the caches end as they began.
    """

    def timed(model: Backend, tokens: Sequence[int]) -> float:
        keep = model.n_past
        t = clock()
        model.decode(tokens, rows=range(len(tokens)))
        seconds = clock() - t
        model.trim(keep)
        return seconds

    measured = CostModel()
    # A recurrent target cannot undo a whole pass (only drafts within one): it is timed live.
    recurrent = getattr(target, "max_rollback", None) is not None
    sizes = [n for n in CALIBRATION_SIZES if target.n_past + n <= target.n_ctx and not recurrent]
    if sizes:
        timed(target, [token])  # warm-up: the first pass after loading pages weights in
    for _ in range(3):  # rounds across all sizes: a passing hiccup spoils one sample, not a size
        for n in sizes:
            measured.verify_s[n] = min(measured.verify_s.get(n, float("inf")), timed(target, [token] * n))
    if draft is not None and draft.n_past + 2 <= draft.n_ctx:
        timed(draft, [token])
        # A cycle's first draft token follows a catch-up on ~2 new tokens.
        measured.draft_first_s = min(timed(draft, [token] * 2) for _ in range(2))
        measured.draft_step_s = min(timed(draft, [token]) for _ in range(3))
    if mtp is not None and context:
        measured.mtp_first_s, measured.mtp_step_s = mtp.measure(context)
    return measured
