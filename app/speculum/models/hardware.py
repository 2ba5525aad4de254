"""What this machine can hold, and which catalog pairs fit it.

Tokens per second are bound by memory bandwidth, so a pair "fits" when its weights
and KV cache stay in the fastest memory that can run it: VRAM on a discrete GPU,
unified memory on Apple Silicon, RAM otherwise. "Tight" means it runs but shares
memory with everything else (or spills from VRAM to RAM) and will be slower.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from .catalog import CatalogPair

GB = 1e9

# Shares of memory a model may take. Apple's Metal lets a process wire about 3/4 of
# unified memory; on a discrete GPU the driver and display keep ~10%; on a CPU-only
# machine the OS, the app and the user's other programs need the rest of RAM.
UNIFIED_FITS, UNIFIED_TIGHT = 0.65, 0.80
VRAM_FITS = 0.90
RAM_FITS, RAM_TIGHT = 0.60, 0.85
# Without a GPU, decoding speed is bound by RAM bandwidth: past the 7-8B class it drops
# to a few tokens per second, so recommend nothing larger on CPU-only machines.
CPU_RECOMMEND_LIMIT = 8 * GB
# Below this an answer is written slower than it is read: nothing that slow is recommended
# where a faster pair fits.
READABLE_TOKENS_PER_S = 5.0


class Fit(str, Enum):
    FITS = "fits"
    TIGHT = "tight"
    TOO_BIG = "too big"

    @property
    def mark(self) -> str:
        return {"fits": "✓", "tight": "~", "too big": "✗"}[self.value]


@dataclass(frozen=True)
class Machine:
    ram_bytes: int
    gpu_name: str | None = None
    vram_bytes: int = 0
    unified: bool = False  # GPU shares RAM (Apple Silicon)

    @property
    def has_gpu(self) -> bool:
        return self.unified or self.vram_bytes > 0

    def describe(self) -> str:
        ram = f"{self.ram_bytes / GB:.0f} GB RAM"
        if self.unified:
            return f"{ram}, unified with the {self.gpu_name or 'Apple'} GPU"
        if self.vram_bytes:
            return f"{ram}, {self.gpu_name or 'GPU'} with {self.vram_bytes / GB:.0f} GB"
        return f"{ram}, no GPU found"


def _ram_bytes() -> int:
    if sys.platform == "win32":
        class MemoryStatus(ctypes.Structure):
            _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
                        ("ullTotalPhys", ctypes.c_ulonglong), ("ullAvailPhys", ctypes.c_ulonglong),
                        ("ullTotalPageFile", ctypes.c_ulonglong), ("ullAvailPageFile", ctypes.c_ulonglong),
                        ("ullTotalVirtual", ctypes.c_ulonglong), ("ullAvailVirtual", ctypes.c_ulonglong),
                        ("ullAvailExtendedVirtual", ctypes.c_ulonglong)]
        status = MemoryStatus()
        status.dwLength = ctypes.sizeof(status)
        ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))  # type: ignore[attr-defined]
        return int(status.ullTotalPhys)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _run(cmd: list[str]) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _nvidia() -> tuple[str, int] | None:
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
    if not out:
        return None
    best: tuple[str, int] | None = None
    for line in out.strip().splitlines():
        name, _, mib = line.rpartition(",")
        try:
            vram = int(float(mib.strip()) * 1024 * 1024)
        except ValueError:
            continue
        if best is None or vram > best[1]:  # llama.cpp puts the model on the largest card first
            best = (name.strip(), vram)
    return best


def _apple_chip() -> str | None:
    out = _run(["sysctl", "-n", "machdep.cpu.brand_string"])
    return out.strip() if out else None


def detect() -> Machine:
    ram = _ram_bytes()
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return Machine(ram, _apple_chip() or "Apple Silicon", ram, unified=True)
    nvidia = _nvidia()
    if nvidia:
        return Machine(ram, nvidia[0], nvidia[1])
    return Machine(ram)


@dataclass(frozen=True)
class PlainSpeed:
    """This machine's plain decoding speed as measured on one model file. Each token reads every
    weight once, so another target's speed here scales with its size (speculation adds to it)."""
    tokens_per_s: float
    model_bytes: int
    model_name: str

    def expected(self, pair: CatalogPair) -> float:
        return self.tokens_per_s * self.model_bytes / max(pair.target.size, 1)

    def basis(self, pair: CatalogPair) -> str:
        return (f"Plain decoding here: {self.tokens_per_s:.1f} tok/s measured with {self.model_name} "
                f"({self.model_bytes / GB:.1f} GB), scaled to this target's {pair.target.size / GB:.1f} GB "
                "(each token reads every weight once). Speculation adds to it.")

    @classmethod
    def from_measurements(cls, rates: dict[str, float]) -> "PlainSpeed | None":
        """From plain rates per model file (the window's settings): the largest file still there."""
        best = None
        for path, rate in rates.items():
            try:
                size = os.stat(path).st_size
            except (OSError, ValueError, TypeError):
                continue
            if isinstance(rate, (int, float)) and rate > 0 and size > 0 and (best is None or size > best.model_bytes):
                best = cls(float(rate), size, os.path.basename(path))
        return best


