"""The window gives way to decoding: its threads on SCHED_BATCH (Linux) while llama.cpp fills
every core; the engine process always on the normal policy."""

from __future__ import annotations

import os
import threading

from speculum import yielding


def _policies() -> dict[int, int | None]:
    return {int(tid): yielding.policy_of(int(tid)) for tid in os.listdir("/proc/self/task")}


def test_giving_way_moves_every_thread_of_the_process_and_back():
    if not yielding.supported():  # macOS, Windows: no such policy, and nothing claims otherwise
        assert yielding.give_way(True) is False and yielding.policy_of() is None
        return
    release = threading.Event()
    worker = threading.Thread(target=release.wait, daemon=True)
    worker.start()  # a thread that was there before: the pipe reader, Qt's own threads
    try:
        assert _policies()[worker.native_id] == os.SCHED_OTHER
        assert yielding.give_way(True)
        policies = _policies()
        assert worker.native_id in policies
        assert set(policies.values()) == {os.SCHED_BATCH}
        # A thread started now inherits the policy of its maker: the window's threads all wait alike.
        seen: list = []
        late = threading.Thread(target=lambda: seen.append(yielding.policy_of()))
        late.start()
        late.join()
        assert seen == [os.SCHED_BATCH]
        assert yielding.give_way(False)
        assert set(_policies().values()) == {os.SCHED_OTHER}
    finally:
        yielding.give_way(False)
        release.set()
