"""Bit for bit (issue 46): under the row-invariance switch of the llama.cpp that scripts/setup-env.sh
builds, a row's logits are the same whether it is decoded alone or in a pass of 2-64 rows, after a
prompt read whole or in pieces, at short and long cache lengths, so a verified draft takes exactly
plain decoding's token. Each check runs scripts/check_rows.py in a process of its own: ggml reads
the switch once, when llama.cpp loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from speculum.engine.llama import cpu_settings

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_rows.py"


def check(model: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), str(model), "--json", *args],
                          capture_output=True, text=True, timeout=900)
    assert done.stdout.strip(), done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def differing(report: dict) -> dict:
    return {name: c for name, c in report["checks"].items() if c["identical"] != c["rows"]}


def test_the_installed_llama_cpp_has_the_row_invariance_switch():
    assert cpu_settings.build_has_row_switch(), "llama-cpp-python was not built by scripts/setup-env.sh"


@pytest.mark.parametrize("which", ["smollm_path", "qwen_target_path"])
def test_rows_are_the_same_in_every_pass_size_and_prompt_chunking(which, request):
    model = request.getfixturevalue(which)
    report = check(model, "--exact", "--prompt-len", "24", "--gen", "64",
                   "--sizes", "1,2,3,4,5,8,16,64", "--chunks", "one,7")
    assert report["exact"] == "1" and report["switch_built"]
    assert len(report["checks"]) == 16
    assert differing(report) == {}


@pytest.mark.parametrize("which, flash", [("smollm_path", "on"), ("smollm_path", "off"), ("qwen_target_path", "off")])
def test_rows_are_the_same_past_512_cached_tokens(which, flash, request):
    """From 512 cached tokens flash attention splits the cache for a single row, and the prompt is
    read in several micro-batches: both are where a row's result could depend on its pass."""
    model = request.getfixturevalue(which)
    report = check(model, "--exact", "--prompt-len", "600", "--gen", "16", "--sizes", "1,16",
                   "--chunks", "200", "--flash-attn", flash)
    assert report["prompt_tokens"] >= 599
    assert differing(report) == {}


def test_rows_are_the_same_with_more_threads_than_heads(smollm_path):
    """A single row's attention goes to the threads a head at a time (the switch's sgemm-heads
    part); with more threads than SmolLM2's 9 heads each head's rows are cut into slices. Whatever
    the cut, each row must still be the one a pass of several rows computes."""
    report = check(smollm_path, "--exact", "--threads", "16", "--prompt-len", "300", "--gen", "16",
                   "--sizes", "1,2,16", "--chunks", "one,7")
    assert len(report["checks"]) == 6
    assert differing(report) == {}


def test_without_the_switch_the_demo_target_s_rows_depend_on_their_pass(qwen_target_path):
    """What the switch is for: as llama.cpp computes by default, the same row differs between
    passes (by a fraction of a logit, enough to turn a near tie)."""
    report = check(qwen_target_path, "--no-exact", "--prompt-len", "24", "--gen", "16", "--sizes", "4,8")
    assert report["exact"] == "0"
    assert differing(report), "rows were identical without the switch: the check may not see a difference"
