"""llama.cpp's CPU settings: two it reads from the environment, set before it loads, and one
it takes per context. Verification sends small batches, and these three decide what they cost.

- How threads wait (``apply``): libgomp's threads spin ``SPIN_COUNT`` times at each barrier,
  then sleep: libgomp's own default, llama-server's. A core another program takes is left to
  it by decoding on a thread fewer (``contention``), which is what once needed a short spin;
  the short spin now only cost the quiet machine its barriers' wake-ups. Where llama.cpp runs
  on libgomp the policy is ``active``, so that its count for more threads than cores (the
  window and the server decode on several threads, each with a team of its own) is 1,000
  spins, not 100. libgomp reads this once, when loaded: ``apply`` runs before llama_cpp is
  imported (``native``).
- ggml's tiled K-quant matmul (``TILED_MATMUL``): in verification passes with AVX-512, not
  elsewhere, until ``tuning`` has measured both on this machine; from then on the measurement
  decides. Prompt chunks take it either way where Speculum's build can say from how many rows
  (``TILED_MIN_ROWS``): it reads prompts faster on every CPU measured.
- Row invariance (``ROW_INVARIANT``): Speculum's switch in its llama.cpp build
  (packaging/llama_cpp_source.py) under which a row's logits do not depend on how many rows
  share its pass, so verified drafts give exactly plain decoding's tokens. ``EXACT_BY_DEFAULT``
  says whether it is on unless the user chose (docs/notes/issue46-exact.md has its cost).
- Flash attention (``attention``): off for a target that verifies on the CPU (ggml's path for
  2-16 query rows walks the whole cache per row), llama.cpp's choice elsewhere, and kept
  where its attention scores would not fit ``KQ_BUDGET``.

The user's own setting of any of them wins. The measurements behind each choice are in
docs/notes/cpu-settings.md.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import re
import sys
from pathlib import Path

from ... import paths

SPIN_COUNT = 300_000  # libgomp spin iterations before a waiting thread sleeps (docs/notes/cpu-settings.md)
USER_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
TILED_MATMUL = "GGML_CPU_TILED_MM"  # ggml's switch for its tiled K-quant matmul (see above)
TILED_MIN_ROWS = "GGML_CPU_TILED_MM_MIN_ROWS"  # Speculum's build: from how many rows it is taken (ggml: 8)
# More rows than any verification pass (policy.costs.MAX_BATCH, 64): prompt chunks only.
PROMPT_CHUNK_ROWS = 65
ROW_INVARIANT = "GGML_CPU_ROW_INVARIANT"  # Speculum's build's switch: one kernel per row whatever the pass
# Its parts, named in place of "1" to measure each (packaging/llama_cpp_source.py)
ROW_INVARIANT_PARTS = ("sgemm-one", "no-sgemm", "repack", "tiled", "flash", "mmla", "gemv-sb", "sgemm-heads")
# On: with Q4_K's gemv rounding as its gemm does, the switch costs plain decoding nothing measurable,
# verify passes nothing and prompt reading 8% on the demo target (docs/notes/issue46-exact.md).
EXACT_BY_DEFAULT = True
KQ_BUDGET = 256 * 2**20  # bytes of attention scores a context without flash attention may reserve
UBATCHES = (512, 256, 128)  # micro-batch sizes it may take to stay within that

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


def _cpu_backend_bytes(pattern: str) -> bytes | None:
    """The first readable file of the installed llama.cpp's CPU backend matching ``pattern``,
    read without loading it (it must not be loaded before the settings are made)."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    for library in sorted((Path(spec.origin).parent / "lib").glob(pattern)):
        try:
            return library.read_bytes()
        except OSError:
            continue
    return None


def llama_cpp_uses_libgomp() -> bool:
    """Whether the installed llama.cpp's CPU backend is linked to libgomp."""
    # One file says it: every CPU variant (and each soname copy of it) links the same runtime.
    return b"libgomp.so" in (_cpu_backend_bytes("libggml-cpu*.so*") or b"")


def build_has_row_switch() -> bool:
    """Whether the installed llama.cpp's CPU backend has Speculum's row-invariance switch (its
    name is among the library's strings)."""
    return ROW_INVARIANT.encode() in (_cpu_backend_bytes("*ggml-cpu*") or b"")


def build_has_tiled_rows() -> bool:
    """Whether the installed llama.cpp's CPU backend reads ``TILED_MIN_ROWS`` (Speculum's build)."""
    return TILED_MIN_ROWS.encode() in (_cpu_backend_bytes("*ggml-cpu*") or b"")


