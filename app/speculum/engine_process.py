"""The engine in a child process, so that a native crash ends the engine, not the window.

llama.cpp can abort the whole process: an AMX kernel, a Metal or CUDA out-of-memory abort,
a GPU driver fault, a ``GGML_ASSERT`` on an unusual model. The window therefore never
loads it: ``EngineProcess`` spawns a fresh Python running ``_engine_main``, sends it
commands down a pipe and reads ``EngineRunner`` reports back on a thread of its own. Stop
and load-cancel are shared events the child polls between target passes. When the pipe
breaks, ``on_exit`` gets the exit code, and ``describe_exit`` names the signal.

The child is spawned (a fresh interpreter, as on Windows and macOS everywhere), so a program
that opens the window must guard its top level with ``if __name__ == "__main__":``, as the
``speculum`` command and the scripts do; the bundle's entry calls ``freeze_support()``.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from dataclasses import replace
from typing import Callable

from .engine.llama import profiles
from .engine.vocabulary import Word
from .protocol import (Batch, CheckPlain, Command, CycleEvent, Event, Generate, Load, LoadProgress, PostponeMeasuring,
                       ProfileChosen, Quit, Ready, Serve, SetPlainRate, StopServing, WorkerLost)

# Test-only fault injection, read by the engine process alone: a CrashPoint's value makes it
# crash there with a real segmentation fault.
CRASH_SWITCH = "SPECULUM_TEST_CRASH"
MID_GENERATION_CYCLE = 4  # the cycle at which "mid_generation" crashes (earlier ones reach the window)


class CrashPoint(Word):
    """Where CRASH_SWITCH makes the engine process crash."""

    NONE = ""
    LOAD = "load"  # at the first tensor read
    FIRST_DECODE = "first_decode"  # at the first cycle after a load
    MID_GENERATION = "mid_generation"  # at cycle MID_GENERATION_CYCLE

    @classmethod
    def from_environment(cls) -> "CrashPoint":
        asked = os.environ.get(CRASH_SWITCH, "")
        return next((point for point in cls if point.value == asked), cls.NONE)

# Cycles that come faster than this go down the pipe together: each message wakes the
# window's reader thread, and on a machine whose cores all decode, every wake-up is decoding
# lost. A slower cycle, the last one and any other report go at once. 100 ms: the window
# draws at most 20 frames a second, and on a CPU-bound machine every 500 ms (ui/worker.py),
# so a cycle held this long is not seen later; at 40 ms the reader thread took 1.0-1.4% of
# a core with SmolLM2 (bench_gui's per-thread shares).
CYCLE_BATCH_S = 0.1


class Outbox:
    """Reports to the window: a cycle that follows the last message within ``CYCLE_BATCH_S``
    waits for the next report and travels with it as one ``Batch`` message; an answer's first
    and last cycles go at once."""

    def __init__(self, send: Callable[[Event], None], clock: Callable[[], float] = time.monotonic):
        self._send = send
        self._clock = clock
        self._lock = threading.Lock()  # the window's generation and API clients' threads both report
        self._held: list[Event] = []
        self._sent_at = float("-inf")

    def report(self, event: Event) -> None:
        with self._lock:
            now = self._clock()
            cycle = event.cycle if isinstance(event, CycleEvent) else None
            # An answer's first cycle never waits: it is the first token on screen, and the sign
            # that decoding works (a crash after it is not taken for one in the first decode).
            if cycle is not None and cycle.index > 0 and cycle.finish is None and now - self._sent_at < CYCLE_BATCH_S:
                self._held.append(event)
                return
            self._send(Batch(self._held + [event]) if self._held else event)
            self._held.clear()
            self._sent_at = now

# Windows reports a crash as an NTSTATUS exit code, not a signal.
_WINDOWS_CRASHES = {
    0xC0000005: "access violation",
    0xC000001D: "illegal instruction",
    0xC0000409: "stack buffer overrun (abort)",
    0xC00000FD: "stack overflow",
    0xC0000017: "out of memory",
    0x40000015: "abort",
}


def describe_exit(code: int | None) -> str:
    """How the engine process ended, in words: 'signal SIGSEGV (Segmentation fault)'."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            sig = signal.Signals(-code)
        except ValueError:
            return f"signal {-code}"
        words = signal.strsignal(sig) if hasattr(signal, "strsignal") else ""  # platform: not everywhere
        return f"signal {sig.name}" + (f" ({words})" if words else "")
    if (code & 0xFFFFFFFF) in _WINDOWS_CRASHES:
        return f"{_WINDOWS_CRASHES[code & 0xFFFFFFFF]} (exit code 0x{code & 0xFFFFFFFF:08X})"
    return f"exit code {code}"


def _crash() -> None:
    """A real native crash, as llama.cpp's would be: a read of address 0."""
    import ctypes

    ctypes.string_at(0)


def _engine_main(conn, stop, cancel_load, exact: bool | None = None) -> None:
    """The engine process: run commands until told to quit or the window's end of the pipe closes.
    ``exact``: the row-invariance switch (the window's setting; None: the environment's or the default),
    set before llama.cpp loads (ggml reads it once)."""
    from . import yielding

    if exact is not None:
        from .engine.llama import cpu_settings

        cpu_settings.choose_exact(exact)
    yielding.give_way(False)  # decoding never waits for a core: whatever policy the window had
    _EngineLoop(conn, stop, cancel_load).run()


