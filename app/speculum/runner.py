"""What the engine process does with the window's requests, without Qt.

``EngineRunner`` owns the loaded models and runs one request at a time: a chat answer, or a
document summary (in parts when the document is longer than the context). It reports
``protocol`` events through a plain callback, so the same code runs in the engine process
and, for tests, in-process.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from . import summarise
from .engine.chat import chat_tokens
from .engine.loading import load_decoder
from .engine.sampling import SamplingParams
from .engine.stats import Stats
from .engine.vocabulary import Device, Finish, Mode, Role
from .errors import SpeculumError
from .protocol import (CheckPlain, CycleEvent, Event, Failed, Finished, GenerationRequest, GenerationResult, Loaded,
                       LoadFailed, LoadProgress, LoadRequest, Measuring, PartPrompt, PlainBasis, PlainCheckFailed,
                       PlainChecked, PlainCheckProgress, PlainRateMeasured, PromptProgress, ServeFailed, ServingAt,
                       StageChanged, StatsSnapshot, is_plain_step, prompt_progress, snapshot_of)

CHECK_PROGRESS_S = 0.1  # a check's progress goes to the window at most this often


class PlainRate:
    """Plain decoding speed of the loaded target, measured from plain steps on this machine."""

    def __init__(self, tokens_per_s: float | None = None):
        self.tokens_per_s = tokens_per_s
        self.measured_at: float | None = None  # time.monotonic() of the last plain step here; None: given

    def observe(self, cycle) -> None:
        if is_plain_step(cycle):
            rate = 1.0 / cycle.seconds
            # A running mean that forgets slowly: one slow step must not swing it.
            self.tokens_per_s = rate if self.tokens_per_s is None else 0.9 * self.tokens_per_s + 0.1 * rate
            self.measured_at = time.monotonic()

    def basis(self) -> PlainBasis:
        """The yardstick for an answer beginning now."""
        age = time.monotonic() - self.measured_at if self.measured_at is not None else None
        return PlainBasis(self.tokens_per_s, age)


# Where the runner's events go: the engine process sends them down its pipe.
Report = Callable[[Event], None]


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
        self.serving = None  # server.serving.Serving while the window serves the API
        self.measure_after = float("-inf")  # time.monotonic() before which idle measuring waits

    def postpone_measuring(self, seconds: float | None) -> None:
        """Measuring this machine waits ``seconds`` from now (None: for good); a longer wait
        already asked for stands."""
        until = float("inf") if seconds is None else time.monotonic() + max(0.0, seconds)
        self.measure_after = max(self.measure_after, until)

    def measuring_waits(self) -> float:
        """Seconds before idle measuring may run (0: now; inf: not while this engine runs)."""
        return max(0.0, self.measure_after - time.monotonic())

    # -- loading --

    def load(self, request: LoadRequest) -> bool:
        """Load ``request``'s pair with its options as they are (the engine profile already applied)."""
        self.close_models()

        shown = {"stage": "", "fraction": -1.0}

        def progress(stage: Role, fraction: float) -> bool:
            # llama.cpp calls this per tensor (hundreds of times): the window needs a step of 1%.
            if stage != shown["stage"] or fraction - shown["fraction"] >= 0.01 or fraction >= 1.0:
                shown.update(stage=stage, fraction=fraction)
                self.report(LoadProgress(stage, fraction))
            return not self.cancel_load.is_set()

        try:
            self.decoder = load_decoder(request.target, request.draft, request.options, progress)
        except SpeculumError as exc:
            self.report(LoadFailed("Loading was cancelled." if self.cancel_load.is_set() else str(exc)))
            return False
        if self.cancel_load.is_set():  # Cancel pressed as the last tensors were read: it still cancels
            self.close_models()
            self.report(LoadFailed("Loading was cancelled."))
            return False
        self.target_path = request.target
        self.plain = PlainRate()
        d = self.decoder
        self.report(Loaded(d.target.facts, d.draft.facts if d.draft is not None else None))
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
        """Run ``request``, reporting each cycle, then ``Finished`` or ``Failed``.

        ``on_cycle`` sees each Cycle first (the engine process's fault injection for tests).
        """
        if self.decoder is None:
            self.report(Failed("No model is loaded. Pick a target model and press Load."))
            return
        try:
            with self.turn:
                result = self._answer(request, on_cycle)
        except SpeculumError as exc:
            self.report(Failed(str(exc)))
            return
        if self.plain.tokens_per_s:
            self.report(PlainRateMeasured(self.target_path, self.plain.tokens_per_s))
        self.report(Finished(result))

    def _answer(self, request: GenerationRequest, on_cycle) -> GenerationResult:
        shown = [""]

        def on_stage(stage: str) -> None:  # as a stage begins: its prompt is read under its name
            if stage != shown[0]:
                shown[0] = stage
                self.report(StageChanged("Combining the part summaries" if stage == summarise.COMBINING else stage))

        if request.document is None:
            generation = self._generation(request, request.messages)
            steps = (("", cycle, generation) for cycle in generation)
            return self._follow(request, steps, on_cycle, on_stage)
        summary = summarise.DocumentSummary(self.decoder.target, request.document, self._limit(request),
                                            lambda messages: self._generation(request, messages))
        summary.on_stage = on_stage
        result = self._follow(request, summary, on_cycle, on_stage)
        result.text, result.part_summaries = summary.text, summary.part_summaries
        if summary.stopped_at:
            result.finish = Finish.STOPPED
            result.note = f"Stopped during {summary.stopped_at.lower()}; the part summaries so far are kept."
        return result

    def check_plain(self, command: CheckPlain) -> None:
        """An answer against plain decoding of its prompt (engine/plaincheck.py): progress, then
        ``PlainChecked`` or ``PlainCheckFailed``; ``stop`` cancels it between decodes."""
        from .engine.plaincheck import check_plain

        if self.decoder is None:
            self.report(PlainCheckFailed("No model is loaded: load the model that wrote the answer."))
            return
        told = [float("-inf")]

        def progress(checked: int, total: int) -> None:
            now = time.monotonic()
            if now - told[0] >= CHECK_PROGRESS_S or checked >= total:
                told[0] = now
                self.report(PlainCheckProgress(checked, total))

        try:
            with self.turn:
                prompt = chat_tokens(self.decoder.target, command.messages)
                result = check_plain(self.decoder, prompt, command.answer, progress, self.stop.is_set)
        except SpeculumError as exc:
            self.report(PlainCheckFailed(str(exc)))
            return
        self.report(PlainChecked(command.conversation_id, command.index, result))

    # -- serving the API --

    def serve(self, host: str, port: int, api_key: str | None, mode: Mode) -> None:
        """Serve the loaded pair over HTTP; API clients' cycles are reported like the window's own."""
        from pathlib import Path

        from .server.serving import ServeOptions, SharedEngine, serve

        self.stop_serving()
        if self.decoder is None:
            self.report(ServeFailed("Load a model before serving it."))
            return
        options = ServeOptions(Path(self.target_path).stem, mode=Mode(mode), host=host, port=port, api_key=api_key)
        # (the plain rate is read when asked: a load or the window's SetPlainRate replaces self.plain)
        serving = serve(options, self.decoder, SharedEngine(self.turn, self.report, lambda: self.plain.basis()))
        try:
            serving.start()
        except SpeculumError as exc:
            self.report(ServeFailed(str(exc)))
            return
        self.serving = serving
        self.report(ServingAt(serving.url, options.model_id))

    def stop_serving(self) -> None:
        if self.serving is not None:
            self.serving.stop()
            self.serving = None
            self.report(ServingAt("", ""))

    def _limit(self, request: GenerationRequest) -> int:
        """Tokens the answer may take: the user's limit, else until it ends or fills the context
        (a summary's parts: room kept for the document beside each)."""
        if request.max_tokens > 0:
            return request.max_tokens
        return summarise.PART_ANSWER_TOKENS if request.document is not None else self.decoder.target.n_ctx

    def _generation(self, request: GenerationRequest, messages: list[dict]):
        target = self.decoder.target
        # Continuing an answer: its tokens follow the prompt as written, so the KV cache holds them all.
        prompt = chat_tokens(target, messages) + list(request.continues)  # the user's text stays text
        sampling = SamplingParams(temperature=request.temperature, top_p=request.top_p)
        return self.decoder.generate(prompt, max_tokens=self._limit(request), sampling=sampling,
                                     policy=request.mode, k=request.k,
                                     stop=self.stop, want_probs=True, on_prompt=self._prompt_progress,
                                     origin=request.conversation_id)  # the n-gram memory's, forgotten with it

    def _prompt_progress(self, read: int, total: int) -> None:
        """Prompt tokens read so far: the window shows them while a long prompt is read, of the
        whole prompt (as its stats count it)."""
        self.report(PromptProgress(*prompt_progress(read, total)))

    def calibrate_while_idle(self, interrupted) -> None:
        """Measure this machine's costs for auto mode between requests, one pass at a time,
        giving way as soon as ``interrupted()`` (a request is waiting, or the user types). The first
        answer then starts on measured costs without ever waiting for them. Not while the user
        postponed it (``postpone_measuring``), nor while serving the API: its clients would wait
        for the turn (the policy learns from their passes anyway)."""
        if self.decoder is None or self.serving is not None or self.measuring_waits():
            return
        with self.turn:
            if not self.decoder.policy_for(Mode.AUTO).needs_calibration:
                return
            self.report(Measuring(True))  # the window says so, quietly
            try:
                self.decoder.calibrate(interrupted)
            finally:
                self.report(Measuring(False))

    def tune_while_idle(self, interrupted) -> None:
        """Once per machine (again for a much larger target): time the tiled matmul both ways in
        child processes, for the next engine start (engine/llama/tuning.py), where the target runs on
        the CPU and the user did not choose the setting; stopped as soon as ``interrupted()``."""
        from .engine.llama import cpu_settings, tuning

        target = self.decoder.target if self.decoder is not None else None
        if (target is None or target.facts.device != Device.CPU or self.serving is not None  # API clients come first
                or self.measuring_waits() or cpu_settings.apply().get("tiled_source") == cpu_settings.FROM_USER):
            return
        tuning.measure_and_remember(target.path, target.n_threads, interrupted)

    def _follow(self, request: GenerationRequest, steps, on_cycle, on_stage) -> GenerationResult:
        """Report each (stage, cycle, generation) as it comes; the result of the whole run. One
        Stats for the whole answer, all its parts' generations in one (each with its own prompt)."""
        text, cycles, last, snap = [], [], None, StatsSnapshot()
        plain = self.plain.basis()
        answer, part, prompt_total, part_prompt = Stats(), None, 0, None
        for stage, cycle, generation in steps:
            if on_cycle is not None:
                on_cycle(cycle)
            on_stage(stage)
            if generation is not part:  # a generation begins: its prompt counts join the answer's
                part = generation
                counts = PartPrompt.of(stage, part.stats.prompt_tokens, part.prompt_total, part.stats.prompt_cached)
                answer.merge(Stats(prompt_tokens=counts.tokens, prompt_cached=counts.reused))
                prompt_total += counts.total
                part_prompt = counts if stage else None  # shown while a part of a many-part answer is written
            answer.add(cycle)
            self.plain.observe(cycle)
            plain.observe(cycle)
            snap = snapshot_of(answer, cycle, plain, prompt_total, part_prompt)
            self.report(CycleEvent(cycle, snap, stage))
            text.append(cycle.text)
            cycles.append(cycle)
            last = cycle
        return GenerationResult(request.conversation_id, "".join(text), cycles, snap,
                                last.finish if last else None, last.message if last else "", request.mode)