def fit(pair: CatalogPair, machine: Machine) -> Fit:
    need = pair.memory_bytes
    if machine.unified:
        if need <= UNIFIED_FITS * machine.ram_bytes:
            return Fit.FITS
        return Fit.TIGHT if need <= UNIFIED_TIGHT * machine.ram_bytes else Fit.TOO_BIG
    if machine.vram_bytes:
        if need <= VRAM_FITS * machine.vram_bytes:
            return Fit.FITS
        # llama.cpp can keep the layers that do not fit in VRAM on the CPU
        spill = VRAM_FITS * machine.vram_bytes + RAM_FITS * machine.ram_bytes
        return Fit.TIGHT if need <= spill else Fit.TOO_BIG
    if need <= RAM_FITS * machine.ram_bytes:
        return Fit.FITS
    return Fit.TIGHT if need <= RAM_TIGHT * machine.ram_bytes else Fit.TOO_BIG


@dataclass(frozen=True)
class Recommendation:
    pair: CatalogPair
    rule: str  # which rule picked it, in the words the Models dialog shows


def recommend(pairs: Iterable[CatalogPair], machine: Machine, use: str | None = None,
              speed: PlainSpeed | None = None) -> CatalogPair | None:
    found = recommendation(pairs, machine, use, speed)
    return found.pair if found else None


def recommendation(pairs: Iterable[CatalogPair], machine: Machine, use: str | None = None,
                   speed: PlainSpeed | None = None) -> Recommendation | None:
    """The most capable pair that fits (for ``use`` when given) and, where this machine's speed
    was measured, writes at a readable speed (else the fastest that fits); else the smallest
    that runs; with the rule that chose it. Entries read from a community page (``source``:
    rounded sizes, never loaded by us) are listed for the user to choose, not recommended: a
    first download should be one we ran."""
    pairs = [p for p in pairs if p.source is None]
    pairs = [p for p in pairs if use is None or use in p.good_at] or pairs
    fitting = [p for p in pairs if fit(p, machine) is Fit.FITS]
    rule = "the most capable pair that fits in memory"
    if not machine.has_gpu and fitting:
        small = [p for p in fitting if p.memory_bytes <= CPU_RECOMMEND_LIMIT]
        if not small:
            rule = "no GPU here: the smallest pair that fits (a CPU writes large models slowly)"
        elif len(small) < len(fitting):
            rule = (f"no GPU here: the most capable pair of at most {CPU_RECOMMEND_LIMIT / GB:.0f} GB "
                    "(larger ones fit, but a CPU writes them at a few tokens per second)")
        fitting = small or [min(fitting, key=lambda p: p.memory_bytes)]
    if speed is not None and fitting:
        readable = [p for p in fitting if speed.expected(p) >= READABLE_TOKENS_PER_S]
        if not readable:
            rule = f"the fastest pair that fits: none is expected to write {READABLE_TOKENS_PER_S:.0f} tok/s here"
        elif len(readable) < len(fitting):
            rule = (f"the most capable pair that fits and is expected to write at least "
                    f"{READABLE_TOKENS_PER_S:.0f} tok/s here (this machine's measured speed)")
        fitting = readable or [max(fitting, key=speed.expected)]
    if fitting:
        return Recommendation(max(fitting, key=lambda p: (p.memory_bytes, len(p.good_at))), rule)
    running = [p for p in pairs if fit(p, machine) is Fit.TIGHT]
    smallest = min(running or pairs, key=lambda p: p.memory_bytes, default=None)
    if smallest is None:
        return None
    return Recommendation(smallest, "nothing fits comfortably: the smallest pair that runs" if running
                          else "nothing fits: the smallest pair")