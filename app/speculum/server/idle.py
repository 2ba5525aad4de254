"""Auto mode's costs measured in a server's idle moments.

A fresh `speculum serve` answers its first request at once: auto mode starts from estimates of
this machine's costs (and learns from the requests' own passes), while the verify curve is
measured between requests, one pass at a time, giving way as soon as a request comes, as the
window measures while its user types. Once measured, the costs are kept in the data folder for
this machine and model pair, and later starts skip this.
"""

from __future__ import annotations

import enum
import sys
import threading
import time
from typing import Callable

from ..engine.vocabulary import Mode
from ..errors import SpeculumError
from .service import ServedModel

QUIET_S = 2.0  # a pause in the traffic this long before measuring: an agent's next turn often follows at once
LOOK_S = 0.25  # how often a quiet moment is looked for


class Outcome(enum.Enum):
    """How one measuring run ended."""
    MEASURED = "measured"  # all of it
    PARTLY = "partly"  # what could be, without a request in the way: the requests' passes time the rest
    INTERRUPTED = "interrupted"  # a request came first: taken up again in the next quiet moment
    FAILED = "failed"  # said, or the server is ending


def _say(line: str) -> None:
    print(f"speculum: {line}", file=sys.stderr, flush=True)


class IdleMeasuring:
    """Measures ``mode``'s costs whenever ``served`` has no request, until they are measured or
    ``stopping()``; a request that comes meanwhile stops it within one pass."""

    def __init__(self, served: ServedModel, mode: Mode, stopping: Callable[[], bool],
                 say: Callable[[str], None] = _say, quiet_s: float = QUIET_S):
        self.served = served
        self.mode = mode
        self.stopping = stopping
        self.say = say
        self.quiet_s = quiet_s
        self.measuring = False  # a measuring pass runs now
        self.interruptions = 0  # times a request cut the measuring short
        self.done = threading.Event()  # measured, or given up: nothing more to do
        self.spent = 0.0  # seconds spent measuring, in all

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="speculum-idle-measuring", daemon=True)
        thread.start()
        return thread

    def _needed(self) -> bool:
        decoder = self.served.decoder
        return decoder is not None and decoder.policy_for(self.mode).needs_calibration

    def _interrupted(self) -> bool:
        return self.served.asked or self.stopping()

    def _given_way(self, cut: list) -> Callable[[], bool]:
        """``calibrate``'s question before each pass; ``cut`` records a request that came."""
        def interrupted() -> bool:
            if self.served.asked:
                cut.append(True)
                return True
            return self.stopping()
        return interrupted

    def run(self) -> None:
        try:
            self._measure()
        finally:
            self.done.set()

    def _measure(self) -> None:
        quiet_since = time.monotonic()
        told = False
        while not self.stopping() and self._needed():
            if self.served.asked:
                quiet_since = time.monotonic()
            if time.monotonic() - quiet_since < self.quiet_s:
                time.sleep(LOOK_S)
                continue
            if not told:
                self.say(f"measuring this machine's costs for {self.mode} mode while no request waits (once for "
                         "these models; until then it works from estimates)")
                told = True
            outcome = self._one_try()
            if outcome is Outcome.INTERRUPTED:  # a request came: measured again once it is answered
                self.interruptions += 1
                quiet_since = time.monotonic()
                continue
            if outcome is Outcome.MEASURED:
                self.say(f"measured in {self.spent:.1f} s")
            elif outcome is Outcome.PARTLY:
                self.say(f"partly measured in {self.spent:.1f} s; auto mode times the rest from the requests")
            return

    def _one_try(self) -> Outcome:
        """One measuring run while the model is free."""
        with self.served.turn:
            if self._interrupted():
                return Outcome.INTERRUPTED
            decoder = self.served.decoder
            self.measuring = True
            start, cut = time.monotonic(), []
            try:
                measured = decoder.calibrate(self._given_way(cut), self.mode)
            except SpeculumError as exc:  # (an RPC worker lost meanwhile: the next request says so, as ever)
                self.say(f"not measured ({exc}); auto mode learns from the requests instead")
                return Outcome.FAILED
            finally:
                self.measuring = False
                self.spent += time.monotonic() - start
        if measured:
            return Outcome.MEASURED
        if self.stopping():
            return Outcome.FAILED  # (the server is ending: nothing to say)
        return Outcome.INTERRUPTED if cut else Outcome.PARTLY
