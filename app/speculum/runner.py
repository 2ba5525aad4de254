"""What the engine process does with the window's requests, without Qt.

``EngineRunner`` owns the loaded models and runs one request at a time: a chat answer, or a
document summary (in parts when the document is longer than the context). It reports through
a plain callback, so the same code runs in the engine process and, for tests, in-process.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from . import summarise
from .engine.loading import LoadOptions, load_decoder
from .engine.sampling import SamplingParams
from .engine.stats import Stats
from .engine.vocabulary import Finish, Mode, Source
from .errors import SpeculumError


@dataclass
class LoadRequest:
    target: str
    draft: str | None = None
    n_ctx: int = 4096
    target_gpu_layers: int | None = None  # None: all on the GPU when there is one
    draft_gpu_layers: int | None = None
    rpc: tuple[str, ...] = ()  # RPC workers (HOST:PORT) that take the target's layers; the draft stays local


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


@dataclass
class StatsSnapshot:
    """What the stats panel shows after a cycle; computed here so widgets only display."""
    acceptance_rate: float = 0.0
    acceptance_by_position: list[float] = field(default_factory=list)
    tokens_per_s: float = 0.0
    tokens_per_pass: float = 0.0
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    speedup: float | None = None  # against plain decoding on this machine
    speedup_source: str = ""  # "measured" or "estimate"
    speedup_basis: str = ""  # what it was measured against, in words (the row's tooltip)
    plain_known: float | None = None  # the plain rate known when the answer began (kept for replay)
    plain_age_s: float | None = None  # how long before it was measured here; None: an earlier run
    policy: dict = field(default_factory=dict)
    prompt_tokens: int = 0  # decoded this time (the rest came from the KV cache)
    prompt_total: int = 0
    prompt_reused: int = 0  # prompt tokens found in the KV cache of the conversation so far


@dataclass
class CycleEvent:
    cycle: object  # speculum.engine.cycle.Cycle
    snapshot: StatsSnapshot
    stage: str = ""  # "Part 2 of 5", "Combining" for a long document; "" otherwise


@dataclass
class GenerationResult:
    conversation_id: str
    text: str
    cycles: list  # Cycle objects of the final answer (all stages for a long document)
    snapshot: StatsSnapshot
    finish: str | None
    note: str
    mode: str
    part_summaries: list[str] = field(default_factory=list)


# A plain rate older than this is not a measurement of now: this machine's speed moves with its
# load (9 to 13 tok/s within an hour on a 2-core CPU).
RECENT_PLAIN_S = 300.0
OWN_PLAIN_STEPS = 2  # plain steps an answer needs before they are its yardstick


def _is_plain_step(cycle) -> bool:
    return cycle.source == Source.NONE and len(cycle.emitted) == 1 and cycle.seconds > 0


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
        if _is_plain_step(cycle):
            self.tokens += 1
            self.seconds += cycle.seconds

    def speedup(self, tokens_per_s: float, policy) -> tuple[float | None, str, str]:
        """(speedup, "measured" or "estimate", its basis in words) for an answer at ``tokens_per_s``."""
        if not tokens_per_s:
            return None, "", ""
        if self.tokens >= OWN_PLAIN_STEPS:
            own = self.tokens / self.seconds
            return (tokens_per_s / own, "measured",
                    f"Against the {self.tokens} plain steps in this answer ({own:.1f} tok/s).")
        if self.rate and self.age_s is not None and self.age_s <= RECENT_PLAIN_S:
            return (tokens_per_s / self.rate, "measured",
                    f"Against plain decoding measured on this machine {_ago(self.age_s)} ({self.rate:.1f} tok/s).")
        when = (f"measured {_ago(self.age_s)}" if self.age_s is not None else "measured in an earlier session")
        plain, said = self.rate, f"a plain rate {when}"
        if not plain and policy is not None and policy.plain_tokens_per_s:
            plain, said = policy.plain_tokens_per_s, "the policy's cost model's plain rate"
        if plain:
            return (tokens_per_s / plain, "estimate",
                    f"Estimate: no plain step in this answer; against {said} ({plain:.1f} tok/s), "
                    "and this machine's speed moves with its load.")
        if policy is not None and policy.expected_speedup:
            return (float(policy.expected_speedup), "estimate",
                    "Estimate: the policy's expected speedup for its last choice; no plain rate measured yet.")
        return None, "", ""


def snapshot_of(stats, cycle, plain: PlainBasis | float | None, prompt_total: int = 0) -> StatsSnapshot:
    """Stats after ``cycle``. The speedup is the answer's rate so far against ``plain`` (which has
    seen the answer's cycles up to this one; a bare rate: one with no age, an estimate). The
    policy's estimate for the cycle only while no plain rate is known: the row tells the answer,
    not the last cycle's hopes (the Policy row shows those)."""
    if not isinstance(plain, PlainBasis):
        plain = PlainBasis(plain)
    policy = cycle.policy
    speedup, source, basis = plain.speedup(stats.tokens_per_s, policy)
    return StatsSnapshot(
        acceptance_rate=stats.acceptance_rate,
        acceptance_by_position=stats.acceptance_by_position,
        tokens_per_s=stats.tokens_per_s,
        tokens_per_pass=stats.tokens_per_pass,
        tokens=stats.tokens,
        seconds=stats.seconds,
        drafted=stats.drafted,
        speedup=speedup,
        speedup_source=source,
        speedup_basis=basis,
        plain_known=plain.rate,
        plain_age_s=plain.age_s,
        policy=policy.to_json() if policy is not None else {},
        prompt_tokens=stats.prompt_tokens,
        prompt_total=prompt_total,
        # The prompt's last token is decoded with the first cycle, so it is neither. (Where what
        # was reused is not known, as in answers saved before it was kept, the rest of the prompt
        # was: unless the answer was stopped while it was read.)
        prompt_reused=(stats.prompt_cached if stats.prompt_cached is not None
                       else max(prompt_total - 1 - stats.prompt_tokens, 0) if prompt_total else 0),
    )


