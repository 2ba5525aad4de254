"""The engine thread: owns the models, runs generations, and reports Cycle events.

Widgets never touch the engine. The window sends requests as queued signals to an
``EngineWorker`` living in its own QThread; the worker answers with signals. Stopping
a generation and cancelling a load go through ``threading.Event``s, which the UI thread
sets without waiting on llama.cpp. ``CycleBatcher`` then hands cycles to the widgets
at most once per frame.
"""

from __future__ import annotations

import statistics
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Qt, QThread, QTimer, Signal, Slot

from ..errors import SpeculumError
from .. import summarise

# Widgets are updated at most this often: 20 frames a second reads as live, and every
# redraw takes CPU from llama.cpp's threads on a small machine.
FRAME_MS = 50


@dataclass
class LoadRequest:
    target: str
    draft: str | None = None
    n_ctx: int = 4096
    target_gpu_layers: int | None = None  # None: all on the GPU when there is one
    draft_gpu_layers: int | None = None


@dataclass
class GenerationRequest:
    conversation_id: str
    messages: list[dict]  # the conversation so far, ending with the new user turn
    mode: str = "auto"
    k: int = 0  # 0: adaptive; otherwise forced modes draft exactly k
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    document: str | None = None  # set: summarise this document (in parts when long)


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
    speedup_source: str = ""  # "policy estimate" or "measured"
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


def snapshot_of(stats, cycle, plain_tokens_per_s: float | None, prompt_total: int = 0) -> StatsSnapshot:
    """Stats after ``cycle``; the speedup comes from the policy's estimate when it gives one."""
    policy = cycle.policy
    speedup, source = None, ""
    if policy is not None and policy.expected_speedup:
        speedup, source = float(policy.expected_speedup), "policy estimate"
    else:
        plain = (policy.plain_tokens_per_s if policy is not None else None) or plain_tokens_per_s
        if plain and stats.tokens_per_s:
            speedup, source = stats.tokens_per_s / plain, "measured"
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
        policy=policy.to_json() if policy is not None else {},
        prompt_tokens=stats.prompt_tokens,
        prompt_total=prompt_total,
        # The prompt's last token is decoded with the first cycle, so it is neither.
        prompt_reused=max(prompt_total - 1 - stats.prompt_tokens, 0) if prompt_total else 0,
    )


def replay_snapshots(cycles: list, plain_tokens_per_s: float | None = None,
                     prompt_tokens: int = 0, prompt_total: int = 0) -> list[StatsSnapshot]:
    """The stats as they stood after each stored cycle, for replay (the prompt's counts as stored)."""
    from ..engine.stats import Stats

    stats = Stats(prompt_tokens=prompt_tokens)
    out = []
    for cycle in cycles:
        stats.add(cycle)
        out.append(snapshot_of(stats, cycle, plain_tokens_per_s, prompt_total))
    return out


class PlainRate:
    """Plain decoding speed of the loaded target, measured from plain steps on this machine."""

    def __init__(self, tokens_per_s: float | None = None):
        self.tokens_per_s = tokens_per_s

    def observe(self, cycle) -> None:
        if cycle.source == "none" and len(cycle.emitted) == 1 and cycle.seconds > 0:
            rate = 1.0 / cycle.seconds
            # A running mean that forgets slowly: one slow step must not swing it.
            self.tokens_per_s = rate if self.tokens_per_s is None else 0.9 * self.tokens_per_s + 0.1 * rate


