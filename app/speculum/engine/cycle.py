"""One ``Cycle`` per target pass: the event every consumer (CLI, bench, window) reads."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field

from ..records import RecordError, field_types, typed_fields, zero

# Why a generation ended.
EOG = "eog"
MAX_TOKENS = "max_tokens"
STOPPED = "stopped"
CONTEXT_FULL = "context_full"


@dataclass
class Cycle:
    index: int
    source: str  # drafter that proposed: "model", "lookup" or "none" (a plain step)
    k: int  # draft length the policy asked for
    drafted: list[int]
    drafted_text: list[str]
    n_accepted: int
    emitted: list[int]  # accepted drafts, then the target's correction or bonus token
    emitted_text: list[str]
    text: str  # text this cycle adds to the answer (partial UTF-8 held back)
    p_drafted: list[float] = field(default_factory=list)  # target p of each drafted token
    p_emitted: list[float] = field(default_factory=list)  # target p of each emitted token
    draft_confidence: list[float] = field(default_factory=list)  # the drafter's own p of each draft
    match_length: int = 0  # lookup: length of the n-gram the draft was copied after
    draft_s: float = 0.0
    draft_first_s: float = 0.0  # model drafts: catching up and proposing the first token
    verify_s: float = 0.0
    overhead_s: float = 0.0
    n_generated: int = 0  # tokens generated up to and including this cycle
    finish: str | None = None
    message: str = ""  # plain words for the user when the generation ended early
    policy: dict = field(default_factory=dict)  # the policy's choice and estimates

    @property
    def rejected(self) -> list[int]:
        return self.drafted[self.n_accepted:]

    @property
    def correction(self) -> int | None:
        """The target's own token after the accepted drafts (None when cut at max tokens)."""
        return self.emitted[self.n_accepted] if len(self.emitted) > self.n_accepted else None

    @property
    def seconds(self) -> float:
        return self.draft_s + self.verify_s + self.overhead_s

    def to_json(self) -> dict:
        d = asdict(self)
        d["rejected"] = self.rejected
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Cycle":
        """A stored cycle. A field an older version did not write takes its empty value, so a
        new field never breaks old conversations; a field of the wrong type, or counts that
        disagree, raise RecordError: a damaged record is refused whole, never half drawn."""
        if not isinstance(d, dict):
            raise RecordError("a stored cycle is not an object")
        kept, problems = typed_fields(cls, d)
        if problems:
            raise RecordError("a stored cycle's " + "; ".join(problems))
        for name, spec in cls.__dataclass_fields__.items():
            if name not in kept and spec.default is MISSING and spec.default_factory is MISSING:
                kept[name] = zero(field_types(cls)[name])
        cycle = cls(**kept)
        if not 0 <= cycle.n_accepted <= len(cycle.drafted) or len(cycle.drafted_text) > len(cycle.drafted):
            raise RecordError("a stored cycle's counts disagree (more accepted or drafted text than drafted)")
        return cycle