def replay_snapshots(cycles: list, plain: PlainBasis | float | None = None, prompt_tokens: int = 0,
                     prompt_total: int = 0, prompt_reused: int | None = None) -> list[StatsSnapshot]:
    """The stats as they stood after each stored cycle, for replay (the prompt's counts and the
    plain rate known when the answer began, as stored)."""
    stats = Stats(prompt_tokens=prompt_tokens, prompt_cached=prompt_reused)
    basis = plain if isinstance(plain, PlainBasis) else PlainBasis(plain)
    out = []
    for cycle in cycles:
        stats.add(cycle)
        basis.observe(cycle)
        out.append(snapshot_of(stats, cycle, basis, prompt_total))
    return out


class PlainRate:
    """Plain decoding speed of the loaded target, measured from plain steps on this machine."""

    def __init__(self, tokens_per_s: float | None = None):
        self.tokens_per_s = tokens_per_s
        self.measured_at: float | None = None  # time.monotonic() of the last plain step here; None: given

    def observe(self, cycle) -> None:
        if _is_plain_step(cycle):
            rate = 1.0 / cycle.seconds
            # A running mean that forgets slowly: one slow step must not swing it.
            self.tokens_per_s = rate if self.tokens_per_s is None else 0.9 * self.tokens_per_s + 0.1 * rate
            self.measured_at = time.monotonic()

    def basis(self) -> PlainBasis:
        """The yardstick for an answer beginning now."""
        age = time.monotonic() - self.measured_at if self.measured_at is not None else None
        return PlainBasis(self.tokens_per_s, age)


# Events the runner reports: (kind, *payload). The engine process sends them down its pipe.
Report = Callable[..., None]


