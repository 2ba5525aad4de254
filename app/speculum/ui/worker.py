"""The window's side of the engine: requests out to the engine process, events back as signals.

Widgets never touch the engine, and the window never loads llama.cpp: ``Engine`` runs the
models in a child process (``engine_process.EngineProcess``), so a native crash there ends
that process, not the window. Its reports arrive on a reader thread and leave as Qt
signals; cycles go through ``CycleBatcher``, which hands them to the widgets at most once
per frame. Stop and load-cancel are shared events the engine polls between target passes.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from enum import Enum

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from ..engine.llama import profiles
from ..engine.backend import usable_cores
from ..engine.vocabulary import Device, Mode
from ..engine_process import EngineProcess, describe_exit
from ..protocol import (Asker, CheckPlain, CycleEvent, Decoded, Event, Failed, Finished, Generate, GenerationRequest,
                        Load, Loaded, LoadFailed, LoadProgress, LoadRequest, Measuring, PlainCheckFailed, PlainChecked,
                        PlainCheckProgress, PlainRateMeasured, PostponeMeasuring, ProfileChosen, PromptProgress, Ready,
                        ServeFailed, Serve, ServingAt, SetPlainRate, StageChanged, Started, StopServing, WorkerLost)
from .. import yielding

# The engine's idle measurement of this machine waits this long after the user's last keystroke
# (its passes take the cores the typing and the window's drawing want); a keystroke is told to
# the engine at most once per TYPED_EVERY_S.
TYPING_QUIET_S = 4.0
TYPED_EVERY_S = 1.0

# Widgets are updated at most this often: 20 frames a second reads as live, and every
# redraw takes CPU from llama.cpp's threads on a small machine.
FRAME_MS = 50


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
    MAX_FRAME_MS = 500  # twice a second still reads as live; one frame's work stays far under the 50 ms block limit

    def __init__(self, parent=None, interval_ms: int = FRAME_MS, cpu_budget: float = 0.25):
        super().__init__(parent)
        self._lock = threading.Lock()
        self._pending: list[CycleEvent] = []
        self._woken = False
        self.frame_ms = interval_ms  # the shortest frame
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
        self._timer.setInterval(int(min(self.MAX_FRAME_MS, max(self.frame_ms, wanted))))

    def begin(self) -> None:
        """A generation starts: what the UI did in between is not a frame's cost."""
        self._last_cpu = None


class EngineSignals(QObject):
    """What the engine reports, as signals; emitted on the reader thread, delivered queued."""
    ready = Signal(object, object)  # the engine process's GPU backend name (or None), its thread wait setting
    profileChosen = Signal(str, str)  # the engine profile a load uses, and why (empty: standard)
    loadProgress = Signal(str, float)  # stage ("target"/"draft"), fraction
    loaded = Signal(object, object)  # target ModelFacts, draft ModelFacts or None
    loadFailed = Signal(str)
    cycleReady = Signal(object)  # CycleEvent
    stageChanged = Signal(str)
    promptProgress = Signal(int, int)  # prompt tokens read, of how many
    finished = Signal(object)  # GenerationResult
    failed = Signal(str)
    plainRateMeasured = Signal(str, float)  # target path, tokens/s
    died = Signal(object)  # EngineDeath
    serving = Signal(str, str)  # base URL and model id of the API being served; empty when it stopped
    serveFailed = Signal(str)
    servedRequest = Signal(object)  # an API request's Started, Finished or Failed
    servedCycle = Signal(object)  # CycleEvent of an API client's request
    measuring = Signal(bool)  # the engine is (no longer) measuring this machine's costs for auto mode
    plainCheckProgress = Signal(int, int)  # answer tokens checked against plain decoding, of how many
    plainChecked = Signal(object)  # PlainChecked
    plainCheckFailed = Signal(str)


class Activity(Enum):
    """What the engine process is doing, as the window asked it; ``words`` only for display."""
    IDLE = "idle"
    LOADING = "loading the models"
    GENERATING = "generating an answer"
    SUMMARISING = "summarising a document"
    CHECKING = "checking an answer against plain decoding"

    @property
    def words(self) -> str:
        return self.value


