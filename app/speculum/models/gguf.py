"""Reading a GGUF header without llama.cpp.

Used before a file is handed to llama.cpp (so a truncated or foreign file gives a
clear message instead of a crash), and by the pair-compatibility check, which can
read a remote header through HTTP range requests: the reader only needs
``read_at(offset, size) -> bytes``.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import SpeculumError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types.
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = range(13)
_SCALAR = {
    _UINT8: "<B", _INT8: "<b", _UINT16: "<H", _INT16: "<h", _UINT32: "<I", _INT32: "<i",
    _FLOAT32: "<f", _BOOL: "<?", _UINT64: "<Q", _INT64: "<q", _FLOAT64: "<d",
}

# ggml tensor types: id -> (name, elements per block, bytes per block).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}

# llama.cpp's general.file_type values, for naming a file's quantization.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}

# Arrays are skipped unless their key is listed here: a vocabulary of 150k strings
# is parsed only when a compatibility check needs it.
VOCAB_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")
# Drafters that run on their target's KV cache (Gemma 4's assistant): a draft, never a target.
ASSISTANT_ARCHS = {"gemma4-assistant": "gemma4"}  # architecture -> the targets' architecture


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the start of the data section

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        _, block, size = GGML_TYPES[self.ggml_type]
        return self.n_elements // block * size


@dataclass
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    array_lengths: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name", ""))

    @property
    def quantization(self) -> str:
        ft = self.metadata.get("general.file_type")
        return FILE_TYPES.get(ft, f"type {ft}") if ft is not None else "unknown"

    @property
    def vocab_size(self) -> int:
        return self.array_lengths.get("tokenizer.ggml.tokens", 0)

    @property
    def context_length(self) -> int:
        return int(self.metadata.get(f"{self.architecture}.context_length", 0))

    @property
    def assistant_for(self) -> str:
        """The target architecture this file assists ("": it is no assistant)."""
        return ASSISTANT_ARCHS.get(self.architecture, "")

    @property
    def nextn_layers(self) -> int:
        """Multi-token prediction (NextN) layers the model carries: its own drafter (0: none;
        an assistant's layers draft for another model). A hostile value (a string, negative,
        huge) counts as none."""
        if self.assistant_for:
            return 0
        n = self.metadata.get(f"{self.architecture}.nextn_predict_layers", 0)
        return n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 64 else 0

    @property
    def n_parameters(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def required_size(self) -> int:
        """Bytes the file must have for every tensor's data to be present."""
        end = max((t.offset + t.nbytes for t in self.tensors), default=0)
        return self.data_offset + end


# Caps on what a header may claim, far above any real model (a 262k vocabulary with its merges
# is ~10 MB of header) and far below what would exhaust memory or time: a hostile or damaged
# file ends in one clear message, whatever its counts say.
MAX_HEADER_BYTES = 64 << 20  # metadata and tensor infos together
MAX_STRING_BYTES = 16 << 20  # one string (a chat template is ~10 kB)
MAX_ARRAY_ITEMS = 1 << 21  # one array (vocabularies are up to ~262k tokens, merges ~500k)
MAX_VALUES = 1 << 21  # strings and arrays decoded one by one, in the whole header
MAX_NESTING = 2  # arrays of arrays; GGUF writers never nest deeper
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 20
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_READ = 1 << 20  # one request to ``read_at``: never ask a Hub server for gigabytes


