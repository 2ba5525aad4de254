"""What MTP drafting needs from llama.cpp beyond llama-cpp-python's public bindings.

The staging functions of ``src/llama-ext.h`` (``llama_set_embeddings_nextn``,
``llama_get_embeddings_nextn``, ``llama_get_embeddings_nextn_ith``,
``llama_set_nextn_layer_offset``) are exported by libllama as C++ symbols: bound here by
their mangled names (Itanium and MSVC), their plain names first should a later llama.cpp
declare them ``extern "C"``. The ``llama.h`` parts (``load_mtp``, ``LLAMA_CONTEXT_TYPE_MTP``,
``llama_batch_ext_*``, ``llama_process``, ``llama_model_n_layer_nextn``) come from
llama-cpp-python when it declares them. ``support()`` says, in one sentence, why not when
something is missing. Nothing here raises or loads llama.cpp at import; ``native`` does, when
first asked.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache

_CTX = ctypes.c_void_p
_STAGING = {
    # name: (argtypes, restype, mangled names)
    "llama_set_embeddings_nextn": ([_CTX, ctypes.c_bool, ctypes.c_bool], None, (
        "_Z26llama_set_embeddings_nextnP13llama_contextbb",
        "?llama_set_embeddings_nextn@@YAXPEAUllama_context@@_N1@Z")),
    "llama_get_embeddings_nextn": ([_CTX], ctypes.POINTER(ctypes.c_float), (
        "_Z26llama_get_embeddings_nextnP13llama_context",
        "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z")),
    "llama_get_embeddings_nextn_ith": ([_CTX, ctypes.c_int32], ctypes.POINTER(ctypes.c_float), (
        "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
        "?llama_get_embeddings_nextn_ith@@YAPEAMPEAUllama_context@@H@Z")),
    "llama_set_nextn_layer_offset": ([_CTX, ctypes.c_int32], None, (
        "_Z28llama_set_nextn_layer_offsetP13llama_contexti",
        "?llama_set_nextn_layer_offset@@YAXPEAUllama_context@@H@Z")),
}
# What llama-cpp-python itself must declare.
_PUBLIC = ("llama_model_n_layer_nextn", "llama_batch_ext_init", "llama_batch_ext_free", "llama_batch_ext_clear",
           "llama_batch_ext_add_token", "llama_batch_ext_set_pos", "llama_batch_ext_set_embd_token",
           "llama_batch_ext_set_output_logits", "llama_process", "llama_embd", "LLAMA_CONTEXT_TYPE_MTP",
           "LLAMA_PROCESS_TYPE_DECODE")


@dataclass(frozen=True)
class Support:
    ok: bool
    reason: str = ""  # one sentence when not ok

    def __bool__(self) -> bool:
        return self.ok


class Staging:
    """The four staging functions, bound."""

    def __init__(self, funcs: dict):
        self.set_embeddings_nextn = funcs["llama_set_embeddings_nextn"]
        self.get_embeddings_nextn = funcs["llama_get_embeddings_nextn"]
        self.get_embeddings_nextn_ith = funcs["llama_get_embeddings_nextn_ith"]
        self.set_nextn_layer_offset = funcs["llama_set_nextn_layer_offset"]


def _field(struct, name: str) -> bool:
    return any(f[0] == name for f in getattr(struct, "_fields_", ()))  # library: a ctypes struct's fields


@lru_cache(maxsize=1)
def _bind() -> tuple[Staging | None, Support]:
    from .native import lc  # the gate: CPU settings first, then llama.cpp

    missing = [name for name in _PUBLIC if not hasattr(lc, name)]  # library: what this llama-cpp-python declares
    if not _field(lc.llama_model_params, "load_mtp"):
        missing.append("llama_model_params.load_mtp")
    if not _field(lc.llama_context_params, "ctx_type"):
        missing.append("llama_context_params.ctx_type")
    if missing:
        version = getattr(lc, "__version__", "?")  # library: a build may not say
        return None, Support(False, f"llama-cpp-python {version} does not declare "
                                    f"{', '.join(missing)}: MTP drafting needs 0.3.36 or later.")
    lib = getattr(getattr(lc, "llama_cpp", None), "_lib", None)  # library: the loaded libllama, where it is exposed
    funcs, absent = {}, []
    for name, (argtypes, restype, mangled) in _STAGING.items():
        for symbol in (name, *mangled):
            func = getattr(lib, symbol, None) if lib is not None else None  # library: an exported symbol, or none
            if func is not None:
                func.argtypes, func.restype = argtypes, restype
                funcs[name] = func
                break
        else:
            absent.append(name)
    if absent:
        return None, Support(False, f"this llama.cpp does not export {', '.join(absent)}, "
                                    "which MTP drafting needs.")
    return Staging(funcs), Support(True)


def support() -> Support:
    """Whether this llama.cpp can run MTP heads, and if not, why (one sentence)."""
    return _bind()[1]


def staging() -> Staging:
    """The bound staging functions; raises ``RuntimeError`` with ``support().reason`` when absent."""
    funcs, ok = _bind()
    if funcs is None:
        raise RuntimeError(ok.reason)
    return funcs
