"""The window gives way to decoding: while llama.cpp's threads fill every core, the window's
threads wait for a core instead of taking one from them.

llama.cpp's threads meet at a barrier after every operation of the graph. When the window's
UI thread wakes (a frame, a pipe message, a mouse move) on a machine whose every core runs
llama.cpp, Linux's scheduler gives it a core at once by preempting one of those threads, and
the others wait at the next barrier until it is back: each millisecond the window takes costs
a millisecond of decoding. ``SCHED_BATCH`` keeps everything else about the window's threads
(their fair share, their nice level) and drops only that wake-up preemption: a woken window
thread runs when a core falls idle, as llama.cpp's threads do between passes, or at the next
scheduler tick (a few milliseconds), which no one sees in a window redrawn twice a second.

Linux only: other systems have no such policy, and nothing is done there. A process inherits
the policy of the thread that starts it (``SCHED_RESET_ON_FORK`` resets only real-time ones),
so the engine process sets its own back to normal first thing.
"""

from __future__ import annotations

import os

_BATCH = getattr(os, "SCHED_BATCH", None)  # platform: Linux scheduling classes
_NORMAL = getattr(os, "SCHED_OTHER", None)  # platform:


def supported() -> bool:
    return _BATCH is not None and hasattr(os, "sched_setscheduler") and os.path.isdir("/proc/self/task")  # platform:


def _threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return []


def give_way(on: bool) -> bool:
    """Put every thread of this process on ``SCHED_BATCH`` (True) or back on the normal policy
    (False). Returns whether that policy is now in effect on every thread that is still there."""
    if not supported():
        return False
    policy = _BATCH if on else _NORMAL
    done = True
    for tid in _threads():
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except OSError:
            done = False  # not ours to change (a sandbox's seccomp filter, say): nothing lost
    return done


def policy_of(tid: int = 0) -> int | None:
    """The scheduling policy of a thread of this process (0: the calling thread); None where
    it cannot be read."""
    if not supported():
        return None
    try:
        return os.sched_getscheduler(tid)
    except OSError:
        return None
