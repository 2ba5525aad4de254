"""How many of our cores other programs are using, as it happens; llama.cpp's threads follow.

llama.cpp's threads meet at a barrier after every operation, hundreds of times a token. When
another program takes one of the cores, the thread on it is preempted and every other thread
waits for it at each barrier: one busy core of two took plain decoding of the demo target from
10.6 to 5.6 tok/s with a short spin (1,000), and to 1.4 with libgomp's default, the spin
Speculum keeps now that its threads follow the cores (docs/notes/cpu-settings.md). With one thread fewer, no thread waits for a preempted one and
the other program keeps its core. So every INTERVAL_S, at a decode, the cores this process may
run on are read for the CPU time spent on them by everything else (the system's busy time on
them less this process's own), and the next decode runs on the cores left.

Read from /proc/stat (Linux: the per-core lines of the cores in this process's affinity, so a
container's host with 64 cores counts only ours). Elsewhere the thread count stays as chosen.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

INTERVAL_S = 0.25  # how often the cores are read: a busy spell costs at most this at the old count
# Others' share of a core for it to count as taken: below it (a terminal, an idle browser) the
# core is ours more often than not, and a thread fewer would cost more than the waits.
TAKEN_AT = 0.6
STALE_S = 1.0  # a reading older than this (the process was idle) is not carried into a new decode


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))  # platform: Linux only
    except (AttributeError, OSError):
        return None


def busy_seconds(cores: set[int] | None = None, stat: str = "/proc/stat") -> float | None:
    """CPU seconds spent so far on ``cores`` (all when None) by everything (user, nice, system,
    interrupts, and steal: time a hypervisor gave the core to someone else); None where the
    system does not say."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open(stat, encoding="ascii") as f:
            lines = f.read().splitlines()
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    total = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            index = int(name[3:])
            fields = [int(v) for v in rest.split()]
        except ValueError:
            continue
        if cores is not None and index not in cores:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
        total += user + nice + system + irq + softirq + steal
    return total / ticks


def own_seconds() -> float:
    """CPU seconds this process has used, all its threads."""
    t = os.times()
    return t.user + t.system


class Cores:
    """Cores taken by other programs, read at most every INTERVAL_S; ``threads`` says how many
    threads a decode should run on now."""

    def __init__(self, busy: Callable[[], float | None] | None = None, own: Callable[[], float] = own_seconds,
                 clock: Callable[[], float] = time.monotonic):
        affinity = _affinity()
        self._busy = busy if busy is not None else (lambda: busy_seconds(affinity))
        self._own = own
        self._clock = clock
        self._lock = threading.Lock()  # the target and the draft model decode on different threads
        self._last: tuple[float, float, float] | None = None  # (clock, busy, own) at the last reading
        self.taken = 0  # cores other programs held over the last interval
        self.others = 0.0  # and what they used of them, in cores

    def threads(self, wanted: int) -> int:
        """``wanted`` less the cores other programs took over the last interval, at least one."""
        now = self._clock()
        with self._lock:
            if self._last is None or now - self._last[0] >= INTERVAL_S:
                self._read(now)
            return max(1, wanted - self.taken)

    def _read(self, now: float) -> None:
        busy = self._busy()
        if busy is None:
            return
        own = self._own()
        if self._last is not None and now - self._last[0] <= STALE_S:
            then, busy_then, own_then = self._last
            self.others = max(0.0, (busy - busy_then) - (own - own_then)) / (now - then)
            self.taken = int(self.others + 1.0 - TAKEN_AT)
        else:
            # The first decode after a pause: what others did while this process waited says
            # little of now (a server beside it answered a request, a build ended), and a prompt
            # read on one thread for it costs seconds. All cores, until the next reading says.
            self.others, self.taken = 0.0, 0
        self._last = (now, busy, own)


_cores: Cores | None = None
FOLLOW = "SPECULUM_FOLLOW_CORES"  # "0": the thread count stays as chosen (a test that needs one kernel path)


def cores() -> Cores | None:
    """The process's one reading of its cores, shared by every model in it (None: not followed)."""
    global _cores
    if os.environ.get(FOLLOW) == "0":
        return None
    if _cores is None:
        _cores = Cores()
    return _cores


def describe(threads: int) -> str:
    """The doctor's line: how many threads decode, and whether they follow other programs."""
    if busy_seconds(_affinity()) is None:
        return f"{threads} (this system does not say how busy its cores are: the count stays; --threads sets it)"
    return (f"{threads}, one fewer for each core another program keeps busy (read every {INTERVAL_S:g} s "
            f"from /proc/stat); --threads N keeps N")
