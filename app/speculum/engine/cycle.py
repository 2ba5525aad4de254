"""One ``Cycle`` per target pass: the event every consumer (CLI, bench, window) reads."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from ..records import RecordError, field_types, typed_fields, zero

from .vocabulary import Finish, Mode, Source


@dataclass(frozen=True)
class PolicyReport:
    """The policy's choice for a cycle and, in the measured modes, its estimates.

    Serialises to the dict ``Cycle.policy`` always held: an estimate the policy did not
    give is left out, not written as null.
    """

    source: Source
    k: int
    mode: Mode | None = None
    plain_tokens_per_s: float | None = None
    verify_cost: dict[int, float] | None = None  # pass time with n tokens, in single steps
    draft_cost: dict[int, float] | None = None  # draft model time for k tokens, in single steps
    model_acceptance: list[float] | None = None  # per draft position
    min_confidence: float | None = None
    expected_tokens_per_s: float | None = None
    expected_tokens_per_pass: float | None = None
    lookup_match: int | None = None
    expected_speedup: float | None = None
    learning: bool | None = None  # still on default costs for part of what it may choose

    def to_json(self) -> dict:
        values = vars(self)  # (its fields' values: a frozen dataclass keeps them in its __dict__)
        return {f.name: values[f.name] for f in fields(self) if values[f.name] is not None}

    @classmethod
    def from_json(cls, d: dict) -> "PolicyReport":
        """From ``to_json`` output, or from the dict an older version stored."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        values.setdefault("source", Source.NONE)
        values.setdefault("k", 0)
        values["source"] = _word(Source, values["source"])
        if values.get("mode") is not None:
            values["mode"] = _word(Mode, values["mode"])
        for cost in ("verify_cost", "draft_cost"):  # JSON object keys come back as strings
            if isinstance(values.get(cost), dict):
                values[cost] = {int(n): c for n, c in values[cost].items()}
        return cls(**values)


_ONLY_WHEN_ASKED = ("logprobs", "top_tokens", "top_logprobs")


def _word(enum, value):
    """The member for a stored string; an unknown string (a newer drafter) stays as it is."""
    try:
        return enum(value)
    except ValueError:
        return value


@dataclass
class Cycle:
    index: int
    source: Source  # drafter that proposed; Source.NONE for a plain step
    k: int  # draft length the policy asked for
    drafted: list[int]
    drafted_text: list[str]
    n_accepted: int
    emitted: list[int]  # accepted drafts, then the target's correction or bonus token
    emitted_text: list[str]
    text: str  # text this cycle adds to the answer (partial UTF-8 held back)
    p_drafted: list[float] = field(default_factory=list)  # target p of each drafted token
    p_emitted: list[float] = field(default_factory=list)  # target p of each emitted token
    # When asked for (``Decoder.generate(logprobs=n)``): per emitted token, its log-probability
    # in the target's distribution there (temperature 1, after penalties and the grammar's mask),
    # and the n likeliest tokens there with theirs, likeliest first.
    logprobs: list[float] = field(default_factory=list)
    top_tokens: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    draft_confidence: list[float] = field(default_factory=list)  # the drafter's own p of each draft
    match_length: int = 0  # lookup: length of the context suffix the draft was copied after
    draft_s: float = 0.0
    draft_first_s: float = 0.0  # model drafts: catching up and proposing the first token
    verify_s: float = 0.0
    overhead_s: float = 0.0
    n_generated: int = 0  # tokens generated up to and including this cycle
    finish: Finish | None = None
    message: str = ""  # plain words for the user when the generation ended early
    policy: PolicyReport | None = None  # the policy's choice and estimates

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
        # Field by field, lists copied: asdict deep-copies every number, and the window stores
        # every cycle of every answer.
        values = vars(self)
        d = {f.name: (list(v) if isinstance(v := values[f.name], list) else v) for f in fields(self)}
        d["policy"] = self.policy.to_json() if self.policy is not None else {}
        d["rejected"] = self.rejected
        for name in _ONLY_WHEN_ASKED:  # a record without them reads and saves as before they existed
            if not d[name]:
                del d[name]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Cycle":
        """A stored cycle. A field an older version did not write takes its empty value, so a
        new field never breaks old conversations; a field of the wrong type, or counts that
        disagree, raise RecordError: a damaged record is refused whole, never half drawn.
        Words a newer version wrote (a drafter this one does not know) stay as strings."""
        if not isinstance(d, dict):
            raise RecordError("a stored cycle is not an object")
        kept, problems = typed_fields(cls, {k: v for k, v in d.items() if k != "policy"})
        if problems:
            raise RecordError("a stored cycle's " + "; ".join(problems))
        for name, spec in cls.__dataclass_fields__.items():
            if name not in kept and spec.default is MISSING and spec.default_factory is MISSING:
                kept[name] = Source.NONE if name == "source" else zero(field_types(cls)[name])
        policy = d.get("policy")
        if policy is not None and not isinstance(policy, dict):
            raise RecordError(f"a stored cycle's 'policy' was {type(policy).__name__}, not an object")
        if policy:
            try:
                kept["policy"] = PolicyReport.from_json(policy)
            except (TypeError, ValueError):
                raise RecordError("a stored cycle's policy report is damaged") from None
        cycle = cls(**kept)
        if not 0 <= cycle.n_accepted <= len(cycle.drafted) or len(cycle.drafted_text) > len(cycle.drafted):
            raise RecordError("a stored cycle's counts disagree (more accepted or drafted text than drafted)")
        return cycle
