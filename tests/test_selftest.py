"""`speculum --self-test`: the real check on SmolLM2, the CLI's exit codes, and the verdict rules."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from speculum import cli, selftest
from speculum.engine.vocabulary import Device
from speculum.selftest import IDENTICAL, MISMATCH, TIE, compare


def test_self_test_on_smollm_is_exact_and_exercises_lookup(smollm_path):
    from speculum.engine.llama.native import gpu_backend

    result = selftest.run_self_test(smollm_path)

    assert result.passed
    # Identical, or apart only at a proven tie: without flash attention (the CPU default)
    # SmolLM2's logits depend slightly on batch shape too.
    assert result.verdict.kind in (IDENTICAL, TIE) and result.plain.tokens
    if result.verdict.kind == IDENTICAL:
        assert result.plain.tokens == result.speculative.tokens
        assert result.plain.text == result.speculative.text
    # The speculative run really verified multi-token drafts, and some were accepted.
    assert result.speculative.drafted > 0 and result.speculative.accepted > 0
    assert result.plain.drafted == 0
    assert result.plain.tokens_per_s > 0 and result.speculative.tokens_per_s > 0
    assert result.backend == (gpu_backend() or "CPU")
    assert "speculum.engine.decoder" in result.modules and "speculum.selftest" in result.modules
    assert not [m for m in result.modules if m.startswith("speculum.ui")]


def test_cli_self_test_exits_0_without_qt_or_a_screen(smollm_path):
    # A fresh interpreter with no display: the self-test must not import Qt at all.
    code = textwrap.dedent(f"""
        import sys
        from speculum.cli import main
        rc = main(["--self-test", {str(smollm_path)!r}])
        qt = sorted(m for m in sys.modules if m.startswith("PySide6"))
        print("QT-MODULES", qt)
        sys.exit(rc)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "QT-MODULES []" in out
    assert "backend    CPU" in out or "on the GPU" in out
    assert out.count("tok/s") == 2
    assert "PASS: speculative output equals plain output" in out


def test_cli_self_test_on_a_non_gguf_file_exits_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "notes.gguf"
    bad.write_text("these are notes, not a model\n" * 20)
    assert cli.main(["--self-test", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("speculum: ") and captured.err.count("\n") == 1, captured.err
    assert "GGUF" in captured.err and "Traceback" not in captured.err
    assert captured.out == ""


def test_cli_self_test_on_a_missing_file_exits_2(tmp_path, capsys):
    assert cli.main(["--self-test", str(tmp_path / "absent.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "absent.gguf" in err


def test_a_broken_install_fails_with_a_clear_last_line(monkeypatch, smollm_path, capsys):
    def missing(*_args):
        raise ModuleNotFoundError("No module named 'huggingface_hub'")

    monkeypatch.setattr(selftest, "speculum_modules", missing)
    assert cli.main(["--self-test", str(smollm_path)]) == 1
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == "FAIL: ModuleNotFoundError: No module named 'huggingface_hub'"


def test_a_speculative_run_that_changes_the_output_fails(monkeypatch, smollm_path, capsys):
    # Corrupt the speculative run's 4th token: the self-test must catch it, with the
    # replayed reference logits naming the position.
    real = selftest._generate

    def corrupted(decoder, prompt, mode):
        run = real(decoder, prompt, mode)
        if mode == "lookup":
            run.tokens[3] = (run.tokens[3] + 1) % decoder.target.n_vocab
        return run

    monkeypatch.setattr(selftest, "_generate", corrupted)
    assert selftest.self_test(smollm_path) == 1
    out = capsys.readouterr().out
    assert "FAIL: speculative output differs from plain output at token 3" in out


def test_replay_reproduces_the_plain_runs_logits_bit_for_bit(smollm_path, monkeypatch):
    # Bit for bit, not just the argmax: a replay along other batch shapes than the plain
    # run's can flip a near tie on another CPU (CI's did, at token 0) and fail a good build.
    from speculum.engine.loading import load_decoder
    from speculum.engine.settings import LoadOptions

    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=selftest.N_CTX))
    try:
        target = decoder.target
        prompt = target.tokenize(target.apply_chat_template([{"role": "user", "content": selftest.PROMPT}]))
        read = []  # every row of logits the plain run read, in order
        real_decode = target.decode

        def recording(tokens, rows=None):
            out = real_decode(tokens, rows)
            read.extend(np.array(r) for r in out)
            return out

        monkeypatch.setattr(target, "decode", recording)
        plain = selftest._generate(decoder, prompt, "off")
        monkeypatch.setattr(target, "decode", real_decode)
        assert len(read) == len(plain.tokens)  # row i chose token i
        logits_at = selftest._replay_plain(target, prompt, plain.tokens)
        for i in (0, 5, len(plain.tokens) - 1):
            replayed = logits_at(i)
            assert int(np.argmax(replayed)) == plain.tokens[i]
            assert np.array_equal(replayed, read[i]), f"token {i}"
    finally:
        decoder.target.close()


# --- the verdict rules, on hand-made logits ------------------------------------------------

def _logits(best: int, runner_up: int, gap: float, n: int = 10) -> np.ndarray:
    row = np.zeros(n, dtype=np.float32)
    row[best] = 20.0
    row[runner_up] = 20.0 - gap
    return row


def _never(_i):
    raise AssertionError("logits are only needed when the outputs differ")


def test_identical_outputs_need_no_logits():
    assert compare([1, 2, 3], [1, 2, 3], _never).kind == IDENTICAL


def test_a_difference_between_the_two_best_tokens_within_noise_is_a_tie():
    verdict = compare([1, 2, 3], [1, 4, 5], lambda i: _logits(2, 4, 0.02))
    assert verdict.kind == TIE and verdict.position == 1 and verdict.passed


def test_a_difference_beyond_the_noise_is_a_mismatch():
    verdict = compare([1, 2, 3], [1, 4, 5], lambda i: _logits(2, 4, selftest.TIE_MARGIN + 0.1))
    assert verdict.kind == MISMATCH and not verdict.passed


def test_a_token_that_is_not_the_runner_up_is_a_mismatch_however_close():
    row = _logits(2, 7, 0.01)
    row[4] = 19.9  # third best
    assert compare([1, 2], [1, 4], lambda i: row).kind == MISMATCH


def test_outputs_of_different_length_are_a_mismatch():
    verdict = compare([1, 2, 3], [1, 2], _never)
    assert verdict.kind == MISMATCH and verdict.position == 2


@pytest.mark.parametrize("layers,expected", [(0, "backend    CPU"), (10**6, "CUDA (all layers on the GPU)")])
def test_report_names_where_the_layers_run(layers, expected):
    import io

    run = selftest.Run("off", [1, 2], "hi", 100.0)
    result = selftest.SelfTestResult("m.gguf", "CPU" if layers == 0 else "CUDA", layers, None if layers == 0 else "CUDA",
                                     [], run, selftest.Run("lookup", [1, 2], "hi", 120.0, 4, 3),
                                     selftest.Verdict(IDENTICAL),
                                     device=Device.CPU if layers == 0 else Device.CUDA)
    out = io.StringIO()
    selftest.report(result, out)
    assert expected in out.getvalue()
    assert "drafted 4, accepted 3, 75%" in out.getvalue()
