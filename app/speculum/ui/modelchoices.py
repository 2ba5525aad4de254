"""The models the pair picker offers: the demo pair when installed, then every GGUF in the library."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .. import paths
from ..models.commands import human_bytes


@dataclass(frozen=True)
class ModelChoice:
    label: str
    path: str


def _size(path: Path) -> str:
    try:
        return human_bytes(path.stat().st_size)  # as the models dialog shows sizes
    except OSError:
        return "missing"


@lru_cache(maxsize=256)
def _nextn(path: str, mtime_ns: int, size: int) -> int:
    from ..models.gguf import check_gguf_file

    try:
        return check_gguf_file(path).nextn_layers
    except Exception:  # unreadable or not GGUF: loading it will say why
        return 0


def nextn_layers(path: str | Path) -> int:
    """The NextN (MTP) layers a model file carries, from its header (0: none, or unreadable)."""
    try:
        st = Path(path).stat()
    except OSError:
        return 0
    return _nextn(str(path), st.st_mtime_ns, st.st_size)


def local_models() -> list[ModelChoice]:
    choices: list[ModelChoice] = []
    seen: set[str] = set()
    try:
        from ..models import bundled

        for model, role in ((bundled.QWEN_TARGET, "demo target"), (bundled.QWEN_DRAFT, "demo draft")):
            path = bundled.installed_path(model)
            if path is not None:
                choices.append(ModelChoice(f"{path.stem} ({role})", str(path)))
                seen.add(str(path.resolve()))
    except Exception:  # the demo pair is optional; a broken install must not hide the library
        pass
    folder = paths.models_dir()
    if folder.is_dir():
        for path in sorted(folder.glob("*.gguf"), key=lambda p: p.name.lower()):
            if str(path.resolve()) not in seen:
                choices.append(ModelChoice(f"{path.stem}  ·  {_size(path)}", str(path)))
                seen.add(str(path.resolve()))
    return choices
