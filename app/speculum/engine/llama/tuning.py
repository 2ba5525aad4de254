"""Measured on this machine: whether ggml's tiled matmul makes verification passes cheaper.

``cpu_settings`` chooses GGML_CPU_TILED_MM by the CPU's flags (on with AVX-512), a rule that
rests on three machines. ggml reads the setting once per process, so the engine cannot try
both itself: after a load, while the engine waits for the user, child processes (one per
setting, alternated, twice) time the target's verification passes of 8 and 16 tokens, and
the faster setting is kept in the data folder for this CPU and llama.cpp version. The next
engine start uses it (``cpu_settings.apply``); the user's own setting still wins. A target
more than twice the size of the one it was measured with measures it again.

A child loads the target again, and its repacked weights are copies, not the shared mapping
of the file: it runs only where the free memory holds the file twice over. It is stopped as
soon as a request comes, and measuring starts again at the next idle moment.

    speculum tune --target MODEL.gguf   (measure now, remember, print)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ..settings import LoadOptions
from .cpu_settings import TILED_MATMUL, TILED_MIN_ROWS, remember, remembered, tiled_by_flags

OFF_SWITCH = "SPECULUM_NO_TUNING"  # set: never measure (the test suite; a machine that must stay quiet)
SIZES = (1, 8, 16)  # a single step, and the passes the tiled path changes (8 rows and more)
MARGIN = 0.05  # a setting is chosen only when its passes are this much faster
ROUNDS = 2
OUTGROWN = 2  # a measurement is made again with a target more than this many times the size it was made with
CACHED = 256  # tokens in the cache while passes are timed
_failed: list[str] = []  # targets whose child failed in this process
TEXT = "def scale(values, factor):\n    return [v * factor for v in values]\n\n"


def free_memory() -> int | None:
    """Bytes of memory available now, where the system tells (Linux); None elsewhere."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def decide(passes: dict[str, dict[str, float]]) -> str | None:
    """The setting whose 8- and 16-token passes took less time, by MARGIN; None: no difference."""
    cost = {s: sum(p[str(n)] for n in SIZES if n > 1) for s, p in passes.items()}
    if cost["1"] < (1 - MARGIN) * cost["0"]:
        return "1"
    if cost["0"] < (1 - MARGIN) * cost["1"]:
        return "0"
    return None


def measure(target: str | os.PathLike, threads: int, interrupted: Callable[[], bool],
            poll_s: float = 0.05) -> dict | None:
    """Both settings timed in child processes, alternated; the medians per setting and size,
    or None when ``interrupted()`` came first (the child is killed) or a child failed."""
    runs: dict[str, list[dict]] = {"1": [], "0": []}
    for _ in range(ROUNDS):
        for setting in ("1", "0"):
            out = _child(target, threads, setting, interrupted, poll_s)
            if out is None:
                return None
            runs[setting].append(out)
    return {s: {str(n): statistics.median(r[str(n)] for r in rs) for n in SIZES} for s, rs in runs.items()}


def child_command(target, threads: int) -> list[str]:
    """``speculum tune --child``: a bundled app is its own executable, an installed one runs
    the CLI module with this Python."""
    frozen = getattr(sys, "frozen", False)  # platform: a bundled app (PyInstaller) runs itself
    program = [sys.executable] if frozen else [sys.executable, "-m", "speculum.cli"]
    return program + ["tune", "--child", "--target", str(target), "--threads", str(threads)]


def _child(target, threads: int, setting: str, interrupted: Callable[[], bool], poll_s: float) -> dict | None:
    # Verification passes with the tiled path or without: not the prompt-chunks-only setting
    # this process may run with.
    env = {**os.environ, TILED_MATMUL: setting}
    env.pop(TILED_MIN_ROWS, None)
    cmd = child_command(target, threads)
    # The user's programs go first.
    niced = (lambda: os.nice(10)) if hasattr(os, "nice") else None  # platform: not on Windows
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=niced)
    try:
        while proc.poll() is None:
            if interrupted():
                return None
            time.sleep(poll_s)
        out = proc.stdout.read() if proc.stdout else ""
        result = json.loads(out.strip().splitlines()[-1]) if proc.returncode == 0 else {}
        if all(isinstance(result.get(str(n)), (int, float)) for n in SIZES):
            return result
    except (ValueError, IndexError, AttributeError):
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
    _failed.append(str(target))  # not tried again in this process: it would fail at every idle moment
    return None


def needs_measuring(entry: dict | None, target_bytes: int) -> bool:
    """Whether to measure with a target of this size: nothing measured yet, or measured with a
    model less than half its size (a small model's passes are short and read noisy, and the
    setting matters most where the target is large). Entries from before sizes were kept count as 0."""
    if entry is None:
        return True
    measured = entry.get("model_bytes")
    return not isinstance(measured, int) or target_bytes > OUTGROWN * measured


def measure_and_remember(target: str | os.PathLike, threads: int, interrupted: Callable[[], bool]) -> dict | None:
    """Measure where it may (see ``needs_measuring``; memory for a second copy), and remember
    the outcome; what was remembered, or None."""
    if os.environ.get(OFF_SWITCH) or str(target) in _failed:
        return None
    free, size = free_memory(), Path(target).stat().st_size
    if not needs_measuring(remembered(), size) or free is None or free < 2 * size + (512 << 20):
        return None
    passes = measure(target, threads, interrupted)
    return remember_passes(target, passes) if passes is not None else None


def remember_passes(target: str | os.PathLike, passes: dict) -> dict:
    choice = decide(passes)
    entry = {"tiled": choice or tiled_by_flags(),
             "decided_by": "measurement" if choice else "the CPU's flags (no difference measured)",
             "model": Path(target).name, "model_bytes": Path(target).stat().st_size, "passes": passes,
             "at": time.strftime("%Y-%m-%d %H:%M")}
    remember(entry)
    return entry


def time_passes(target: str, threads: int, sizes=SIZES, cached: int = CACHED, repeat: int = 5,
                flash_attn: bool | None = None, one_row=()) -> dict:
    """Seconds per pass by size (median of ``repeat``) after ``cached`` tokens, the target as the
    engine loads it (``flash_attn`` None: as Speculum chooses); sizes in ``one_row`` ask for one
    row of logits, as a prompt chunk does. The tuning child's work; scripts/bench_curve.py's too."""
    from .model import LlamaModel

    longest = max(sizes)
    model = LlamaModel(target, LoadOptions(n_ctx=cached + longest + 64, n_threads=threads, flash_attn=flash_attn),
                       verifies=True)
    tokens = model.tokenize(TEXT * ((cached + longest) // 10 + 4))
    context, extra = tokens[:cached], tokens[cached:cached + longest]
    model.prefill(context)
    model.decode(extra[:1])  # warm-up: the first pass after loading pages weights in
    model.trim(len(context))
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeat):
        for n in sizes:
            start = time.perf_counter()
            model.decode(extra[:n], rows=[n - 1] if n in one_row else range(n))
            times[n].append(time.perf_counter() - start)
            model.trim(len(context))
    model.close()
    return {str(n): statistics.median(t) for n, t in times.items()}