def cpu_name() -> str:
    """The CPU's model name where Linux tells it, else what Python's platform module does."""
    import platform

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        return name


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The CPU's x86 feature flags in Linux's names (avx2, avx512f, ...), as far as this system
    tells them without loading anything: Linux's /proc/cpuinfo, macOS's sysctl, Windows's
    IsProcessorFeaturePresent (AVX-512F alone). None where they cannot be read."""
    if sys.platform == "darwin":
        return _darwin_flags()
    if sys.platform == "win32":
        return _windows_flags()
    return _linux_flags(cpuinfo)


def _linux_flags(cpuinfo: Path) -> set[str] | None:
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()  # no x86 flags line (an ARM CPU): ggml has no tiled path there anyway


def _darwin_flags(run=None) -> set[str] | None:
    """An Intel Mac's flags from ``sysctl machdep.cpu`` (Apple silicon has none: an empty set)."""
    import subprocess

    run = run or (lambda: subprocess.run(["sysctl", "-n", "machdep.cpu.features", "machdep.cpu.leaf7_features"],
                                         capture_output=True, text=True, timeout=5).stdout)
    try:
        return {flag.lower().replace(".", "_") for flag in run().split()}
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


PF_AVX512F_INSTRUCTIONS_AVAILABLE = 41  # Windows' IsProcessorFeaturePresent


def _windows_flags(present=None) -> set[str] | None:
    try:
        if present is None:
            import ctypes

            present = ctypes.windll.kernel32.IsProcessorFeaturePresent  # type: ignore[attr-defined]
        return {"avx512f"} if present(PF_AVX512F_INSTRUCTIONS_AVAILABLE) else set()
    except (OSError, AttributeError):
        return None


def tiled_matmul_pays(flags: set[str] | None) -> bool:
    """Whether ggml's tiled K-quant matmul makes verification passes cheaper on this CPU (see above)."""
    return flags is not None and "avx512f" in flags


def tiled_by_flags() -> str:
    """GGML_CPU_TILED_MM as the CPU's flags say it should be, "1" or "0" (see above)."""
    return "1" if tiled_matmul_pays(cpu_flags()) else "0"


def attention(chosen: bool | None, verifies: bool, on_cpu: bool, mtp: bool,
              n_ctx: int, n_head: int, n_ubatch: int) -> tuple[bool | None, int]:
    """A context's flash attention (None: llama.cpp's own choice) and micro-batch: the user's
    choice; off for a model that verifies on the CPU (see above); otherwise llama.cpp's.

    Without flash attention a micro-batch's attention scores are a matrix, n_ctx x n_ubatch x
    n_head floats, reserved with the context and filled as the context fills (a 512-token chunk
    of Qwen2.5 1.5B at 32k tokens: 0.8 GB; a 7B's: 2 GB). Micro-batches shrink to keep it
    within KQ_BUDGET, down to 128 tokens (prompts read as fast: 15.1 s for 2,048 tokens against
    14.9 s at 512); where even that does not fit, flash attention stays, unless chosen off."""
    if chosen is True or (chosen is None and not (verifies and on_cpu and not mtp)):
        return chosen, n_ubatch
    fitting = next((u for u in UBATCHES if u <= n_ubatch and n_ctx * u * n_head * 4 <= KQ_BUDGET), None)
    if chosen is False:
        return False, fitting or min(n_ubatch, UBATCHES[-1])
    return (False, fitting) if fitting else (None, n_ubatch)


# Where a setting in effect came from (``apply``; the doctor names it).
FROM_USER = "the user's environment"
FROM_MEASUREMENT = "a measurement on this machine"  # the tiled matmul only (engine/llama/tuning.py)
FROM_SPECULUM = "Speculum"


def choose_exact(exact: bool, environ=os.environ) -> None:
    """The command line's --exact / --no-exact: before llama.cpp loads (ggml reads it once)."""
    environ[ROW_INVARIANT] = "1" if exact else "0"


def apply(environ=os.environ) -> dict:
    """Set the wait policy, the tiled matmul and row invariance for this process unless the user
    chose them; what is in effect."""
    if not _in_effect:
        invariant_chosen = ROW_INVARIANT in environ
        environ.setdefault(ROW_INVARIANT, "1" if EXACT_BY_DEFAULT else "0")
        chosen = {k: environ[k] for k in USER_SETTINGS if k in environ}
        if not chosen:
            environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
            if llama_cpp_uses_libgomp():  # see above: more threads than cores then spin 1,000 times, not 100
                environ["OMP_WAIT_POLICY"] = "active"
        tiled_chosen = TILED_MATMUL in environ
        measured = None if tiled_chosen else _measured_tiled()
        if not tiled_chosen:
            environ.pop(TILED_MIN_ROWS, None)  # (Speculum's own, only with GGML_CPU_TILED_MM)
            environ.update(tiled_environment(measured["tiled"] if measured else tiled_by_flags()))
        _in_effect.update({
            "GOMP_SPINCOUNT": environ.get("GOMP_SPINCOUNT", ""),
            "OMP_WAIT_POLICY": environ.get("OMP_WAIT_POLICY", ""),
            "source": FROM_USER if chosen else FROM_SPECULUM,
            "set_before_libgomp_loaded": _libgomp_loaded() is not True,
            TILED_MATMUL: environ[TILED_MATMUL],
            TILED_MIN_ROWS: environ.get(TILED_MIN_ROWS),
            "tiled_source": FROM_USER if tiled_chosen else
                            FROM_MEASUREMENT if measured else FROM_SPECULUM,
            "tiled_measured": {k: measured.get(k) for k in ("decided_by", "model", "at")} if measured else None,
            ROW_INVARIANT: environ[ROW_INVARIANT],
            "invariant_source": FROM_USER if invariant_chosen else FROM_SPECULUM,
        })
    return dict(_in_effect)


