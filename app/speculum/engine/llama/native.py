"""The gate to llama.cpp: imported first by whatever loads it.

Importing this module sets llama.cpp's CPU settings (``cpu_settings.apply``: libgomp reads
them once, when ``llama_cpp`` loads it), imports ``llama_cpp``, captures its log (kept quiet,
the last lines remembered to name why a load failed) and initialises its backend. It also
finds the libraries llama-cpp-python ships beside libllama and tells what this build and
machine can do (GPU backend, AMX kernels, version). It imports nothing else of the engine's
that loads llama.cpp, so every such module can import it and none imports another to get here.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import sys
import threading
import time
from pathlib import Path

from . import cpu_settings
from ..backend import usable_cores

cpu_settings.apply()  # how llama.cpp's threads wait: libgomp reads it when llama_cpp loads it, below
import llama_cpp as lc  # noqa: E402

# --- llama.cpp's log: kept quiet, the last lines remembered for error messages -------------

_log_lines: collections.deque[str] = collections.deque(maxlen=40)
_log_verbose = bool(os.environ.get("SPECULUM_LLAMA_LOG"))


@lc.llama_log_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", errors="replace")
    _log_lines.append(line)
    if _log_verbose:
        print(line, end="", flush=True)


lc.llama_log_set(_log_callback, ctypes.c_void_p(0))
lc.llama_backend_init()


def clear_log() -> None:
    """Forget what llama.cpp logged so far: the next error is read from what follows."""
    _log_lines.clear()


def recent_log_error() -> str:
    """The most telling line llama.cpp logged, to name why a load failed."""
    lines = [line.strip() for line in _log_lines]
    for marker in ("error loading model:", "unknown", "error", "failed", "unsupported"):
        for line in reversed(lines):
            if marker in line.lower():
                return line.split(marker, 1)[-1].strip() if marker.endswith(":") else line.split(": ", 1)[-1]
    return ""


# --- stopping a decode between graph nodes ------------------------------------------------

# llama.cpp's abort callback is asked after every graph node, on ggml's compute thread. A Python
# callback there would take the GIL hundreds of times a decode, and wait for it whenever another
# thread runs Python. C's strlen over two bytes [flag, 0] answers the same question (1 when the
# flag is set, 0 when not) as one byte read: the bool it returns is that 0 or 1.
_libc = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
_READ_FLAG = lc.ggml_abort_callback(ctypes.cast(_libc.strlen, ctypes.c_void_p).value)
_WATCH_S = 0.05  # how often an idle watcher looks whether its region has ended


class AbortFlag:
    """One context's abort flag: set, the decode running ends at its next graph node
    (``llama_decode`` returns 2), and so does every decode until it is cleared."""

    def __init__(self, ctx) -> None:
        self._bytes = ctypes.create_string_buffer(2)  # [flag, 0]: strlen reads at most both
        lc.llama_set_abort_callback(ctx, _READ_FLAG, ctypes.addressof(self._bytes))

    @property
    def is_set(self) -> bool:
        return self._bytes[0] != b"\0"

    @contextlib.contextmanager
    def armed(self, stop):
        """Inside, ``stop`` being set (by any thread, or another process for a multiprocessing
        Event) sets the flag; on leaving it is cleared. Nothing else ever sets it, so a decode
        whose request was not stopped is never cut."""
        lock, region = threading.Lock(), {"open": True}

        def watch() -> None:
            # Polled, never ``stop.wait()``: a multiprocessing Event's waiter is counted in shared
            # memory, and one that dies waiting (the engine process crashing) makes the window's
            # next ``set()`` wait for it forever.
            while True:
                time.sleep(_WATCH_S)
                fired = stop.is_set()
                with lock:
                    if not region["open"]:
                        return
                    if fired:
                        self._bytes[0] = b"\1"
                        return

        if stop.is_set():
            self._bytes[0] = b"\1"
        else:
            threading.Thread(target=watch, name="speculum-stop-watch", daemon=True).start()
        try:
            yield
        finally:
            with lock:
                region["open"] = False
                self._bytes[0] = b"\0"


# --- what the machine can do ------------------------------------------------------------------

def system_info() -> str:
    return lc.llama_print_system_info().decode("utf-8", errors="replace")


def has_amx_kernels() -> bool:
    """Whether this llama.cpp was compiled with its AMX kernels, which crash on the first
    batched decode on CPUs that have AMX (llama.cpp issue 20824)."""
    return "AMX_INT8 = 1" in system_info()


# ggml's device types (ggml-backend.h): GPU and integrated GPU are what offloading means.
_DEVICE_TYPE_GPU, _DEVICE_TYPE_IGPU = 1, 2


def shipped_library(stem: str) -> ctypes.CDLL:
    """A library llama-cpp-python ships beside libllama ("ggml", "ggml-rpc"); OSError when absent."""
    lib_dir = Path(lc.__file__).parent / "lib"
    names = {"win32": (f"{stem}.dll",), "darwin": (f"lib{stem}.dylib",)}.get(sys.platform, (f"lib{stem}.so",))
    path = next((lib_dir / n for n in names if (lib_dir / n).exists()), None)
    if path is None:
        raise OSError(f"{names[0]} is not in {lib_dir}")
    return ctypes.CDLL(str(path))


def ggml_library() -> ctypes.CDLL:
    """ggml's own library: the device registry lives there."""
    lib = shipped_library("ggml")
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    return lib


def gpu_backend() -> str | None:
    """The GPU backend this llama.cpp offloads to ('Metal', 'CUDA', ...), or None.

    Asked of ggml's device list: ``llama_supports_gpu_offload()`` is also true for a build
    with the RPC backend and no GPU at all.
    """
    if not lc.llama_supports_gpu_offload():
        return None
    try:
        ggml = ggml_library()
    except (OSError, AttributeError):  # an unusual build: fall back to what system info names
        info = system_info().lower()
        return next((n for n in ("CUDA", "Metal", "HIP", "Vulkan", "SYCL", "OpenCL") if n.lower() in info), None)
    for device in local_gpus(ggml):
        name = ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(device))
        return (name or b"GPU").decode("utf-8", errors="replace")
    return None


def local_gpus(ggml: ctypes.CDLL) -> list[int]:
    """This machine's GPU devices, as llama.cpp's default list has them (discrete GPUs, else
    integrated ones), without RPC workers' devices, which also say they are GPUs."""
    gpus, igpus = [], []
    for i in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(device)) == b"RPC":
            continue
        kind = ggml.ggml_backend_dev_type(device)
        if kind == _DEVICE_TYPE_GPU:
            gpus.append(device)
        elif kind == _DEVICE_TYPE_IGPU:
            igpus.append(device)
    return gpus or igpus[:1]


def n_embd_out(model) -> int:
    """Width of a model's NextN hidden rows: llama.cpp's n_embd_out, n_embd where this
    llama-cpp-python does not declare it."""
    width = lc.llama_model_n_embd_out if hasattr(lc, "llama_model_n_embd_out") else lc.llama_model_n_embd  # library:
    return width(model)


def default_threads() -> int:
    return max(1, min(usable_cores(), 16))


def llama_cpp_version() -> str:
    return getattr(lc, "__version__", "unknown")  # library: a build may not say



def json_schema_gbnf(schema_json: str) -> str:
    """llama-cpp-python's JSON-schema to GBNF converter (its port of llama.cpp's), for engine.grammar."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf
    return json_schema_to_gbnf(schema_json)


def json_gbnf() -> str:
    """llama.cpp's grammar of any JSON object (json.gbnf)."""
    from llama_cpp.llama_grammar import JSON_GBNF
    return JSON_GBNF
