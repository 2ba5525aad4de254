"""The demo pair the benchmark scripts default to: the README's test command downloads it."""

from __future__ import annotations

import os
from pathlib import Path

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def demo_pair(target: str | None, draft: str | None, alone: bool = True) -> tuple[str, str | None]:
    """The paths to use: those given; else the demo pair from SPECULUM_MODELS_DIR (the test
    cache by default). A target given alone runs alone, unless ``alone`` is False (a script
    that needs a draft model): then it gets the demo draft."""
    models = Path(os.environ.get("SPECULUM_MODELS_DIR", Path.home() / ".cache/speculum-dev/models"))
    if target and (draft or alone):
        return target, draft
    return target or str(models / TARGET), draft or str(models / DRAFT)