def tiled_environment(in_passes: str) -> dict[str, str]:
    """The tiled matmul's environment for a decision on verification passes ("1": they take it,
    "0": they do not): prompt chunks take it either way where the build can say so (see above)."""
    if in_passes == "1":
        return {TILED_MATMUL: "1"}
    if build_has_tiled_rows():
        return {TILED_MATMUL: "1", TILED_MIN_ROWS: str(PROMPT_CHUNK_ROWS)}
    return {TILED_MATMUL: "0"}


def tiled_in_passes(setting: dict) -> bool:
    """Whether verification passes take the tiled matmul under ``setting`` (read as ggml does)."""
    rows = _number(setting.get(TILED_MIN_ROWS))
    return tiled_matmul_on(setting) and (rows is None or rows <= 0 or rows < PROMPT_CHUNK_ROWS)


def _number(value: str | None) -> int | None:
    digits = re.match(r"\s*[+-]?\d+", value or "")
    return int(digits.group()) if digits else None


def _measured_tiled() -> dict | None:
    """The setting measured on this machine (engine/llama/tuning.py), if any."""
    try:
        return remembered()
    except OSError:  # a data folder that cannot be read: the CPU's rule
        return None


# What engine/llama/tuning.py measured here, kept per CPU and llama.cpp version: read here, at
# the next engine start, before llama.cpp loads.
TUNING_FILE = "cpu-tuning.json"


@functools.lru_cache(maxsize=1)
def key() -> str:
    """This CPU and llama.cpp version, read without loading llama.cpp (it must not be loaded
    before cpu_settings has set the environment). Once per process: ~15 ms, and the idle
    engine asks after every command."""
    from importlib import metadata

    try:
        version = metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"{platform.system()} {platform.machine()} · {cpu_name()} · llama-cpp-python {version}"


def _memory() -> dict:
    return paths.read_json_object(paths.data_dir() / TUNING_FILE) or {}


def remembered() -> dict | None:
    """What was measured here: {"tiled": "1"/"0", "model": ..., "passes": ...}, or None."""
    entry = _memory().get(key())
    if isinstance(entry, dict) and entry.get("tiled") in ("1", "0"):
        return entry
    return None


def remember(entry: dict) -> None:
    memory = _memory()
    memory[key()] = entry
    paths.write_json_atomic(paths.data_dir() / TUNING_FILE, memory, indent=1)


def rows_invariant_asked(setting: dict) -> bool:
    """Whether the row-invariance switch is on in ``setting``, as ggml reads it: a number (atoi != 0),
    or a list of the parts to turn on (packaging/llama_cpp_source.py; for measuring them)."""
    value = setting.get(ROW_INVARIANT) or ""
    if value[:1].isdigit():
        return (_number(value) or 0) != 0
    return any(part in value for part in ROW_INVARIANT_PARTS)


def keeps_repacked_weights(quantization: str, machine: str | None = None) -> bool:
    """Whether a model keeps ggml's repacked weights under the row-invariance switch: Q4_K files
    on x86, whose repacked gemv then rounds as its gemm does (the switch's gemv-sb part), so verify
    passes and prompts keep gemm's speed. Other repacked types take every row through gemv under
    the switch, slower than plain weights, which then serve them."""
    machine = (machine or platform.machine()).lower()
    return quantization.upper().startswith("Q4_K") and machine in ("x86_64", "amd64", "i386", "i686", "x86")


def tiled_matmul_on(setting: dict) -> bool:
    """Whether ggml takes its tiled path at all under ``setting``, read as ggml reads it (atoi != 0)."""
    value = setting.get(TILED_MATMUL)
    if value is None:
        return True  # ggml's default
    return (_number(value) or 0) != 0


def in_effect() -> dict:
    """The setting as applied, and whether libgomp is now loaded (it reads the setting then)."""
    return {**_in_effect, "libgomp_loaded": _libgomp_loaded()}