class _EngineLoop:
    """The engine process's side of the pipe: each command to its handler, by type."""

    def __init__(self, conn, stop, cancel_load):
        from .engine.llama import cpu_settings, native
        from .engine.rpc import client as rpc
        from .runner import EngineRunner

        self.conn, self.stop = conn, stop
        self.crash_at = CrashPoint.from_environment()
        self.outbox = Outbox(conn.send)
        self.report(Ready(native.gpu_backend(), cpu_settings.in_effect()))
        rpc.on_worker_lost(self.worker_lost)
        self.runner = EngineRunner(self.report, stop, cancel_load)
        self.fresh = False  # no cycle decoded since the last load
        self.to_remember = None  # (profile, why): a profile chosen after a crash, remembered once it decodes
        self.handlers: dict[type[Command], Callable] = {
            Load: self.load,
            Generate: lambda command: self.runner.generate(command.request, self.on_cycle),
            CheckPlain: self.runner.check_plain,
            SetPlainRate: lambda command: self.runner.set_plain_rate(command.tokens_per_s),
            PostponeMeasuring: lambda command: self.runner.postpone_measuring(command.seconds),
            Serve: lambda c: self.runner.serve(c.host, c.port, c.api_key, c.mode),
            StopServing: lambda command: self.runner.stop_serving(),
        }

    def report(self, event: Event) -> None:
        if self.crash_at == CrashPoint.LOAD and isinstance(event, LoadProgress) and event.fraction > 0:
            _crash()
        self.outbox.report(event)

    def worker_lost(self, words: str) -> None:
        """llama.cpp is about to abort for a lost RPC worker: say which, then end as it would."""
        try:
            self.report(WorkerLost(words))
        finally:
            os._exit(3)

    def on_cycle(self, cycle) -> None:
        if self.crash_at == CrashPoint.FIRST_DECODE and self.fresh:
            _crash()
        if self.crash_at == CrashPoint.MID_GENERATION and cycle.index == MID_GENERATION_CYCLE:
            _crash()
        self.fresh = False
        if self.to_remember is not None:
            profiles.remember(*self.to_remember)
            self.to_remember = None

    def load(self, command: Load) -> None:
        if command.profile:  # chosen after a crash: remembered once it loads and decodes
            profile, why = profiles.by_name(command.profile), command.why
            self.to_remember = (profile, why) if why else None
        else:
            profile, why = profiles.remembered()
        self.report(ProfileChosen(profile.name, why))
        request = command.request
        self.fresh = self.runner.load(replace(request, options=profile.apply(request.options)))

    def run(self) -> None:
        while True:
            wait = self.runner.measuring_waits()
            if 0 < wait < float("inf") and not self.conn.poll(wait):
                try:
                    self.idle_work()  # the quiet spell the user asked for is over
                except Exception:  # nobody asked for it: the engine goes on without it
                    import traceback

                    traceback.print_exc()
                continue
            try:
                command = self.conn.recv()
            except (EOFError, OSError):
                break
            if isinstance(command, Quit):
                break
            try:
                self.handlers[type(command)](command)
                if not self.conn.poll():  # what is queued comes first (a postponement sent with a Load)
                    self.idle_work()
            except Exception as exc:  # a Python error still reaches the window as words
                import traceback

                traceback.print_exc()
                self.report(command.failure(f"The engine failed: {exc.__class__.__name__}: {exc}"))
        self.runner.close_models()

    def idle_work(self) -> None:
        """Between commands, while the user reads: what is still unmeasured, stopped at the next
        pass (or child process) once a command arrives (a keystroke's postponement included),
        and taken up again after it."""
        interrupted = lambda: self.conn.poll() or self.stop.is_set() or self.runner.measuring_waits() > 0  # noqa: E731
        self.runner.calibrate_while_idle(interrupted)
        self.runner.tune_while_idle(interrupted)


class EngineProcess:
    """One engine process: ``protocol`` commands in, events out (``on_event(event)`` on a reader thread).

    ``on_exit(code)`` runs on the reader thread when the process ends without being asked to.
    """

    def __init__(self, on_event: Callable[[Event], None], on_exit: Callable[[int | None], None],
                 exact: bool | None = None):
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or Qt state copied
        self.stop = ctx.Event()
        self.cancel_load = ctx.Event()
        self._conn, child_conn = ctx.Pipe()
        self._on_event = on_event
        self._on_exit = on_exit
        self._ending = False
        self._send_lock = threading.Lock()
        self.messages = 0  # read from the pipe: a batch of cycles is one
        self.exact = exact  # the row-invariance switch it was started with (None: not chosen)
        self.process = ctx.Process(target=_engine_main, args=(child_conn, self.stop, self.cancel_load, exact),
                                   name="speculum-engine", daemon=True)
        self.process.start()
        child_conn.close()  # the child holds its own end: its death closes the pipe for our reader
        self._reader = threading.Thread(target=self._read, name="speculum-engine-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, command: Command) -> bool:
        """Queue a command; False when the process is gone (its exit is being reported)."""
        try:
            with self._send_lock:
                self._conn.send(command)
            return True
        except (OSError, ValueError):
            return False

    def _read(self) -> None:
        while True:
            try:
                event = self._conn.recv()
            except (EOFError, OSError):
                break
            self.messages += 1
            for one in event.events if isinstance(event, Batch) else (event,):
                self._on_event(one)
        self._conn.close()
        self.process.join(10)
        if not self._ending:
            self._on_exit(self.process.exitcode)

    def end(self, timeout: float = 5.0) -> None:
        """Ask the process to quit (stopping what it runs); kill it if it does not within ``timeout``.
        Its memory, the models included, goes back to the operating system."""
        self._ending = True
        if self.process.is_alive():  # a dead one may have died holding its events' shared locks
            self.stop.set()
            self.cancel_load.set()
        self.send(Quit())
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)