class _Cursor:
    """Sequential reader over ``read_at`` that fetches in chunks of at most ``MAX_READ``."""

    def __init__(self, read_at: Callable[[int, int], bytes], chunk: int = MAX_READ):
        self._read_at = read_at
        self._chunk = min(chunk, MAX_READ)
        self._buf = b""
        self._buf_start = 0
        self.pos = 0
        self.fetched = 0
        self.values = 0  # strings and arrays decoded so far

    def _within(self, n: int) -> None:
        if self.pos + n > MAX_HEADER_BYTES:
            raise ValueError(f"its header claims more than {MAX_HEADER_BYTES >> 20} MB")

    def take(self, n: int) -> bytes:
        self._within(n)
        rel = self.pos - self._buf_start
        if rel + n > len(self._buf):
            pieces = [self._buf[rel:]]
            have = len(pieces[0])
            while have < n:
                more = self._read_at(self.pos + have, self._chunk)
                if not more:
                    raise EOFError
                self.fetched += len(more)
                pieces.append(more)
                have += len(more)
            self._buf = b"".join(pieces)
            self._buf_start = self.pos
            rel = 0
        out = self._buf[rel:rel + n]
        self.pos += n
        return out

    def skip(self, n: int) -> None:
        """Step over ``n`` bytes without fetching them (a file's end shows at the next read)."""
        self._within(n)
        self.pos += n

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, what: str, n: int, limit: int) -> int:
        if n > limit:
            raise ValueError(f"it claims {n:,} {what}, more than the {limit:,} Speculum accepts")
        return n

    def string_bytes(self) -> bytes:
        self.values += 1
        if self.values > MAX_VALUES:
            raise ValueError(f"its header holds more than {MAX_VALUES:,} values")
        return self.take(self.count("bytes in one string", self.unpack("<Q"), MAX_STRING_BYTES))

    def string(self) -> str:
        return self.string_bytes().decode("utf-8", errors="replace")


