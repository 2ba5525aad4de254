"""Writing small GGUF files for tests: foreign architectures, damaged headers."""

from __future__ import annotations

import struct
from pathlib import Path


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path: Path, metadata: dict[str, str | int], tensors: list[tuple[str, tuple[int, ...]]]) -> Path:
    """A GGUF v3 file with string/uint32 metadata and F32 tensors filled with zeros."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)))
    for key, value in metadata.items():
        out += _str(key)
        if isinstance(value, str):
            out += struct.pack("<I", 8) + _str(value)
        else:
            out += struct.pack("<II", 4, value)
    offset = 0
    sizes = []
    for name, shape in tensors:
        out += _str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", 0, offset)  # F32
        n = 4
        for d in shape:
            n *= d
        sizes.append(n)
        offset += (n + 31) // 32 * 32
    out += b"\0" * (-len(out) % 32)
    for n in sizes:
        out += b"\0" * ((n + 31) // 32 * 32)
    path.write_bytes(bytes(out))
    return path


# ---- typed headers, for hostile and fuzzed input -------------------------------------------------

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_FMT = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
        BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}


def encode_value(vtype: int, value) -> bytes:
    """One metadata value; an array is ``(element_type, items)``."""
    if vtype in _FMT:
        return struct.pack(_FMT[vtype], value)
    if vtype == STRING:
        return _str(value) if isinstance(value, str) else struct.pack("<Q", len(value)) + value
    if vtype == ARRAY:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(encode_value(etype, v) for v in items)
    raise ValueError(vtype)


def gguf_bytes(kv: list[tuple[str, int, object]], tensors: list[tuple[str, tuple[int, ...], int, int]] = (),
               version: int = 3, n_kv: int | None = None, n_tensors: int | None = None) -> bytes:
    """A GGUF header from typed metadata ``(key, type, value)`` and tensor infos ``(name, shape, ggml
    type, offset)``; the counts can be made to lie."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                          len(kv) if n_kv is None else n_kv))
    for key, vtype, value in kv:
        out += _str(key) + struct.pack("<I", vtype) + encode_value(vtype, value)
    for name, shape, ggml_type, offset in tensors:
        out += _str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", ggml_type, offset)
    return bytes(out)


def nested_arrays(depth: int) -> bytes:
    """A header whose one value is ``depth`` arrays, each holding the next (24 kB for 2,000)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _str("x") + struct.pack("<I", ARRAY)
    return head + struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQ", UINT8, 0)
