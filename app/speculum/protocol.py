"""Everything the window and the engine process say to each other, as types.

Commands go down the pipe from the window (``ui/worker.py``) to the engine process
(``engine_process.py``); events come back. Both are plain dataclasses, pickled by
``multiprocessing`` as they are, and each side routes them by type. An API client's request
(``server/service.py``) is told with the same events as the window's own answers, tagged
with who asked (``Asker``). No type here loads llama.cpp or Qt: the window unpickles them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .engine.policy.auto import MAX_K as SHOWN_POSITIONS
from .engine.backend import ModelFacts
from .engine.cycle import Cycle, PolicyReport
from .engine.plaincheck import PlainCheck
from .engine.settings import LoadOptions
from .engine.stats import Stats
from .engine.vocabulary import Finish, Mode, Role, Source, Word


class Asker(str, Enum):
    """Whose generation an event is about."""
    WINDOW = "window"
    API = "api"


# -- what the window asks for ----------------------------------------------------------------

@dataclass
class LoadRequest:
    target: str
    draft: str | None = None
    options: LoadOptions = LoadOptions()  # how to load them, passed whole down to each model


@dataclass
class GenerationRequest:
    conversation_id: str
    messages: list[dict]  # the conversation so far, ending with the new user turn
    mode: Mode = Mode.AUTO
    k: int | None = None  # None: adaptive; otherwise forced modes draft exactly k
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 0  # 0: until the answer ends or the context is full
    document: str | None = None  # set: summarise this document (in parts when long)
    continues: list[int] = field(default_factory=list)  # the answer so far (token ids) to write on from


# -- the numbers the stats panel shows ---------------------------------------------------------

@dataclass
class PartPrompt:
    """One part's own prompt, in an answer written in parts (a long document's summary)."""
    stage: str  # "Part 2 of 5", "Combining"
    tokens: int  # decoded this time
    total: int
    reused: int  # found in the KV cache

    @classmethod
    def of(cls, stage: str, tokens: int, total: int, cached: int | None) -> "PartPrompt":
        processed, reused = prompt_counts(tokens, total, cached)
        return cls(stage, processed, total, reused)


def reused_of(tokens: int, total: int, cached: int | None) -> int:
    """Prompt tokens found in the KV cache. The prompt's last token is read with the rest, or
    by the first cycle, unless the prompt was seen whole with its last row (all reused). (Where what was reused is not known, as in answers saved before it
    was kept, the rest of the prompt was: unless the answer was stopped while it was read.)"""
    return cached if cached is not None else max(total - 1 - tokens, 0) if total else 0


def prompt_counts(tokens: int, total: int, cached: int | None) -> tuple[int, int]:
    """(processed, reused) of a prompt of ``total`` tokens, of which the decoder read ``tokens``
    before its last one. The last token is read too (with the rest, or by the first cycle): once
    everything before it was, processed + reused = total; a Stop while reading leaves less. (The
    decoder's count left it out: "412 of 530 tokens (117 reused)" beside a bar of 529.)"""
    reused = reused_of(tokens, total, cached)
    if total and tokens + reused == total - 1:
        tokens += 1
    return tokens, reused


def prompt_progress(read: int, known: int) -> tuple[int, int]:
    """The decoder's prompt progress (``read`` of the ``known`` tokens before the last) as the
    window shows it: of the whole prompt, the last token read with the last chunk."""
    return read + (read >= known), known + 1


class Yardstick(Word):
    """What an answer's speedup stands on."""
    MEASURED = "measured"  # its own plain steps, or plain decoding measured here minutes ago
    ESTIMATE = "estimate"
    PLAIN = "plain decoding"  # nothing drafted: the answer is plain decoding, no speedup to tell
    NONE = ""  # nothing to go on yet

@dataclass
class StatsSnapshot:
    """What the stats panel shows after a cycle; computed in the engine so widgets only display."""
    acceptance_rate: float = 0.0
    acceptance_by_position: list[float] = field(default_factory=list)
    tokens_per_s: float = 0.0
    tokens_per_pass: float = 0.0
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    speedup: float | None = None  # against plain decoding on this machine
    speedup_source: Yardstick = Yardstick.NONE
    speedup_basis: str = ""  # what it was measured against, in words (the row's tooltip)
    plain_rate: float | None = None  # the one plain decoding speed the panel shows (and divides by)
    plain_from: str = ""  # where that speed comes from, in a few words
    plain_known: float | None = None  # the plain rate known when the answer began (kept for replay)
    plain_age_s: float | None = None  # how long before it was measured here; None: an earlier run
    policy: PolicyReport | None = None  # the last cycle's policy report
    prompt_tokens: int = 0  # decoded this time (the rest came from the KV cache)
    prompt_total: int = 0
    prompt_reused: int = 0  # prompt tokens found in the KV cache of the conversation so far
    part_prompt: PartPrompt | None = None  # the prompt of the part being written (answers in parts)


# A plain rate older than this is not a measurement of now: this machine's speed moves with its
# load (9 to 13 tok/s within an hour on a 2-core CPU).
RECENT_PLAIN_S = 300.0
OWN_PLAIN_STEPS = 2  # plain steps an answer needs before they are its yardstick


def is_plain_step(cycle) -> bool:
    """A target pass that wrote one token with nothing drafted. Not a first token whose row came
    with the prompt's last chunk (no pass of its own): timed at its loop's millisecond, it read as
    plain decoding at 892 tok/s, and the next answer's speedup as 0.01×."""
    return cycle.source == Source.NONE and len(cycle.emitted) == 1 and cycle.verify_s > 0


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s ago" if seconds < 90 else f"{seconds / 60:.0f} min ago"


@dataclass
class PlainBasis:
    """What an answer's speedup is measured against: the plain steps it took itself, where it
    took some; else a plain rate measured on this machine in the last minutes; else the ratio is
    only an estimate, and says so."""
    rate: float | None = None  # plain tokens/s known when the answer began
    age_s: float | None = None  # since this engine measured it; None: from an earlier run
    tokens: int = 0  # the answer's own plain steps
    seconds: float = 0.0

    def observe(self, cycle) -> None:
        if is_plain_step(cycle):
            self.tokens += 1
            self.seconds += cycle.seconds

    def plain(self, policy) -> tuple[float | None, str]:
        """The one plain decoding speed for this answer, and where it comes from in a few words:
        its own plain steps, else a rate measured here, else the policy's cost model."""
        if self.tokens >= OWN_PLAIN_STEPS:
            return self.tokens / self.seconds, "in this answer"
        if self.rate:
            return self.rate, f"measured {_ago(self.age_s)}" if self.age_s is not None else "from a past session"
        if policy is not None and policy.plain_tokens_per_s:
            return policy.plain_tokens_per_s, "cost model estimate"
        return None, ""

    def speedup(self, tokens_per_s: float, policy, drafted: int = 1) -> tuple[float | None, Yardstick, str]:
        """(speedup, what it stands on, its basis in words) for an answer at ``tokens_per_s`` that
        drafted ``drafted`` tokens (none: plain decoding, its "speedup" 1 by construction)."""
        if not tokens_per_s:
            return None, Yardstick.NONE, ""
        plain, said = self.plain(policy)
        if not drafted:
            return (None, Yardstick.PLAIN, "Nothing was drafted: this answer is plain decoding"
                    + (f" ({plain:.1f} tok/s {said})." if plain else "."))
        if self.tokens >= OWN_PLAIN_STEPS:
            return (tokens_per_s / plain, Yardstick.MEASURED,
                    f"Against the {self.tokens} plain steps in this answer ({plain:.1f} tok/s).")
        if self.rate and self.age_s is not None and self.age_s <= RECENT_PLAIN_S:
            return (tokens_per_s / self.rate, Yardstick.MEASURED,
                    f"Against plain decoding measured on this machine {_ago(self.age_s)} ({self.rate:.1f} tok/s).")
        if plain:
            source = ((f"a plain rate measured {_ago(self.age_s)}" if self.age_s is not None
                       else "a plain rate measured in an earlier session") if self.rate
                      else "the policy's cost model's plain rate")
            return (tokens_per_s / plain, Yardstick.ESTIMATE,
                    f"Estimate: no plain step in this answer; against {source} ({plain:.1f} tok/s), "
                    "and this machine's speed moves with its load.")
        if policy is not None and policy.expected_speedup:
            return (float(policy.expected_speedup), Yardstick.ESTIMATE,
                    "Estimate: the policy's expected speedup for its last choice; no plain rate measured yet.")
        return None, Yardstick.NONE, ""


def snapshot_of(stats: Stats, cycle, plain: PlainBasis | float | None, prompt_total: int = 0,
                part_prompt: PartPrompt | None = None) -> StatsSnapshot:
    """Stats after ``cycle``. The speedup is the answer's rate so far against ``plain`` (which has
    seen the answer's cycles up to this one; a bare rate: one with no age, an estimate). The
    policy's estimate for the cycle only while no plain rate is known: the row tells the answer,
    not the last cycle's hopes (the Policy row shows those)."""
    if not isinstance(plain, PlainBasis):
        plain = PlainBasis(plain)
    policy = cycle.policy
    speedup, source, basis = plain.speedup(stats.tokens_per_s, policy, stats.drafted)
    plain_rate, plain_from = plain.plain(policy)
    processed, reused = prompt_counts(stats.prompt_tokens, prompt_total, stats.prompt_cached)
    return StatsSnapshot(
        acceptance_rate=stats.acceptance_rate,
        # The positions any draft reaches; a recalled copy's deeper ones (auto.RECALL_K) would
        # narrow the bars past reading, and are all but always right.
        acceptance_by_position=stats.acceptance_by_position[:SHOWN_POSITIONS],
        tokens_per_s=stats.tokens_per_s,
        tokens_per_pass=stats.tokens_per_pass,
        tokens=stats.tokens,
        seconds=stats.seconds,
        drafted=stats.drafted,
        speedup=speedup,
        speedup_source=source,
        speedup_basis=basis,
        plain_rate=plain_rate,
        plain_from=plain_from,
        plain_known=plain.rate,
        plain_age_s=plain.age_s,
        policy=policy,
        prompt_tokens=processed,
        prompt_total=prompt_total,
        prompt_reused=reused,
        part_prompt=part_prompt,
    )


def replay_snapshots(cycles: list, plain: PlainBasis | float | None = None, prompt_tokens: int = 0,
                     prompt_total: int = 0, prompt_reused: int | None = None,
                     parts: list[PartPrompt | None] | None = None) -> list[StatsSnapshot]:
    """The stats as they stood after each stored cycle, for replay (the prompt's counts and the
    plain rate known when the answer began, as stored). ``parts``: for an answer in parts, each
    cycle's part prompt; then each part's prompt joins the counts as the part begins (its first
    cycle, numbered 0), as they did while it was written."""
    in_parts = bool(parts) and any(parts)
    stats = Stats() if in_parts else Stats(prompt_tokens=prompt_tokens, prompt_cached=prompt_reused)
    total = 0 if in_parts else prompt_total
    basis = plain if isinstance(plain, PlainBasis) else PlainBasis(plain)
    out = []
    for i, cycle in enumerate(cycles):
        part = parts[i] if in_parts and i < len(parts) else None
        if part is not None and (cycle.index == 0 or i == 0):
            stats.merge(Stats(prompt_tokens=part.tokens, prompt_cached=part.reused))
            total += part.total
        stats.add(cycle)
        basis.observe(cycle)
        out.append(snapshot_of(stats, cycle, basis, total, part))
    return out


def replay_pace(cycles: list) -> list[float]:
    """Each replay step's seconds as it happened: a cycle's draft proposed after its drafting
    (and the loop's own time), then verified after its target pass."""
    return [s for c in cycles for s in (c.draft_s + c.overhead_s, c.verify_s)]


@dataclass
class GenerationResult:
    conversation_id: str
    text: str
    cycles: list[Cycle]  # of the final answer (all stages for a long document)
    snapshot: StatsSnapshot
    finish: Finish | None
    note: str
    mode: Mode
    part_summaries: list[str] = field(default_factory=list)


# -- commands: window -> engine process ----------------------------------------------------------

class Command:
    """A request to the engine process; ``failure`` is how it reports a Python error in it."""

    def failure(self, message: str) -> "Event":
        return Failed(message)


@dataclass
class Load(Command):
    request: LoadRequest
    profile: str = ""  # an engine profile chosen after a crash; "": the one this machine remembers
    why: str = ""  # why that profile was chosen

    def failure(self, message: str) -> "Event":
        return LoadFailed(message)


@dataclass
class Generate(Command):
    request: GenerationRequest


@dataclass
class CheckPlain(Command):
    """Decode an answer's prompt plainly and compare with the answer, token by token
    (engine/plaincheck.py); Stop cancels it."""
    conversation_id: str
    index: int  # the answer's message in the conversation (told back with the result)
    messages: list[dict]  # the conversation before the answer, as it was sent
    answer: list[int]  # the answer's token ids

    def failure(self, message: str) -> "Event":
        return PlainCheckFailed(message)


@dataclass
class SetPlainRate(Command):
    tokens_per_s: float | None


@dataclass
class PostponeMeasuring(Command):
    """The engine's idle measurement of this machine waits: ``seconds`` after the user's last
    keystroke, or as long as the user asked ("Later"); None: not again while this engine runs."""
    seconds: float | None


@dataclass
class Serve(Command):
    host: str
    port: int
    api_key: str | None
    mode: Mode

    def failure(self, message: str) -> "Event":
        return ServeFailed(message)


@dataclass
class StopServing(Command):
    pass


@dataclass
class Quit(Command):
    pass


# -- events: engine process -> window ------------------------------------------------------------

class Event:
    """Something the engine reports."""


@dataclass
class Ready(Event):
    gpu: str | None  # the engine process's GPU backend name, None on the CPU
    cpu_settings: dict  # how llama.cpp's threads wait (engine.cpu_settings.in_effect)


@dataclass
class ProfileChosen(Event):
    name: str
    why: str  # empty: the standard profile


@dataclass
class LoadProgress(Event):
    stage: Role  # which model of the pair is loading
    fraction: float


@dataclass
class Loaded(Event):
    target: ModelFacts
    draft: ModelFacts | None


@dataclass
class LoadFailed(Event):
    message: str


@dataclass
class Started(Event):
    """A generation took the models (an API request's; the window knows when its own start)."""
    prompt_tokens: int
    asker: Asker = Asker.API
    client: str = ""  # the API client's address, where one asked


@dataclass
class PromptProgress(Event):
    read: int
    total: int


@dataclass
class StageChanged(Event):
    stage: str  # "Part 2 of 5", "Combining the part summaries"


@dataclass
class CycleEvent(Event):
    cycle: Cycle
    snapshot: StatsSnapshot
    stage: str = ""  # "Part 2 of 5", "Combining" for a long document, "API request"; "" otherwise
    asker: Asker = Asker.WINDOW


@dataclass
class Decoded(Event):
    """A generation let go of the models, however it ended (the next may take them)."""
    asker: Asker = Asker.API


@dataclass
class Finished(Event):
    result: GenerationResult | None  # the window's answer; None for an API request
    asker: Asker = Asker.WINDOW
    usage: dict | None = None  # an API request's OpenAI usage


@dataclass
class Failed(Event):
    message: str
    asker: Asker = Asker.WINDOW


@dataclass
class PlainCheckProgress(Event):
    checked: int  # answer tokens found equal to plain decoding's so far
    total: int


@dataclass
class PlainChecked(Event):
    conversation_id: str
    index: int
    result: PlainCheck


@dataclass
class PlainCheckFailed(Event):
    message: str


@dataclass
class Measuring(Event):
    """The engine is (no longer) measuring this machine's costs for auto mode, between requests."""
    active: bool


@dataclass
class PlainRateMeasured(Event):
    target: str  # the target's path
    tokens_per_s: float


@dataclass
class ServingAt(Event):
    url: str  # empty: serving stopped
    model_id: str


@dataclass
class ServeFailed(Event):
    message: str


@dataclass
class WorkerLost(Event):
    """The engine's last words before llama.cpp aborts for a lost RPC worker."""
    words: str


@dataclass
class Batch(Event):
    """Cycles held back to travel together, then the event that released them."""
    events: list