class EngineWorker(QObject):
    loadProgress = Signal(str, float)  # stage ("target"/"draft"), fraction
    loaded = Signal(object, object)  # target ModelFacts, draft ModelFacts or None
    loadFailed = Signal(str)
    cycleReady = Signal(object)  # CycleEvent
    stageChanged = Signal(str)
    finished = Signal(object)  # GenerationResult
    failed = Signal(str)
    plainRateMeasured = Signal(str, float)  # target path, tokens/s

    def __init__(self):
        super().__init__()
        self.decoder = None
        self.target_path = ""
        self.stop_event = threading.Event()
        self.cancel_load = threading.Event()
        self.plain = PlainRate()

    # -- loading --

    @Slot(object)
    def load(self, request: LoadRequest) -> None:
        from ..engine.loading import LoadOptions, load_decoder

        self.close_models()
        self.cancel_load.clear()

        def progress(stage: str, fraction: float) -> bool:
            self.loadProgress.emit(stage, fraction)
            return not self.cancel_load.is_set()

        try:
            options = LoadOptions(n_ctx=request.n_ctx, target_gpu_layers=request.target_gpu_layers,
                                  draft_gpu_layers=request.draft_gpu_layers)
            self.decoder = load_decoder(request.target, request.draft, options, progress)
        except SpeculumError as exc:
            self.loadFailed.emit("Loading was cancelled." if self.cancel_load.is_set() else str(exc))
            return
        except Exception as exc:  # anything else still reaches the window, not just the console
            traceback.print_exc()
            self.loadFailed.emit(f"Loading the models failed: {exc}")
            return
        self.target_path = request.target
        self.plain = PlainRate()
        d = self.decoder
        self.loaded.emit(d.target.facts, d.draft.facts if d.draft is not None else None)

    def set_plain_rate(self, tokens_per_s: float | None) -> None:
        self.plain = PlainRate(tokens_per_s)

    def close_models(self) -> None:
        if self.decoder is not None:
            self.decoder.target.close()
            if self.decoder.draft is not None:
                self.decoder.draft.close()
            self.decoder = None

    # -- generating --

    @Slot(object)
    def generate(self, request: GenerationRequest) -> None:
        # stop_event is cleared by the UI thread before sending: a Stop pressed while
        # this request waited in the queue must still count.
        if self.decoder is None:
            self.failed.emit("No model is loaded. Pick a target model and press Load.")
            return
        try:
            if request.document is not None:
                result = self._summarise(request)
            else:
                result = self._chat(request)
        except SpeculumError as exc:
            self.failed.emit(str(exc))
            return
        except Exception as exc:
            traceback.print_exc()
            self.failed.emit(f"The generation failed: {exc}")
            return
        if self.plain.tokens_per_s:
            self.plainRateMeasured.emit(self.target_path, self.plain.tokens_per_s)
        self.finished.emit(result)

    def _tokens(self, messages: list[dict]) -> list[int]:
        target = self.decoder.target
        return target.tokenize(target.apply_chat_template(messages))

    def _run(self, request: GenerationRequest, messages: list[dict], stage: str = "",
             max_tokens: int | None = None):
        """One generation; returns (text, cycles, last cycle, snapshot)."""
        from ..engine.sampling import SamplingParams

        prompt = self._tokens(messages)
        sampling = SamplingParams(temperature=request.temperature, top_p=request.top_p)
        text, cycles, last, snap = [], [], None, StatsSnapshot()
        for cycle in self.decoder.generate(prompt, max_tokens=max_tokens or request.max_tokens,
                                           sampling=sampling, policy=request.mode, k=request.k or None,
                                           stop=self.stop_event, want_probs=True):
            self.plain.observe(cycle)
            snap = snapshot_of(self.decoder.stats, cycle, self.plain.tokens_per_s, len(prompt))
            self.cycleReady.emit(CycleEvent(cycle, snap, stage))
            text.append(cycle.text)
            cycles.append(cycle)
            last = cycle
        return "".join(text), cycles, last, snap

    @staticmethod
    def _result(request: GenerationRequest, text: str, cycles: list, last, snap: StatsSnapshot,
                part_summaries: list[str] | None = None) -> GenerationResult:
        """The result of a generation that ran to its end (EOG, max tokens, stop, context full)."""
        return GenerationResult(request.conversation_id, text, cycles, snap, last.finish if last else None,
                                last.message if last else "", request.mode, part_summaries or [])

    def _chat(self, request: GenerationRequest) -> GenerationResult:
        text, cycles, last, snap = self._run(request, request.messages)
        return self._result(request, text, cycles, last, snap)

    def _summarise(self, request: GenerationRequest) -> GenerationResult:
        from ..engine.prompts import build_messages, document_message

        target = self.decoder.target
        count = lambda s: len(target.tokenize(s))  # noqa: E731
        whole = build_messages(None, document=request.document)  # the default summary request
        # Room for the document: the context, less the answer and the prompt around the document.
        overhead = len(self._tokens(build_messages(summarise.part_request(99, 99), document="")))
        budget = target.n_ctx - request.max_tokens - overhead - 16
        if budget < 64:
            raise SpeculumError(f"The context of {target.n_ctx:,} tokens leaves no room for a document "
                                f"next to an answer of {request.max_tokens} tokens. Raise the context "
                                "size or lower max tokens.")
        if len(self._tokens(whole)) + request.max_tokens <= target.n_ctx:
            return self._result(request, *self._run(request, whole))

        # Too long: summarise in parts, then combine (in rounds, if even the summaries are long).
        texts = summarise.split_by_tokens(request.document, count, budget)
        all_cycles, summaries_of_first_round = [], []
        round_no = 0
        while True:
            round_no += 1
            summaries = []
            for i, part in enumerate(texts, 1):
                stage = f"Part {i} of {len(texts)}" + (f" (round {round_no})" if round_no > 1 else "")
                self.stageChanged.emit(stage)
                messages = build_messages(document_message(part, summarise.part_request(i, len(texts))))
                text, cycles, last, snap = self._run(request, messages, stage)
                all_cycles.extend(cycles)
                summaries.append(text)
                if last is not None and last.finish == "stopped":
                    return GenerationResult(request.conversation_id, summarise.joined_summaries(summaries),
                                            all_cycles, snap, "stopped",
                                            f"Stopped during {stage.lower()}; the part summaries so far are kept.",
                                            request.mode, summaries)
            if round_no == 1:
                summaries_of_first_round = summaries
            joined = summarise.joined_summaries(summaries)
            combine = build_messages(summarise.combine_request(len(summaries)), document=joined)
            if len(self._tokens(combine)) + request.max_tokens <= target.n_ctx:
                break
            texts = summarise.split_by_tokens(joined, count, budget)
        self.stageChanged.emit("Combining the part summaries")
        text, cycles, last, snap = self._run(request, combine, "Combining")
        return self._result(request, text, all_cycles + cycles, last, snap, summaries_of_first_round)


