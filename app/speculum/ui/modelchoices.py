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
def _drafting(path: str, mtime_ns: int, size: int) -> tuple[int, str]:
    from ..models.gguf import check_gguf_file

    try:
        header = check_gguf_file(path)
        return header.nextn_layers, header.assistant_for
    except Exception:  # unreadable or not GGUF: loading it will say why
        return 0, ""


def _drafting_of(path: str | Path) -> tuple[int, str]:
    try:
        st = Path(path).stat()
    except OSError:
        return 0, ""
    return _drafting(str(path), st.st_mtime_ns, st.st_size)


def nextn_layers(path: str | Path) -> int:
    """The NextN (MTP) layers a model file carries, from its header (0: none, or unreadable)."""
    return _drafting_of(path)[0]


def is_assistant(path: str | Path) -> bool:
    """Whether the file is a Gemma 4 assistant: a draft that runs as its target's MTP head."""
    return bool(_drafting_of(path)[1])


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
