"""Shared fixtures: real GGUF models assembled from their PyPI packages (see scripts/test.sh)."""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# No engine process started by a test measures the tiled matmul in child processes when it is
# idle (engine/llama/tuning.py): it would run beside the tests. The tests of that measurement lift it.
os.environ["SPECULUM_NO_TUNING"] = "1"
sys.path.insert(0, str(Path(__file__).parent))

# Fixtures shared by several test files, each beside what it drives: a local Hub (``hub``), a
# served SmolLM2 (``decoder``, ``server``), the real window (``open_window``), RPC workers (``workers``).
pytest_plugins = ["hubserver", "live_server", "live_window", "rpc_workers"]

from speculum.models import bundled  # noqa: E402


def _model_path(model: bundled.BundledModel) -> Path:
    # Same code as `speculum models install-demo`: reuses a verified file, else assembles it.
    return bundled.assemble(model)


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return _model_path(bundled.SMOLLM2)


@pytest.fixture(scope="session")
def qwen_target_path() -> Path:
    return _model_path(bundled.QWEN_TARGET)


@pytest.fixture(scope="session")
def qwen_draft_path() -> Path:
    return _model_path(bundled.QWEN_DRAFT)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return _model_path(bundled.GEMMA3_270M)


@pytest.fixture(scope="session")
def smollm(smollm_path):
    from speculum.engine.llama.model import LlamaModel
    from speculum.engine.settings import LoadOptions

    model = LlamaModel(smollm_path, LoadOptions(n_ctx=2048))
    yield model
    model.close()


@pytest.fixture(scope="session")
def qwen_pair(qwen_target_path, qwen_draft_path):
    """A Decoder over the real Qwen2.5-Coder 1.5B / 0.5B pair, shared by the session."""
    from speculum.engine.loading import load_decoder
    from speculum.engine.settings import LoadOptions

    decoder = load_decoder(qwen_target_path, qwen_draft_path, LoadOptions(n_ctx=4096))
    yield decoder
    decoder.target.close()
    decoder.draft.close()


@pytest.fixture
def data_dirs(tmp_path, monkeypatch):
    """Private data/config folders so no test touches the user's real ones (models stay shared)."""
    monkeypatch.setenv("SPECULUM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPECULUM_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path