class CycleBatcher(QObject):
    """Hands cycle events from the worker to the widgets, at most once per frame.

    ``put`` runs in the worker thread and only appends under a lock; the UI thread is woken
    once per frame, not once per cycle. The frame stretches to keep the UI thread's CPU time
    (everything it did since the last frame: this batch's updates and the repaints they
    caused) within ``cpu_budget`` of one core: when llama.cpp's threads fill every core,
    each millisecond the UI takes is a millisecond of decoding lost.
    """

    batchReady = Signal(list)
    _wake = Signal()
    MAX_FRAME_MS = 250  # still reads as live; one frame's work stays far under the 50 ms block limit

    def __init__(self, parent=None, interval_ms: int = FRAME_MS, cpu_budget: float = 0.25):
        super().__init__(parent)
        self._lock = threading.Lock()
        self._pending: list[CycleEvent] = []
        self._woken = False
        self._frame_ms = interval_ms
        self.cpu_budget = cpu_budget
        self._costs_ms: deque[float] = deque(maxlen=9)  # UI CPU of the last frames
        self._last_cpu: float | None = None
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self.flush)
        self._wake.connect(self._arm, Qt.QueuedConnection)

    def put(self, event: CycleEvent) -> None:
        """Any thread: queue an event for the next frame."""
        with self._lock:
            self._pending.append(event)
            if self._woken:
                return
            self._woken = True
        self._wake.emit()

    @Slot()
    def _arm(self) -> None:
        if not self._timer.isActive():
            self._timer.start()

    @property
    def interval_ms(self) -> int:
        return self._timer.interval()

    @Slot()
    def flush(self) -> None:
        """Hand over everything pending now (also when a generation ends)."""
        self._timer.stop()
        with self._lock:
            batch, self._pending = self._pending, []
            self._woken = False
        if not batch:
            return
        now = time.thread_time()
        if self._last_cpu is not None:
            self._costs_ms.append((now - self._last_cpu) * 1000)
        self.batchReady.emit(batch)
        self._last_cpu = now
        # The median: one frame that re-rendered a long answer must not slow the next ten.
        wanted = statistics.median(self._costs_ms) / max(self.cpu_budget, 1e-3) if self._costs_ms else 0
        self._timer.setInterval(int(min(self.MAX_FRAME_MS, max(self._frame_ms, wanted))))

    def begin(self) -> None:
        """A generation starts: what the UI did in between is not a frame's cost."""
        self._last_cpu = None


class Engine(QObject):
    """The UI thread's handle on the worker thread: requests out, events in."""

    loadRequested = Signal(object)
    generateRequested = Signal(object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("speculum-engine")
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread)
        self.loadRequested.connect(self.worker.load)
        self.generateRequested.connect(self.worker.generate)
        self.batcher = CycleBatcher(self)
        self.worker.cycleReady.connect(self.batcher.put, Qt.DirectConnection)
        self.worker.loaded.connect(self._on_loaded)
        self.thread.start()

    @Slot(object, object)
    def _on_loaded(self, target, _draft) -> None:
        self.batcher.cpu_budget = ui_cpu_budget(target)

    def load(self, request: LoadRequest) -> None:
        self.loadRequested.emit(request)

    def cancel_load(self) -> None:
        self.worker.cancel_load.set()

    def generate(self, request: GenerationRequest) -> None:
        self.worker.stop_event.clear()
        self.batcher.begin()
        self.generateRequested.emit(request)

    def stop(self) -> None:
        self.worker.stop_event.set()

    def shutdown(self) -> None:
        self.worker.stop_event.set()
        self.worker.cancel_load.set()
        self.thread.quit()
        deadline = time.monotonic() + 30
        while not self.thread.wait(100) and time.monotonic() < deadline:
            self.worker.stop_event.set()
        self.worker.close_models()


def ui_cpu_budget(target_facts, cores: int | None = None) -> float:
    """The share of one core the UI thread may spend on live updates while generating.

    When llama.cpp decodes on the CPU with a thread on every core, the UI's time comes
    straight out of decoding (the other threads wait for the preempted one), so the window
    keeps to 2%; with a GPU or a spare core the UI runs beside it for free.
    """
    if cores is None:
        from ..engine.llama import usable_cores

        cores = usable_cores()
    if target_facts.backend == "CPU" and target_facts.n_threads >= cores:
        return 0.02
    return 0.25


def gpu_backend() -> str | None:
    """The GPU backend of this llama.cpp build, or None: asked once, before any model loads."""
    from ..engine.llama import gpu_backend as backend

    return backend()
