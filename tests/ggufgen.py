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