class EngineDeath:
    """The engine process ended unasked: how, and what it was doing."""

    def __init__(self, how: str, activity: Activity, during_load: bool, profile: profiles.Profile, why: str = ""):
        self.how = how  # "signal SIGSEGV (Segmentation fault)"
        self.why = why  # what the engine said before it ended (a lost RPC worker), if anything
        self.activity = activity
        self.during_load = during_load  # in a load, or the first decode after one
        self.profile = profile  # the profile it was running

    def message(self) -> str:
        cause = self.why or f"The engine stopped unexpectedly while {self.activity.words}: {self.how}."
        return f"{cause} The window and your conversation are safe; the answer so far is kept."


class Engine(QObject):
    """The UI thread's handle on the engine process."""

    def __init__(self, parent=None, exact: bool | None = None):
        super().__init__(parent)
        self.exact = exact  # the row-invariance switch an engine process starts with (None: the environment's)
        self.worker = EngineSignals()
        self.batcher = CycleBatcher(self)
        self.worker.cycleReady.connect(self.batcher.put, Qt.DirectConnection)
        self.served_batcher = CycleBatcher(self)  # API clients' cycles, shown like the window's own
        self.worker.servedCycle.connect(self.served_batcher.put, Qt.DirectConnection)
        self.worker.loaded.connect(self._on_loaded)
        self.gpu: str | None = None
        self.profile, self.profile_why = profiles.STANDARD, ""
        self._process: EngineProcess | None = None
        self._holds_models = False  # the current process has (or is loading) models
        self._activity = Activity.IDLE  # what the process is doing, for the crash message
        self._fresh = False  # loaded, and no cycle decoded since
        self._last_words = ""
        self.started = False  # the engine process has imported llama.cpp and said so
        self.cores_full = False  # the loaded target decodes on the CPU with a thread on every core
        self._decoding: set[Asker] = set()  # whose generations the engine is decoding now
        self.giving_way = False  # the window's threads wait for a core (see yielding)
        self._lock = threading.Lock()
        self.typing_quiet_s = TYPING_QUIET_S
        self._typed_told = float("-inf")  # time.monotonic() a keystroke was last told to the engine
        self._measure_after = float("-inf")  # time.monotonic() until which no engine measures (typing, "Later")
        self._route = self._routes()
        self._spawn()  # importing llama.cpp takes a moment: do it before the user presses Load

    # -- the process --

    def _spawn(self) -> None:
        self.started = False
        self._process = EngineProcess(self._on_event, self._on_exit, self.exact)
        self._holds_models = False

    def _routes(self) -> dict[type[Event], object]:
        """Each event's handler, by type (on the reader thread)."""
        w = self.worker
        return {
            Ready: self._on_ready,
            ProfileChosen: self._on_profile,
            LoadProgress: lambda e: w.loadProgress.emit(e.stage, e.fraction),
            Loaded: self._on_models_loaded,
            LoadFailed: self._on_load_failed,
            StageChanged: lambda e: w.stageChanged.emit(e.stage),
            PromptProgress: lambda e: w.promptProgress.emit(e.read, e.total),
            Started: self._on_started,
            CycleEvent: self._on_cycle,
            Decoded: lambda e: self._decoded(e.asker, False),
            Finished: self._on_finished,
            Failed: self._on_failed,
            PlainRateMeasured: lambda e: w.plainRateMeasured.emit(e.target, e.tokens_per_s),
            ServingAt: lambda e: w.serving.emit(e.url, e.model_id),
            ServeFailed: lambda e: w.serveFailed.emit(e.message),
            WorkerLost: self._on_worker_lost,
            Measuring: lambda e: w.measuring.emit(e.active),
            PlainCheckProgress: lambda e: w.plainCheckProgress.emit(e.checked, e.total),
            PlainChecked: lambda e: self._check_ended(w.plainChecked, e),
            PlainCheckFailed: lambda e: self._check_ended(w.plainCheckFailed, e.message),
        }

    def _on_event(self, event: Event) -> None:
        """Reader thread: one report from the engine process."""
        self._route[type(event)](event)

    def _on_ready(self, event: Ready) -> None:
        self.started = True
        self.worker.ready.emit(event.gpu, event.cpu_settings)

    def _on_profile(self, event: ProfileChosen) -> None:
        self.profile, self.profile_why = profiles.by_name(event.name), event.why
        self.worker.profileChosen.emit(event.name, event.why)

    def _on_models_loaded(self, event: Loaded) -> None:
        self._activity = Activity.IDLE
        self._fresh = True
        self.worker.loaded.emit(event.target, event.draft)

    def _on_load_failed(self, event: LoadFailed) -> None:
        self._activity = Activity.IDLE
        self.worker.loadFailed.emit(event.message)

    def _on_started(self, event: Started) -> None:
        self._decoded(event.asker, True)
        self._told_the_serve_panel(event)

    def _on_cycle(self, event: CycleEvent) -> None:
        if event.asker == Asker.WINDOW:
            self._fresh = False
            self.worker.cycleReady.emit(event)
        else:
            self.worker.servedCycle.emit(event)

    def _on_finished(self, event: Finished) -> None:
        if not self._told_the_serve_panel(event):
            self._window_answer_ended()
            self.worker.finished.emit(event.result)

    def _on_failed(self, event: Failed) -> None:
        if not self._told_the_serve_panel(event):
            self._window_answer_ended()
            self.worker.failed.emit(event.message)

    def _told_the_serve_panel(self, event: Started | Finished | Failed) -> bool:
        """An API client's request starting or ending goes to the Serve panel; True if it was one."""
        if event.asker == Asker.API:
            self.worker.servedRequest.emit(event)
        return event.asker == Asker.API

    def _window_answer_ended(self) -> None:
        self._activity = Activity.IDLE
        self._decoded(Asker.WINDOW, False)

    def _check_ended(self, signal, what) -> None:
        self._window_answer_ended()
        signal.emit(what)

    def _on_worker_lost(self, event: WorkerLost) -> None:
        self._last_words = event.words  # the engine's last words before it ends

    def _on_exit(self, code: int | None) -> None:
        """Reader thread: the engine process ended without being asked to."""
        activity = self._activity
        during_load = activity is Activity.LOADING or (self._fresh and activity is not Activity.IDLE)
        words, self._activity, self._last_words = self._last_words, Activity.IDLE, ""
        self._decoded(None, False)
        if words:  # a lost RPC worker: no safer profile would help
            during_load = False
        self.worker.died.emit(EngineDeath(describe_exit(code), activity, during_load, self.profile, words))

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_alive(self) -> bool:
        return self._process is not None and self._process.process.is_alive()

    # -- requests --

    @Slot(object, object)
    def _on_loaded(self, target, _draft) -> None:
        self.cores_full = fills_every_core(target)
        budget = ui_cpu_budget(target)
        for batcher in (self.batcher, self.served_batcher):
            batcher.cpu_budget = budget
            # Where every frame is decoding lost, frames are as far apart as still reads as live:
            # bench_gui (SmolLM2, 36 pairs) read the drawing's cost to verify passes +7.9% at the
            # budget's own pace, +6.8% with 500 ms frames, +4.6% with the Markdown answer at 1 s too.
            batcher.frame_ms = CycleBatcher.MAX_FRAME_MS if self.cores_full else FRAME_MS

    def _decoded(self, what: Asker | None, started: bool) -> None:
        """Any thread: the engine started or ended decoding for ``what`` (None: everything, the
        process is gone). While llama.cpp fills every core, the window's threads
        wait for one (see yielding)."""
        with self._lock:
            if what is None:
                self._decoding.clear()
            elif started:
                self._decoding.add(what)
            else:
                self._decoding.discard(what)
            wanted = self.cores_full and bool(self._decoding)
            if wanted != self.giving_way:
                self.giving_way = yielding.give_way(wanted) if wanted else not yielding.give_way(False)

    def load(self, request: LoadRequest, profile: profiles.Profile | None = None, why: str = "") -> None:
        """Load a pair in a fresh engine process (the old one and its memory go back to the system).

        ``profile``: one chosen after a crash (``why`` says which), remembered for this machine
        once it loads and decodes; None: the profile this machine remembers.
        """
        if (self._process is None or self._holds_models or not self._process.process.is_alive()
                or self._process.exact != self.exact):  # (ggml reads the switch once, as llama.cpp loads)
            self._end_process()
            self._spawn()
        self._holds_models = True
        self._activity = Activity.LOADING
        self._process.cancel_load.clear()
        if self._measure_after > time.monotonic():  # a fresh engine waits as the last one did
            later = self._measure_after - time.monotonic()
            self._process.send(PostponeMeasuring(None if later == float("inf") else later))
        self._process.send(Load(request, profile.name if profile else "", why))

    def cancel_load(self) -> None:
        if self._process is not None:
            self._process.cancel_load.set()

    def set_plain_rate(self, tokens_per_s: float | None) -> None:
        if self._process is not None:
            self._process.send(SetPlainRate(tokens_per_s))

    def postpone_measuring(self, seconds: float | None) -> None:
        """No measuring of this machine for ``seconds`` (None: until the window closes), in this
        engine process and in the next ones (a Load starts a fresh one)."""
        until = float("inf") if seconds is None else time.monotonic() + seconds
        self._measure_after = max(self._measure_after, until)
        if self._process is not None:
            self._process.send(PostponeMeasuring(seconds))

    def user_typed(self) -> None:
        """A keystroke in the input box: the engine measures nothing until the typing has paused."""
        now = time.monotonic()
        if now - self._typed_told >= TYPED_EVERY_S:
            self._typed_told = now
            self.postpone_measuring(self.typing_quiet_s)

    def generate(self, request: GenerationRequest) -> None:
        # Cleared here, before sending: a Stop pressed while this request waits must still count.
        self._process.stop.clear()
        self.batcher.begin()
        self._decoded(Asker.WINDOW, True)
        self._activity = Activity.SUMMARISING if request.document is not None else Activity.GENERATING
        if not self._process.send(Generate(request)):
            self._decoded(Asker.WINDOW, False)
            self.worker.failed.emit("The engine is not running. Press Reload.")

    def check_plain(self, command: CheckPlain) -> None:
        """Check an answer against plain decoding in the engine process; ``stop`` cancels it."""
        self._process.stop.clear()  # (as for an answer: a Stop pressed while it waits still counts)
        self._decoded(Asker.WINDOW, True)
        self._activity = Activity.CHECKING
        if not self._process.send(command):
            self._decoded(Asker.WINDOW, False)
            self.worker.plainCheckFailed.emit("The engine is not running. Press Reload.")

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop.set()

    def serve(self, port: int, mode: Mode | str, host: str = "127.0.0.1", api_key: str | None = None) -> None:
        """Serve the loaded models over the OpenAI API from the engine process."""
        if self._process is None or not self._process.send(Serve(host, port, api_key, Mode(mode))):
            self.worker.serveFailed.emit("The engine is not running. Load a model first.")

    def stop_serving(self) -> None:
        if self._process is not None:
            self._process.send(StopServing())

    def _end_process(self) -> None:
        if self._process is not None:
            self._process.end()
            self._process = None
        self._decoded(None, False)

    def shutdown(self) -> None:
        """The window closes: the engine stops, and its memory goes back with its process."""
        self._end_process()


def fills_every_core(target_facts, cores: int | None = None) -> bool:
    """Whether llama.cpp decodes the target on the CPU with a thread on every core: then the
    window's time comes straight out of decoding (the other threads wait for the preempted one)."""
    if cores is None:
        cores = usable_cores()
    return target_facts.device == Device.CPU and target_facts.n_threads >= cores


def ui_cpu_budget(target_facts, cores: int | None = None) -> float:
    """The share of one core the UI thread may spend on live updates while generating: 2%
    where llama.cpp fills every core; with a GPU or a spare core the UI runs beside it for free."""
    return 0.02 if fills_every_core(target_facts, cores) else 0.25
