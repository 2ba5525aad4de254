"""How llama.cpp's CPU threads wait for each other, set before llama.cpp loads.

llama.cpp's OpenMP threads meet at a barrier after every operation of the graph, hundreds of
times per token. By default libgomp lets a waiting thread spin 300,000 times before it
sleeps. On a desktop, where a browser or an editor takes a core now and then, the thread
being waited for is preempted while the others spin on, and decoding collapses (measured
10.8 → 1.4 tok/s with one of two cores busy). Sleeping at once (``OMP_WAIT_POLICY=passive``)
survives load but loses a quarter of the quiet speed, since every barrier then costs a
futex wake-up. A short spin keeps the quiet speed (on a quiet machine the others arrive
within it) and gives the core away soon when they do not. ``scripts/bench_load.py`` measures it;
on a 2-core machine, Qwen2.5-Coder 1.5B, plain decoding (quiet tok/s, with one core busy):
libgomp's default 10.9 → 3.4; passive 9.7 → 5.9; 300 spins 10.4 → 5.7; 1,000 spins 10.6 → 5.6;
3,000 spins 11.8 → 4.7. 1,000 keeps the quiet speed (0.97) and half of it under load.

libgomp reads its environment once, when it is loaded: this must run before llama_cpp is
imported. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is left as it is.
"""

from __future__ import annotations

import os
import sys

SPIN_COUNT = 1_000  # libgomp spin iterations before a waiting thread sleeps (see scripts/bench_load.py)
USER_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")

_in_effect: dict = {}


def _libgomp_loaded() -> bool | None:
    """Whether libgomp is already in this process (None where that cannot be read)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any("libgomp" in line for line in maps)
    except OSError:
        return None


def apply(environ=os.environ) -> dict:
    """Set the wait policy for this process unless the user chose one; what is in effect."""
    if not _in_effect:
        chosen = {k: environ[k] for k in USER_SETTINGS if k in environ}
        if not chosen:
            environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
        _in_effect.update({
            "GOMP_SPINCOUNT": environ.get("GOMP_SPINCOUNT", ""),
            "OMP_WAIT_POLICY": environ.get("OMP_WAIT_POLICY", ""),
            "source": "the user's environment" if chosen else "Speculum",
            "set_before_libgomp_loaded": _libgomp_loaded() is not True,
        })
    return dict(_in_effect)


def in_effect() -> dict:
    """The setting as applied, and whether libgomp is now loaded (it reads the setting then)."""
    return {**_in_effect, "libgomp_loaded": _libgomp_loaded()}
