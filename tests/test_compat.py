"""Pair compatibility from GGUF metadata: real models on disk, and the same files read over HTTP ranges."""

from __future__ import annotations

import pytest

from hubserver import make_gguf
from speculum.cli import main
from speculum.models import bundled
from speculum.models.compat import check_files
from speculum.models.gguf import VOCAB_KEYS, read_file_header
from speculum.models.remote import HubRef, check_sources, parse_source

MiB = 1 << 20
HEADER_BUDGET = 16 * MiB  # the Qwen header (vocab + merges) is ~6 MB; the 1.1 GB file must not be read


@pytest.fixture
def real(qwen_target_path, qwen_draft_path, gemma_path, smollm_path):
    return {"qwen-target": qwen_target_path, "qwen-draft": qwen_draft_path,
            "gemma": gemma_path, "smollm": smollm_path}


def test_qwen_pair_is_compatible(real):
    verdict = check_files(real["qwen-target"], real["qwen-draft"])
    assert verdict.ok
    assert verdict.reason == "Compatible: both use the gpt2 tokenizer with 151,936 shared tokens."


def test_qwen_and_gemma_are_refused_for_their_tokenizers(real):
    verdict = check_files(real["qwen-target"], real["gemma"])
    assert not verdict.ok
    assert "tokenizer types differ ('gpt2' vs 'llama')" in verdict.reason


def test_qwen_and_smollm_are_refused_for_their_special_tokens(real):
    verdict = check_files(real["qwen-target"], real["smollm"])
    assert not verdict.ok
    assert "BOS token differs (151643 vs 1)" in verdict.reason


def test_vocab_size_and_token_text_rules(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(make_gguf(MiB, 1, vocab=400))
    b.write_bytes(make_gguf(MiB, 2, vocab=272))  # 128 fewer: the most llama.cpp allows
    assert check_files(a, b).ok
    b.write_bytes(make_gguf(MiB, 2, vocab=271))
    assert "vocabulary sizes differ by 129 tokens" in check_files(a, b).reason


def test_cli_check_exit_codes_and_reasons(real, capsys, tmp_path):
    assert main(["models", "check", str(real["qwen-target"]), str(real["qwen-draft"])]) == 0
    assert "Compatible" in capsys.readouterr().out
    assert main(["models", "check", str(real["qwen-target"]), str(real["gemma"])]) == 1
    assert "tokenizer types differ" in capsys.readouterr().out
    assert main(["models", "check", str(real["qwen-target"]), str(real["smollm"])]) == 1
    assert "BOS token differs" in capsys.readouterr().out

    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello")
    assert main(["models", "check", str(real["qwen-target"]), str(not_gguf)]) == 2
    assert "is not a GGUF model file" in capsys.readouterr().err
    assert main(["models", "check", str(tmp_path / "missing.gguf"), str(real["qwen-draft"])]) == 2
    assert "Model file not found" in capsys.readouterr().err


def _serve_real(hub, real):
    refs = {}
    for key, model in (("qwen-target", bundled.QWEN_TARGET), ("qwen-draft", bundled.QWEN_DRAFT),
                       ("gemma", bundled.GEMMA3_270M), ("smollm", bundled.SMOLLM2)):
        repo = f"test-org/{key}-GGUF"
        hub.add_file(repo, model.filename, real[key], model.sha256)
        refs[key] = HubRef(repo, model.filename)
    return refs


def test_remote_check_gives_the_same_answers_reading_only_the_headers(hub, real):
    refs = _serve_real(hub, real)
    read = {}

    def note(source, header):
        read[source] = header.bytes_read

    for pair in (("qwen-target", "qwen-draft"), ("qwen-target", "gemma"), ("qwen-target", "smollm")):
        local = check_files(real[pair[0]], real[pair[1]])
        remote = check_sources(refs[pair[0]], refs[pair[1]], on_header=note)
        assert (remote.ok, remote.reason) == (local.ok, local.reason)

    for key, ref in refs.items():
        size = real[key].stat().st_size
        assert 0 < read[ref] <= HEADER_BUDGET and read[ref] < size / 10
        blob_sha = hub.repos[ref.repo][ref.path].sha256
        assert hub.bytes_sent(blob_sha) <= 3 * HEADER_BUDGET  # what the server actually sent, all checks
    # every byte came through range requests
    assert all(r.range and r.status == 206 for r in hub.requests("GET", "cdn"))
    # and the headers match what the local reader sees
    local = read_file_header(real["gemma"], VOCAB_KEYS)
    assert read[refs["gemma"]] == local.bytes_read


def test_cli_check_remote_files(hub, real, capsys):
    refs = _serve_real(hub, real)
    assert main(["models", "check", str(refs["qwen-target"]), str(refs["qwen-draft"])]) == 0
    out, err = capsys.readouterr()
    assert "Compatible" in out and "over HTTP" in err
    # a Hub link and a local file mix too
    link = f"{hub.url}/{refs['gemma'].repo}/resolve/main/{refs['gemma'].path}"
    assert main(["models", "check", str(real["qwen-target"]), link]) == 1
    assert "tokenizer types differ" in capsys.readouterr().out
    assert main(["models", "check", str(refs["qwen-target"]), "hf:test-org/nothing-GGUF/x.gguf"]) == 2
    assert "was not found on the Hub" in capsys.readouterr().err


def test_parse_source():
    assert parse_source("hf:Qwen/Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf") == HubRef("Qwen/Qwen3-8B-GGUF",
                                                                                 "Qwen3-8B-Q4_K_M.gguf")
    assert parse_source("hf:o/r@abc123/sub/f.gguf") == HubRef("o/r", "sub/f.gguf", "abc123")
    assert parse_source("https://huggingface.co/o/r/blob/main/f-00001-of-00002.gguf") == HubRef(
        "o/r", "f-00001-of-00002.gguf")
    assert str(parse_source("models/local.gguf")) == "models/local.gguf"
