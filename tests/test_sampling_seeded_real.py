"""A seed holds at T = 0.8 on real models (issue 46 point 2, issue 48 point 6): every mode's answer
equals its own rerun and plain decoding's for that seed (drafter-invariant sampling). SmolLM2 with
flash attention, whose rows are the same whatever their pass, for the drafters that copy (prompt
lookup, the n-gram memory, Predicted Outputs, under a grammar too); the Qwen2.5-Coder pair for the
draft model, in a process of its own under the row-invariance switch (--exact: ggml reads it once,
when llama.cpp loads, and this process may have loaded it without)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from speculum.engine.grammar.schema import grammar_for_response_format
from speculum.engine.loading import load_decoder
from speculum.engine.sampling import Coupling, SamplingParams
from speculum.engine.settings import LoadOptions
from speculum.engine.vocabulary import Source

SEEDED = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
COPY = ("Repeat this list exactly, then add one more line in the same style:\n"
        "- apples: 3 crates, stored in the north barn\n- pears: 5 crates, stored in the north barn\n"
        "- plums: 2 crates, stored in the south barn\n- figs: 4 crates, stored in the south barn\n")
SCHEMA = {"type": "object", "properties": {"fruit": {"type": "string"}, "crates": {"type": "integer"}},
          "required": ["fruit", "crates"]}


@pytest.fixture(scope="module")
def smol(smollm_path, tmp_path_factory):
    # The memory's file in a folder of this module's own (the user's data folder is never touched).
    import os

    os.environ["SPECULUM_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))
    try:
        d = load_decoder(smollm_path, None, LoadOptions(n_ctx=1024, flash_attn=True, prompt_cache_mib=64))
    finally:
        del os.environ["SPECULUM_DATA_DIR"]
    yield d
    d.target.close()


def prompt_of(decoder, text: str) -> list[int]:
    return decoder.target.tokenize(decoder.target.apply_chat_template([{"role": "user", "content": text}]))


def run(decoder, prompt, **kw):
    cycles = list(decoder.generate(prompt, max_tokens=64, sampling=kw.pop("sampling", SEEDED), **kw))
    return [t for c in cycles for t in c.emitted], cycles


def kept(cycles, source: Source) -> int:
    return sum(c.n_accepted for c in cycles if c.source == source)


def test_copying_modes_write_plain_decoding_s_answer_for_a_seed(smol):
    prompt = prompt_of(smol, COPY)
    plain, _ = run(smol, prompt)
    assert run(smol, prompt)[0] == plain  # Off's own rerun
    other, _ = run(smol, prompt, sampling=SamplingParams(temperature=0.8, top_p=0.95, seed=8))
    assert other != plain  # the seed is what holds it (not a near-greedy answer)
    copied = 0
    for mode in ("lookup", "auto"):
        for _ in range(2):  # and its own rerun (auto's choices follow its timings)
            answer, cycles = run(smol, prompt, policy=mode)
            assert answer == plain, mode
            copied += kept(cycles, Source.LOOKUP)
    assert copied > 0
    # Predicted Outputs: a prediction that is Off's answer is copied whole; a wrong one changes nothing.
    answer, cycles = run(smol, prompt, policy="auto", prediction=plain)
    assert answer == plain and kept(cycles, Source.PREDICTION) >= len(plain) // 2
    answer, _ = run(smol, prompt, policy="lookup", prediction=other)
    assert answer == plain


def test_a_seeded_answer_asked_again_is_copied_whole_from_the_n_gram_memory(smol):
    prompt = prompt_of(smol, "Tell a very short story about a lighthouse keeper.")
    plain, _ = run(smol, prompt, origin="c1")  # remembered once the answer is out
    assert smol.calibrate()  # auto mode's costs, measured as while the engine waits
    answer, cycles = run(smol, prompt, policy="auto", origin="c1")
    assert answer == plain
    assert kept(cycles, Source.MEMORY) >= len(plain) // 2, [(c.source, len(c.drafted), c.n_accepted) for c in cycles]
    # Rejection sampling, for contrast: one stream of draws spent as the drafts go.
    rejection = SamplingParams(temperature=0.8, top_p=0.95, seed=7, coupling=Coupling.REJECTION)
    assert run(smol, prompt, sampling=rejection)[0] != plain


def test_a_grammar_constrained_answer_is_plain_decoding_s_for_a_seed(smol):
    grammar = grammar_for_response_format({"type": "json_schema", "json_schema": {"name": "f", "schema": SCHEMA}})
    prompt = prompt_of(smol, "Give one fruit from this list and its crates as JSON.\n" + COPY)
    plain, _ = run(smol, prompt, grammar=grammar)
    value = json.loads(smol.target.detokenize([t for t in plain if not smol.target.is_eog(t)]))
    assert set(value) == {"fruit", "crates"}
    for mode in ("lookup", "auto", "lookup"):
        assert run(smol, prompt, grammar=grammar, policy=mode)[0] == plain, mode


# The Qwen pair, draft mode, in a process started under the row-invariance switch.
DRAFT_MODE = r"""
import json, sys
from speculum.engine.llama import cpu_settings
cpu_settings.choose_exact(True)
from speculum.engine.loading import load_decoder
from speculum.engine.sampling import SamplingParams
from speculum.engine.settings import LoadOptions

decoder = load_decoder(sys.argv[1], sys.argv[2], LoadOptions(n_ctx=1024))
prompt = decoder.target.tokenize(decoder.target.apply_chat_template(
    [{"role": "user", "content": "Suggest a name for a small Python library that parses dates, and say why in two sentences."}]))
out = {}
for seed in (7, 8):
    sampling = SamplingParams(temperature=0.8, seed=seed)
    for name, mode, k in (("off", "off", None), ("draft", "draft", None), ("draft again", "draft", None),
                          ("draft k=6", "draft", 6)):
        cycles = list(decoder.generate(prompt, max_tokens=48, sampling=sampling, policy=mode, k=k))
        out[f"{name} {seed}"] = {"tokens": [t for c in cycles for t in c.emitted],
                                 "drafted": sum(len(c.drafted) for c in cycles),
                                 "accepted": sum(c.n_accepted for c in cycles)}
print(json.dumps(out))
"""


def test_draft_mode_on_the_demo_pair_writes_plain_decoding_s_answer_for_a_seed(qwen_target_path, qwen_draft_path):
    done = subprocess.run([sys.executable, "-c", DRAFT_MODE, str(qwen_target_path), str(qwen_draft_path)],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for seed in (7, 8):
        plain = out[f"off {seed}"]["tokens"]
        assert len(plain) > 20
        for name in ("draft", "draft again", "draft k=6"):
            run = out[f"{name} {seed}"]
            assert run["tokens"] == plain, (name, seed)
            assert run["drafted"] > 0 and run["accepted"] > 0, (name, seed, run)  # (drafts kept and refused)
    assert out["off 7"]["tokens"] != out["off 8"]["tokens"]
