"""Speculum's build says from how many rows ggml's tiled K-quant matmul is taken
(GGML_CPU_TILED_MM_MIN_ROWS, packaging/llama_cpp_source.py), so that on CPUs where verification
passes run faster without it, prompt chunks still take it. Each setting in a process of its own
(ggml reads it once); the rows compared bit for bit, which shows which kernel computed them."""

import json
import os
import subprocess
import sys

from speculum.engine.llama import cpu_settings

CHILD = r"""
import hashlib, json, sys
import numpy as np
from speculum.engine.llama.model import LlamaModel
from speculum.engine.settings import LoadOptions

model = LlamaModel(sys.argv[1], LoadOptions(n_ctx=512, n_threads=2), verifies=True)
tokens = model.tokenize("def scale(values, factor):\n    return [v * factor for v in values]\n\n" * 20)
passed = np.array(model.decode(tokens[:8], rows=range(8)))  # a verification pass: every row
model.trim(0)
chunk = np.array(model.decode(tokens[:128], rows=(127,)))  # a prompt chunk: its last row
print(json.dumps({"pass": hashlib.sha1(passed.tobytes()).hexdigest(), "chunk": hashlib.sha1(chunk.tobytes()).hexdigest()}))
"""


def _rows(model, **setting) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (cpu_settings.TILED_MATMUL, cpu_settings.TILED_MIN_ROWS)}
    env[cpu_settings.ROW_INVARIANT] = "0"  # (the exact switch turns the tiled matmul off altogether)
    env.update(setting)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(model)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_prompt_chunks_only_takes_the_tiled_matmul_in_chunks_and_not_in_passes(gemma_path):
    # Gemma 3 270M Q4_K_M: its Q6_K matrices are not repacked, so they take the tiled path
    assert cpu_settings.build_has_tiled_rows()
    off = _rows(gemma_path, GGML_CPU_TILED_MM="0")
    on = _rows(gemma_path, GGML_CPU_TILED_MM="1")
    assert off["pass"] != on["pass"] and off["chunk"] != on["chunk"]  # the two kernels differ here
    chunks_only = _rows(gemma_path, **cpu_settings.tiled_environment("0"))
    assert chunks_only == {"pass": off["pass"], "chunk": on["chunk"]}