class EngineRunner:
    """The loaded models and the requests run on them, one at a time."""

    def __init__(self, report: Report, stop=None, cancel_load=None):
        self.report = report
        # Anything with is_set(): threading.Event in-process, multiprocessing.Event across processes.
        self.stop = stop if stop is not None else threading.Event()
        self.cancel_load = cancel_load if cancel_load is not None else threading.Event()
        self.decoder = None
        self.target_path = ""
        self.plain = PlainRate()
        self.turn = threading.Lock()  # one generation at a time: the window's, or an API client's
        self.serving = None  # server.api.Serving while the window serves the API

    # -- loading --

    def load(self, request: LoadRequest, options: LoadOptions) -> bool:
        self.close_models()

        shown = {"stage": "", "fraction": -1.0}

        def progress(stage: str, fraction: float) -> bool:
            # llama.cpp calls this per tensor (hundreds of times): the window needs a step of 1%.
            if stage != shown["stage"] or fraction - shown["fraction"] >= 0.01 or fraction >= 1.0:
                shown.update(stage=stage, fraction=fraction)
                self.report("load_progress", stage, fraction)
            return not self.cancel_load.is_set()

        try:
            self.decoder = load_decoder(request.target, request.draft, options, progress)
        except SpeculumError as exc:
            self.report("load_failed", "Loading was cancelled." if self.cancel_load.is_set() else str(exc))
            return False
        if self.cancel_load.is_set():  # Cancel pressed as the last tensors were read: it still cancels
            self.close_models()
            self.report("load_failed", "Loading was cancelled.")
            return False
        self.target_path = request.target
        self.plain = PlainRate()
        d = self.decoder
        self.report("loaded", d.target.facts, d.draft.facts if d.draft is not None else None)
        return True

    def set_plain_rate(self, tokens_per_s: float | None) -> None:
        self.plain = PlainRate(tokens_per_s)

    def close_models(self) -> None:
        self.stop_serving()
        if self.decoder is not None:
            self.decoder.target.close()
            if self.decoder.draft is not None:
                self.decoder.draft.close()
            self.decoder = None

    # -- generating --

    def generate(self, request: GenerationRequest, on_cycle: Callable[[object], None] | None = None) -> None:
        """Run ``request``, reporting each cycle, then "finished" or "failed".

        ``on_cycle`` sees each Cycle first (the engine process's fault injection for tests).
        """
        if self.decoder is None:
            self.report("failed", "No model is loaded. Pick a target model and press Load.")
            return
        try:
            with self.turn:
                result = self._answer(request, on_cycle)
        except SpeculumError as exc:
            self.report("failed", str(exc))
            return
        if self.plain.tokens_per_s:
            self.report("plain_rate", self.target_path, self.plain.tokens_per_s)
        self.report("finished", result)

    def _answer(self, request: GenerationRequest, on_cycle) -> GenerationResult:
        shown = [""]

        def on_stage(stage: str) -> None:  # as a stage begins: its prompt is read under its name
            if stage != shown[0]:
                shown[0] = stage
                self.report("stage", "Combining the part summaries" if stage == "Combining" else stage)

        if request.document is None:
            steps = (("", cycle) for cycle in self._cycles(request, request.messages))
            return self._follow(request, steps, on_cycle, on_stage)
        summary = summarise.DocumentSummary(self.decoder.target, request.document, self._limit(request),
                                            lambda messages: self._cycles(request, messages))
        summary.on_stage = on_stage
        result = self._follow(request, summary, on_cycle, on_stage)
        result.text, result.part_summaries = summary.text, summary.part_summaries
        if summary.stopped_at:
            result.finish = Finish.STOPPED
            result.note = f"Stopped during {summary.stopped_at.lower()}; the part summaries so far are kept."
        return result

    # -- serving the API --

    def serve(self, host: str, port: int, api_key: str | None, mode: str) -> None:
        """Serve the loaded pair over HTTP; API clients' cycles are reported like the window's own."""
        from pathlib import Path

        from .server.api import Serving
        from .server.service import ServedModel

        self.stop_serving()
        if self.decoder is None:
            self.report("serve_failed", "Load a model before serving it.")
            return
        served = ServedModel(self.decoder, Path(self.target_path).stem, mode=mode, turn=self.turn)
        stats = {}

        def on_request(kind, payload) -> None:
            if kind == "started":
                stats["prompt_total"] = payload
            self.report("served_request", kind, payload.usage if kind == "finished" else payload)

        def on_cycle(cycle) -> None:
            snap = snapshot_of(self.decoder.stats, cycle, self.plain.tokens_per_s, stats.get("prompt_total", 0))
            self.report("served_cycle", CycleEvent(cycle, snap, "API request"))

        served.on_request, served.on_cycle = on_request, on_cycle
        serving = Serving(served, host, port, api_key)
        try:
            serving.start()
        except SpeculumError as exc:
            self.report("serve_failed", str(exc))
            return
        self.serving = serving
        self.report("serving", serving.url, served.model_id)

    def stop_serving(self) -> None:
        if self.serving is not None:
            self.serving.stop()
            self.serving = None
            self.report("serving", "", "")

    def _limit(self, request: GenerationRequest) -> int:
        """Tokens the answer may take: the user's limit, else until it ends or fills the context
        (a summary's parts: room kept for the document beside each)."""
        if request.max_tokens > 0:
            return request.max_tokens
        return summarise.PART_ANSWER_TOKENS if request.document is not None else self.decoder.target.n_ctx

    def _cycles(self, request: GenerationRequest, messages: list[dict]):
        target = self.decoder.target
        # Continuing an answer: its tokens follow the prompt as written, so the KV cache holds them all.
        prompt = target.tokenize(target.apply_chat_template(messages)) + list(request.continues)
        self._prompt_total = len(prompt)
        sampling = SamplingParams(temperature=request.temperature, top_p=request.top_p)
        return self.decoder.generate(prompt, max_tokens=self._limit(request), sampling=sampling,
                                     policy=request.mode, k=request.k,
                                     stop=self.stop, want_probs=True, on_prompt=self._prompt_progress)

    def _prompt_progress(self, read: int, total: int) -> None:
        """Prompt tokens read so far: the window shows them while a long prompt is read."""
        self.report("prompt_progress", read, total)

    def calibrate_while_idle(self, interrupted) -> None:
        """Measure this machine's costs for auto mode between requests, one pass at a time,
        giving way as soon as ``interrupted()`` (a request is waiting). The first answer
        then starts on measured costs without ever waiting for them. Not while serving the API:
        its clients would wait for the turn (the policy learns from their passes anyway)."""
        if self.decoder is None or self.serving is not None:
            return
        with self.turn:
            if not self.decoder.policy_for(Mode.AUTO).needs_calibration:
                return
            self.report("measuring", True)  # the window says so, quietly
            try:
                self.decoder.calibrate(interrupted)
            finally:
                self.report("measuring", False)

    def tune_while_idle(self, interrupted) -> None:
        """Once per machine (again for a much larger target): time the tiled matmul both ways in
        child processes, for the next engine start (engine/tuning.py), where the target runs on
        the CPU and the user did not choose the setting; stopped as soon as ``interrupted()``."""
        from .engine import cpu_settings, tuning

        target = self.decoder.target if self.decoder is not None else None
        if (target is None or target.facts.backend != "CPU" or self.serving is not None  # API clients come first
                or cpu_settings.apply().get("tiled_source") == cpu_settings.FROM_USER):
            return
        tuning.measure_and_remember(target.path, target.n_threads, interrupted)

    def _follow(self, request: GenerationRequest, steps, on_cycle, on_stage) -> GenerationResult:
        """Report each (stage, cycle) as it comes; the result of the whole run. One Stats for the
        whole answer, all its parts' generations in one (the decoder's restart with each)."""
        text, cycles, last, snap = [], [], None, StatsSnapshot()
        plain = self.plain.basis()
        answer, part, prompt_total = Stats(), None, 0
        for stage, cycle in steps:
            if on_cycle is not None:
                on_cycle(cycle)
            on_stage(stage)
            if self.decoder.stats is not part:  # a generation begins: its prompt counts join the answer's
                part = self.decoder.stats
                answer.merge(Stats(prompt_tokens=part.prompt_tokens, prompt_cached=part.prompt_cached))
                prompt_total += self._prompt_total
            answer.add(cycle)
            self.plain.observe(cycle)
            plain.observe(cycle)
            snap = snapshot_of(answer, cycle, plain, prompt_total)
            self.report("cycle", CycleEvent(cycle, snap, stage))
            text.append(cycle.text)
            cycles.append(cycle)
            last = cycle
        return GenerationResult(request.conversation_id, "".join(text), cycles, snap,
                                last.finish if last else None, last.message if last else "", request.mode)
