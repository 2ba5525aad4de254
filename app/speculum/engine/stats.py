"""Running statistics over a stream of cycles."""

from __future__ import annotations

from dataclasses import dataclass, field

from .cycle import Cycle


@dataclass
class Stats:
    tokens: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # per draft position
    accepted_at: list[int] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    overhead_s: float = 0.0
    prompt_tokens: int = 0  # prompt tokens actually decoded (not reused from the cache)
    prompt_cached: int | None = None  # prompt tokens reused from the cache (None: not known)
    prompt_s: float = 0.0
    by_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [drafted, accepted]
    passes_by_source: dict[str, int] = field(default_factory=dict)  # what the policy chose, per pass
    tokens_over_time: list[tuple[float, int]] = field(default_factory=list)  # (seconds, tokens)

    def add(self, cycle: Cycle) -> None:
        self.tokens += len(cycle.emitted)
        self.passes += 1
        self.drafted += len(cycle.drafted)
        self.accepted += cycle.n_accepted
        for i in range(len(cycle.drafted)):
            if i == len(self.drafted_at):
                self.drafted_at.append(0)
                self.accepted_at.append(0)
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < cycle.n_accepted
        self.passes_by_source[cycle.source] = self.passes_by_source.get(cycle.source, 0) + 1
        if cycle.drafted:
            s = self.by_source.setdefault(cycle.source, [0, 0])
            s[0] += len(cycle.drafted)
            s[1] += cycle.n_accepted
        self.draft_s += cycle.draft_s
        self.verify_s += cycle.verify_s
        self.overhead_s += cycle.overhead_s
        self.tokens_over_time.append((self.seconds, self.tokens))

    def merge(self, other: "Stats") -> "Stats":
        """Add ``other``'s counts to these, as if its cycles had come after (repeats, parts)."""
        seconds, tokens = self.seconds, self.tokens
        self.tokens += other.tokens
        self.passes += other.passes
        self.drafted += other.drafted
        self.accepted += other.accepted
        for i, (d, a) in enumerate(zip(other.drafted_at, other.accepted_at)):
            if i == len(self.drafted_at):
                self.drafted_at.append(0)
                self.accepted_at.append(0)
            self.drafted_at[i] += d
            self.accepted_at[i] += a
        self.draft_s += other.draft_s
        self.verify_s += other.verify_s
        self.overhead_s += other.overhead_s
        self.prompt_tokens += other.prompt_tokens
        if other.prompt_cached is not None:
            self.prompt_cached = (self.prompt_cached or 0) + other.prompt_cached
        self.prompt_s += other.prompt_s
        for source, (d, a) in other.by_source.items():
            s = self.by_source.setdefault(source, [0, 0])
            s[0] += d
            s[1] += a
        for source, n in other.passes_by_source.items():
            self.passes_by_source[source] = self.passes_by_source.get(source, 0) + n
        self.tokens_over_time += [(seconds + s, tokens + n) for s, n in other.tokens_over_time]
        return self

    @property
    def seconds(self) -> float:
        return self.draft_s + self.verify_s + self.overhead_s

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def overhead_ms_per_cycle(self) -> float:
        return 1000 * self.overhead_s / self.passes if self.passes else 0.0

    @property
    def draft_share(self) -> float:
        """Share of the time spent drafting."""
        return self.draft_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def choices(self) -> dict[str, float]:
        """What the policy chose: share of target passes per drafter ("none": a plain step)."""
        return {source: n / self.passes for source, n in sorted(self.passes_by_source.items())}

    def summary(self) -> dict:
        return {
            "tokens": self.tokens,
            "passes": self.passes,
            "tokens_per_s": round(self.tokens_per_s, 3),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "acceptance_by_position": [round(a, 4) for a in self.acceptance_by_position],
            "tokens_per_pass": round(self.tokens_per_pass, 4),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "overhead_s": round(self.overhead_s, 4),
            "overhead_ms_per_cycle": round(self.overhead_ms_per_cycle, 4),
            "prompt_tokens": self.prompt_tokens,
            "prompt_cached": self.prompt_cached,
            "prompt_s": round(self.prompt_s, 4),
            "passes_by_source": dict(self.passes_by_source),
        }
