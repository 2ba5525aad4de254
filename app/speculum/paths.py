"""Where Speculum keeps things: models, settings, conversations, bundled resources.

Every folder can be moved with an environment variable, so tests and portable
installs never touch the user's real library.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import platformdirs

APP_NAME = "Speculum"


def data_dir() -> Path:
    """User data folder (conversations, remembered measurements)."""
    env = os.environ.get("SPECULUM_DATA_DIR")
    return Path(env) if env else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def models_dir() -> Path:
    """Local model library: GGUF files live here."""
    env = os.environ.get("SPECULUM_MODELS_DIR")
    return Path(env) if env else data_dir() / "models"


def config_dir() -> Path:
    """Settings folder."""
    env = os.environ.get("SPECULUM_CONFIG_DIR")
    return Path(env) if env else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def resources_dir() -> Path:
    """The `resources/` folder: in a source checkout, an installed share dir, or a bundle."""
    candidates = []
    bundle = getattr(sys, "_MEIPASS", None)  # platform: set inside a PyInstaller bundle
    if bundle:
        candidates.append(Path(bundle) / "resources")
    candidates.append(Path(__file__).resolve().parents[2] / "resources")
    candidates.append(Path(sys.prefix) / "share" / "speculum" / "resources")
    for path in candidates:
        if path.is_dir():
            return path
    return candidates[0]


def resource(name: str) -> Path:
    return resources_dir() / name


def write_json_atomic(path: Path, obj, indent: int | None = None) -> None:
    """Write ``obj`` as JSON so that a crash or kill leaves the old file or the new one, never half."""
    write_text_atomic(path, json_text(obj, indent))


def json_text(obj, indent: int | None = None) -> str:
    """``obj`` as the JSON our files hold: UTF-8 as it is, compact unless indented."""
    # dumps, not dump: dump streams through the pure-Python encoder, ten times slower.
    return json.dumps(obj, ensure_ascii=False, indent=indent, separators=None if indent is not None else (",", ":"))


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` so that a crash or kill leaves the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- saved files from another version, a crash or a hand edit ---------------------------------

# What was set aside since this process started, in plain words; the window says so once.
set_aside_notices: list[str] = []


def set_aside(path: Path, why: str, keep_original: bool = False) -> None:
    """Keep a damaged saved file as ``<name>.bad`` beside it, and note it for the user.

    ``keep_original``: the valid part of the file is still in use, so copy rather than move.
    """
    bad = path.with_name(path.name + ".bad")
    try:
        if keep_original:
            shutil.copyfile(path, bad)
        else:
            os.replace(path, bad)
    except OSError:
        pass
    set_aside_notices.append(f"{path.name}: {why}; kept as {bad.name}")


def read_json_object(path: Path) -> dict | None:
    """A saved JSON object; None when the file is missing, or damaged or of another shape (set aside)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        set_aside(path, f"could not be read ({exc.__class__.__name__})")
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        set_aside(path, "not valid JSON")
        return None
    if not isinstance(obj, dict):
        set_aside(path, f"a JSON {type(obj).__name__}, not an object")
        return None
    return obj