def _value(cur: _Cursor, vtype: int, keep: bool, depth: int = 0) -> tuple[Any, int]:
    if vtype in _SCALAR:
        return cur.unpack(_SCALAR[vtype]), 1
    if vtype == _STRING:
        return cur.string(), 1
    if vtype == _ARRAY:
        if depth >= MAX_NESTING:
            raise ValueError(f"it nests arrays more than {MAX_NESTING} deep")
        cur.values += 1
        etype = cur.unpack("<I")
        count = cur.count("array items", cur.unpack("<Q"), MAX_ARRAY_ITEMS)
        if etype in _SCALAR:
            fmt = _SCALAR[etype]
            size = struct.calcsize(fmt) * count
            if not keep:
                cur.skip(size)
                return None, count
            return list(struct.unpack(f"<{count}{fmt[1]}", cur.take(size))), count
        if etype == _STRING and not keep:  # a vocabulary nobody asked for: step over, don't decode
            for _ in range(count):
                cur.string_bytes()
            return None, count
        if etype not in (_STRING, _ARRAY):
            raise ValueError(f"unknown metadata type {etype}")
        items = []
        for _ in range(count):
            item, _n = _value(cur, etype, keep, depth + 1)
            if keep:
                items.append(item)
        return (items if keep else None), count
    raise ValueError(f"unknown metadata type {vtype}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_metadata(metadata: dict[str, Any]) -> None:
    """Keys Speculum reads must have the type llama.cpp expects; a wrong one is a damaged header."""
    arch = metadata.get("general.architecture", "unknown")
    if not isinstance(arch, str):
        raise ValueError("general.architecture is not text")
    for key in ("general.name", "tokenizer.ggml.model"):
        if key in metadata and not isinstance(metadata[key], str):
            raise ValueError(f"{key} is not text")
    for key in ("general.file_type", f"{arch}.context_length", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id"):
        if key in metadata and not _is_int(metadata[key]):
            raise ValueError(f"{key} is not a whole number")
    for key in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"):
        if key in metadata and not isinstance(metadata[key], bool):
            raise ValueError(f"{key} is not true or false")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
        raise ValueError("tokenizer.ggml.tokens is not a list of texts")
    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not _is_int(align) or align <= 0 or align & (align - 1) or align > MAX_READ:
        raise ValueError(f"general.alignment is {str(align)[:40]!r}, not a power of two")


def read_header(read_at: Callable[[int, int], bytes], source: str = "file",
                keep_arrays: Iterable[str] = ()) -> GGUFHeader:
    """Parse a GGUF header. Raises SpeculumError naming ``source`` when it is not GGUF or is damaged."""
    keep = set(keep_arrays)
    cur = _Cursor(read_at)
    try:
        if cur.take(4) != GGUF_MAGIC:
            raise SpeculumError(f"{source} is not a GGUF model file (it does not start with 'GGUF').")
        version = cur.unpack("<I")
        if version not in (2, 3):
            raise SpeculumError(f"{source} uses GGUF version {version}, which Speculum cannot read.")
        n_tensors = cur.count("tensors", cur.unpack("<Q"), MAX_TENSORS)
        n_kv = cur.count("metadata keys", cur.unpack("<Q"), MAX_KV)
        metadata: dict[str, Any] = {}
        lengths: dict[str, int] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.unpack("<I")
            value, count = _value(cur, vtype, key in keep)
            if vtype == _ARRAY:
                lengths[key] = count
            if value is not None:
                metadata[key] = value
        _check_metadata(metadata)
        tensors = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.count("dimensions", cur.unpack("<I"), MAX_DIMS)
            shape = tuple(cur.unpack("<Q") for _ in range(n_dims))
            ggml_type = cur.unpack("<I")
            offset = cur.unpack("<Q")
            if ggml_type not in GGML_TYPES:
                raise SpeculumError(
                    f"{source} has tensor '{name[:80]}' of ggml type {ggml_type}, unknown to Speculum."
                )
            tensors.append(TensorInfo(name, shape, ggml_type, offset))
    except EOFError:
        raise SpeculumError(f"{source} is truncated: its GGUF header ends early.") from None
    except (ValueError, UnicodeDecodeError, struct.error, OverflowError, MemoryError) as exc:
        raise SpeculumError(f"{source} has a damaged GGUF header ({exc}).") from None
    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    data_offset = (cur.pos + align - 1) // align * align
    return GGUFHeader(version, metadata, tensors, data_offset, lengths, cur.fetched)


def _file_reader(path: Path) -> Callable[[int, int], bytes]:
    """``read_at`` over a local file: os.pread where the OS has it (Unix), else seek and read
    under a lock (Windows), so two threads sharing the reader never mix their positions."""
    f = open(path, "rb", buffering=0)
    pread = getattr(os, "pread", None)  # platform: not on Windows
    lock = threading.Lock()

    def read_at(offset: int, size: int) -> bytes:
        if pread is not None:
            return pread(f.fileno(), size, offset)
        with lock:
            f.seek(offset)
            return f.read(size)

    read_at.close = f.close  # type: ignore[attr-defined]
    return read_at


def read_file_header(path: str | os.PathLike, keep_arrays: Iterable[str] = ()) -> GGUFHeader:
    path = Path(path)
    if not path.exists():
        raise SpeculumError(f"Model file not found: {path}")
    if not path.is_file():
        raise SpeculumError(f"{path} is not a file.")
    reader = _file_reader(path)
    try:
        return read_header(reader, source=str(path), keep_arrays=keep_arrays)
    except PermissionError:
        raise SpeculumError(f"Cannot read {path}: permission denied.") from None
    finally:
        reader.close()  # type: ignore[attr-defined]


def check_gguf_file(path: str | os.PathLike, keep_arrays: Iterable[str] = ()) -> GGUFHeader:
    """Header and length checks that must pass before llama.cpp sees the file."""
    header = read_file_header(path, keep_arrays)
    size = Path(path).stat().st_size
    need = header.required_size
    if size < need:
        raise SpeculumError(
            f"{path} is truncated: it has {size:,} bytes but its tensors need {need:,}. "
            "Download it again."
        )
    if not header.tensors:
        raise SpeculumError(f"{path} holds no tensors, so it is not a usable model.")
    return header


def nextn_layers(path: str | os.PathLike) -> int:
    """The NextN (MTP) layers a model file carries, from its header (0: none, or unreadable).
    Remembered per file version: the pair picker and the library ask on every refresh."""
    return _drafting_of(path)[0]


def is_assistant(path: str | os.PathLike) -> bool:
    """Whether the file is a Gemma 4 assistant: a draft that runs as its target's MTP head."""
    return bool(_drafting_of(path)[1])


def _drafting_of(path: str | os.PathLike) -> tuple[int, str]:
    try:
        st = Path(path).stat()
    except OSError:
        return 0, ""
    return _drafting(str(path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=256)
def _drafting(path: str, mtime_ns: int, size: int) -> tuple[int, str]:
    """(NextN layers, the architecture it assists) of one file version."""
    try:
        header = check_gguf_file(path)
        return header.nextn_layers, header.assistant_for
    except (SpeculumError, OSError, ValueError):  # unreadable or not GGUF: loading it will say why
        return 0, ""
