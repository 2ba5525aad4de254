"""The llama.cpp backend on real GGUF weights."""

import subprocess
import sys

import numpy as np
import pytest

from speculum.engine.llama.model import LlamaModel, backend_label
from speculum.engine.settings import LoadOptions
from speculum.engine.vocabulary import Device
from speculum.errors import SpeculumError
from speculum.models.gguf import check_gguf_file
from ggufgen import write_gguf

# Batch-shape noise of Qwen2.5 Q4_K_M logits on CPU, measured here: max 0.86, mean 0.10
# between a batch of 8 and one token at a time (design notes: ~0.5 / ~0.07).
QWEN_MAX_NOISE = 1.5
QWEN_MEAN_NOISE = 0.2


def test_round_trip_with_emoji_and_cjk_split_across_tokens(smollm):
    text = "Speculum 🙂🚀 sees 你好世界, naïve café."
    tokens = smollm.tokenize(text)
    assert smollm.detokenize(tokens) == text
    pieces = [smollm.token_bytes(t) for t in tokens]
    split = [p for p in pieces if not _valid_utf8(p)]
    assert split, "some emoji/CJK character should be split across tokens"
    detok = smollm.detokenizer()
    streamed = [detok.feed(t) for t in tokens]
    assert "".join(streamed) + detok.flush() == text
    assert all("\ufffd" not in s for s in streamed)  # partial characters are held back


