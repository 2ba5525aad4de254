"""The models the pair picker offers: the demo pair when installed, then every GGUF in the library."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ... import paths
from ...models.commands import human_bytes


@dataclass(frozen=True)
class ModelChoice:
    label: str
    path: str


def _size(path: Path) -> str:
    try:
        return human_bytes(path.stat().st_size)  # as the models dialog shows sizes
    except OSError:
        return "missing"


def local_models() -> list[ModelChoice]:
    choices: list[ModelChoice] = []
    seen: set[str] = set()
    try:
        from ...models import bundled

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
