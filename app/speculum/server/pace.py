"""How fast this server reads prompts and writes answers, measured on its own requests, so a
client turned away from a full queue is told when to come back.

A place in the queue frees when the running request ends (the first waiter then takes its
turn), so ``Retry-After`` is that request's expected remaining time: its unread prompt at the
measured reading rate, plus the answer tokens it is likely still to write (its ``max_tokens``,
or fewer where answers here usually end sooner) at the measured writing rate.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

GUESS_S = 5.0  # before anything is measured
SMOOTHING = 0.3  # weight of the newest request in the running averages


@dataclass
class _Running:
    max_tokens: int
    prompt_left: int
    generated: int = 0
    reading_since: float | None = None
    read: int = 0  # prompt tokens read at reading_since
    writing_since: float | None = None
    first: int = 0  # tokens of the first pass (they came with the prompt's reading)


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


class Pace:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.read_per_s: float | None = None
        self.write_per_s: float | None = None
        self.answer_tokens: float | None = None
        self._running: _Running | None = None
        self._lock = threading.Lock()  # the engine thread reports prompt progress

    def started(self, prompt_tokens: int, max_tokens: int) -> None:
        with self._lock:
            self._running = _Running(max_tokens, prompt_tokens)

    def prompt_read(self, read: int, total: int) -> None:
        """From the engine thread: ``read`` of ``total`` prompt tokens are in the KV cache."""
        with self._lock:
            running = self._running
            if running is None:
                return
            now = self.clock()
            if running.reading_since is None:
                running.reading_since, running.read = now, read
            elif now > running.reading_since and read > running.read:
                self.read_per_s = _average(self.read_per_s, (read - running.read) / (now - running.reading_since))
                running.reading_since, running.read = now, read
            running.prompt_left = total - read

    def wrote(self, tokens: int) -> None:
        """Answer tokens written by one pass (the first one ends the prompt: rates count from it)."""
        with self._lock:
            running = self._running
            if running is None:
                return
            if running.writing_since is None:
                running.writing_since, running.first = self.clock(), tokens
            running.generated += tokens
            running.prompt_left = 0

    def finished(self) -> None:
        with self._lock:
            running, self._running = self._running, None
            if running is not None and running.writing_since is not None:
                self.answer_tokens = _average(self.answer_tokens, running.generated)
                rate = self._live_write_rate(running)
                if rate is not None:
                    self.write_per_s = _average(self.write_per_s, rate)

    def _live_write_rate(self, running: _Running) -> float | None:
        elapsed = self.clock() - running.writing_since if running.writing_since is not None else 0.0
        written = running.generated - running.first
        return written / elapsed if elapsed > 0 and written > 0 else None

    def remaining_s(self) -> float:
        """Expected seconds until the running request ends (0 when none runs)."""
        with self._lock:
            running = self._running
            if running is None:
                return 0.0
            write_per_s = self.write_per_s or self._live_write_rate(running)
            likely = running.max_tokens if self.answer_tokens is None else min(running.max_tokens,
                                                                               math.ceil(self.answer_tokens))
            seconds = max(0, likely - running.generated) / write_per_s if write_per_s else GUESS_S
            if running.prompt_left > 0:
                seconds += running.prompt_left / self.read_per_s if self.read_per_s else GUESS_S
            return seconds

    def retry_after(self) -> int:
        """Whole seconds for a Retry-After header: at least one."""
        return max(1, math.ceil(self.remaining_s()))