def _valid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_chat_template_from_gguf_metadata(smollm):
    assert smollm.chat_template and "im_start" in smollm.chat_template
    text = smollm.apply_chat_template([{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Hello there"}])
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "<|im_start|>user\nHello there<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    tokens = smollm.tokenize(text)
    assert tokens.count(smollm.tokenize("<|im_start|>")[0]) == 3  # special tokens parsed


def _batch_vs_single(model, tokens, start, n):
    model.reset()
    model.prefill(tokens[:start])
    batch = model.decode(tokens[start:start + n], rows=range(n)).copy()
    model.trim(start)
    single = np.stack([model.decode([t])[0].copy() for t in tokens[start:start + n]])
    model.trim(start)
    again = model.decode(tokens[start:start + n], rows=range(n)).copy()
    return batch, single, again


def test_batch_rows_equal_single_steps_smollm(smollm):
    tokens = smollm.tokenize(smollm.apply_chat_template([{"role": "user", "content": "Count from one to ten."}]))
    batch, single, again = _batch_vs_single(smollm, tokens, 6, 8)
    assert batch.shape == (8, smollm.n_vocab)
    assert np.abs(batch - single).max() <= 1e-4
    assert np.array_equal(batch, again)  # KV trim then re-decode reproduces the logits


def test_logits_rows_are_a_zero_copy_view_of_named_rows(smollm):
    smollm.reset()
    tokens = smollm.tokenize("The quick brown fox jumps")
    rows = smollm.decode(tokens, rows=[1, len(tokens) - 1])
    assert rows.shape == (2, smollm.n_vocab)
    assert not rows.flags.owndata  # a view into llama.cpp's buffer
    assert smollm.n_past == len(tokens)
    smollm.trim(2)
    assert smollm.n_past == 2


@pytest.mark.qwen
def test_batch_rows_match_single_steps_qwen(qwen_target_path):
    with LlamaModel(qwen_target_path, LoadOptions(n_ctx=512)) as model:
        tokens = model.tokenize(model.apply_chat_template(
            [{"role": "user", "content": "Write a function that reverses a linked list in C, with comments."}]))
        for start in (10, len(tokens) - 8):
            batch, single, again = _batch_vs_single(model, tokens, start, 8)
            assert (batch.argmax(1) == single.argmax(1)).all()
            diff = np.abs(batch - single)
            assert diff.max() < QWEN_MAX_NOISE and diff.mean() < QWEN_MEAN_NOISE
            assert np.array_equal(batch, again)
        assert model.facts.architecture == "qwen2"
        assert model.facts.quantization == "Q4_K_M"
        assert model.facts.vocab_size == 151936
        assert 1.4e9 < model.facts.n_parameters < 1.8e9
        assert model.facts.backend in ("CPU", "CUDA", "Metal")


def test_model_facts(smollm, smollm_path):
    f = smollm.facts
    assert (f.architecture, f.quantization, f.vocab_size) == ("llama", "Q4_1", 49152)
    assert f.file_size == smollm_path.stat().st_size
    assert f.context_length == 8192 and f.n_ctx == 2048
    assert 1.2e8 < f.n_parameters < 1.5e8


def test_context_full_is_a_clear_error(smollm):
    from speculum.errors import ContextFullError

    smollm.reset()
    with pytest.raises(ContextFullError, match="context"):
        smollm.prefill([smollm.bos] * (smollm.n_ctx + 1))
    assert smollm.n_past == 0


# --- bad GGUF input: one clear message, never a crash -------------------------------------

def bad_files(tmp_path, smollm_path):
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("these are my notes, not a model")
    truncated = tmp_path / "truncated.gguf"
    with open(smollm_path, "rb") as src:
        truncated.write_bytes(src.read(20_000_000))
    header_cut = tmp_path / "header_cut.gguf"
    with open(smollm_path, "rb") as src:
        header_cut.write_bytes(src.read(5000))
    alien = write_gguf(tmp_path / "alien.gguf", {"general.architecture": "speculum-alien",
                                                  "general.name": "alien"}, [("w", (16, 16))])
    return {
        "missing": (tmp_path / "nowhere.gguf", "not found"),
        "not GGUF": (not_gguf, "is not a GGUF model file"),
        "truncated": (truncated, "is truncated: it has 20,000,000 bytes but its tensors need 98,362,432"),
        "header cut": (header_cut, "is truncated: its GGUF header ends early"),
        "unknown architecture": (alien, "unknown model architecture: 'speculum-alien'"),
    }


def test_bad_gguf_gives_clear_messages(tmp_path, smollm_path):
    for case, (path, message) in bad_files(tmp_path, smollm_path).items():
        with pytest.raises(SpeculumError) as err:
            LlamaModel(path, LoadOptions(n_ctx=256))
        assert message in str(err.value), case
        assert "\n" not in str(err.value)
    # The header checks alone (before llama.cpp) catch all but the foreign architecture.
    alien = tmp_path / "alien.gguf"
    assert check_gguf_file(alien).architecture == "speculum-alien"


def test_cli_bad_gguf_is_one_line_and_exit_2(tmp_path, smollm_path):
    for case, (path, message) in bad_files(tmp_path, smollm_path).items():
        proc = subprocess.run([sys.executable, "-m", "speculum.cli", "generate", "--target", str(path),
                               "--max-tokens", "4", "hi"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (case, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("speculum: ") and message in lines[0], (case, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_where_a_model_runs_is_an_enum_and_the_label_shown_is_made_from_it():
    """Code routes on ``ModelFacts.device``; ``backend`` is only words for the user."""
    assert Device.of_gpu("Metal") is Device.METAL and Device.of_gpu("cuda") is Device.CUDA
    assert Device.of_gpu("Kompute") is Device.GPU  # a GPU backend not named: its label keeps ggml's name
    assert Device.of_gpu("RPC") is Device.GPU and Device.of_gpu("CPU") is Device.GPU  # (never from a GPU's name)
    assert backend_label(Device.GPU, "Kompute", ()) == "Kompute"
    assert backend_label(Device.CPU, "CUDA", ()) == "CPU"  # a GPU build with no layer on it
    assert backend_label(Device.RPC, None, ("10.0.0.2:50052",)) == "RPC 10.0.0.2:50052"
    assert backend_label(Device.RPC, "CUDA", ("10.0.0.2:50052",)) == "RPC 10.0.0.2:50052 + CUDA"
