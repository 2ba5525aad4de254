"""The `speculum` command line, run as a user runs it (a subprocess, real models)."""

import json
import os
import subprocess
import sys

import pytest


def speculum(*args, stdin=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "speculum.cli", *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONIOENCODING": "utf-8"})


def test_generate_json_streams_cycles_and_a_summary(smollm_path):
    # One attention kernel for both (by default the target, on the CPU, runs without flash attention)
    proc = speculum("generate", "--target", smollm_path, "--draft", smollm_path, "--mode", "draft", "-k", "3",
                    "--fixed-k", "--max-tokens", "25", "--flash-attn", "off", "--json", "Name three fruits.")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    cycles, summary = lines[:-1], lines[-1]
    assert cycles and all(c["type"] == "cycle" for c in cycles)
    assert cycles[0]["drafted"] == [] and len(cycles[0]["emitted"]) == 1  # the prompt's last row gives it
    before = [sum(len(c["emitted"]) for c in cycles[:i]) for i in range(len(cycles))]
    assert all(len(c["drafted"]) == min(3, 25 - n - 1) or c["finish"] for c, n in zip(cycles[1:], before[1:]))
    assert summary["type"] == "summary"
    for key in ("tokens", "tokens_per_s", "acceptance_rate", "tokens_per_pass"):
        assert key in summary
    assert summary["tokens"] == sum(len(c["emitted"]) for c in cycles) <= 25
    # A model drafting for itself is nearly always right (greedy): its single-token rows and the
    # target's batched ones may round a near tie apart ("the most" here, at one alignment of passes).
    assert summary["acceptance_rate"] >= 0.85
    assert summary["text"] == "".join(c["text"] for c in cycles)


def test_generate_terminal_view_colours_and_stdin_prompt(smollm_path):
    proc = speculum("generate", "--target", smollm_path, "--mode", "lookup", "--fixed-k", "--max-tokens", "40",
                    "--color", "always", "-", stdin="Repeat exactly: one two three four five six seven eight nine ten\n")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[32m" in proc.stdout  # accepted drafts in green
    assert "\x1b[9;31m" in proc.stdout  # rejected drafts struck through in red
    summary = "\n".join(proc.stdout.strip().splitlines()[-2:])
    assert "tokens" in summary and "tok/s" in summary and "acceptance" in summary
    assert "passes: lookup" in summary  # what the policy chose


def test_generate_with_a_document(smollm_path, tmp_path):
    doc = tmp_path / "note.html"
    doc.write_text("<html><body><h1>Meeting</h1><p>The budget meeting moves to Thursday at 10am.</p></body></html>")
    proc = speculum("generate", "--target", smollm_path, "--mode", "lookup", "--document", doc, "--max-tokens", "30",
                    "--json", "When is the meeting?")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["tokens"] > 0


def test_bench_json_contract(smollm_path, tmp_path):
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"name": "copy", "user": "Repeat: red green blue red green blue", "max_tokens": 16}) + "\n"
                     + json.dumps({"name": "poem", "user": "A haiku about snow.", "temperature": 0.8, "max_tokens": 12}) + "\n")
    proc = speculum("bench", "--target", smollm_path, "--draft", smollm_path, "--prompts", suite,
                    "--modes", "off,draft,lookup,auto", "--json")
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    assert {(r["name"], r["mode"]) for r in results} == {(n, m) for n in ("copy", "poem")
                                                          for m in ("off", "draft", "lookup", "auto")}
    for r in results:
        for key in ("name", "mode", "tokens", "tokens_per_s", "acceptance_rate", "tokens_per_pass", "speedup_vs_off"):
            assert key in r
        assert r["tokens_per_s"] > 0
    assert all(r["speedup_vs_off"] == 1.0 for r in results if r["mode"] == "off")
    for r in results:  # the oracle for copying rows: what knowing each copy's fate would give
        if r["mode"] in ("lookup", "auto"):
            assert r["oracle_speedup"] >= 0.999 and r["oracle_fraction"] > 0
            assert r["oracle_curve"] == "passes"  # the prompt's own passes: plain steps and drafts
            # its own choices priced on that curve: never beyond the oracle's (lookup mode drafts
            # only copies; auto's other drafts, if any, cost time to make)
            assert 0 < r["priced_speedup"] <= r["oracle_speedup"] + 1e-3 or r["mode"] == "auto"
            assert r["priced_oracle_fraction"] == pytest.approx(r["priced_speedup"] / r["oracle_speedup"], abs=2e-3)
        else:
            assert "oracle_speedup" not in r
    for r in results:  # each greedy answer against plain decoding's first, token for token
        if r["name"] == "copy":  # (plain's own second run too: its prompt from the cache)
            assert r["same_as_off"] is True and r["departs_at"] is None, r
        else:  # seeded (bench's prompts are): drafter-invariant sampling promises Off's text too
            assert isinstance(r["same_as_off"], bool), r
    # plain decoding priced is plain decoding, less what choosing each step took (a fraction of a ms)
    assert all(0.9 < r["priced_speedup"] <= 1.0 for r in results if r["mode"] == "off")
    # the target verifies: without flash attention on the CPU (cpu_settings.attention)
    from speculum.engine.llama.native import gpu_backend
    assert json.loads(proc.stdout)["flash_attn"] == ("off" if gpu_backend() is None else "auto")
    ttft = json.loads(proc.stdout)["ttft"]  # the first token's wait, fresh policy vs taught
    assert all(ttft[key] > 0 for key in ("fresh_s", "calibrated_s", "plain_s", "plain_after_s",
                                         "fresh_vs_calibrated", "fresh_vs_calibrated_vs_plain"))


def test_bench_table(smollm_path, tmp_path):
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"name": "hello", "user": "Say hello.", "max_tokens": 8}) + "\n")
    proc = speculum("bench", "--target", smollm_path, "--prompts", suite, "--modes", "off,lookup")
    assert proc.returncode == 0, proc.stderr
    assert "vs off" in proc.stdout and "hello" in proc.stdout and "lookup" in proc.stdout
    from speculum.engine.llama.native import gpu_backend
    assert f"flash attention: {'off' if gpu_backend() is None else 'auto'}" in proc.stdout


def test_bench_repeats(smollm_path, tmp_path):
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"name": "copy", "user": "Repeat: red green blue red green", "max_tokens": 12}) + "\n")
    proc = speculum("bench", "--target", smollm_path, "--prompts", suite, "--modes", "off,lookup", "--repeat", "3",
                    "--flash-attn", "on", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["flash_attn"] == "on"  # the user's choice over Speculum's
    assert proc.stderr.count("[3/3]") == 3  # every repeat ran, each mode (off before and after lookup)
    results = json.loads(proc.stdout)["results"]
    assert sorted(r["mode"] for r in results) == ["lookup", "off"]
    for r in results:
        assert 0 < r["tokens"] <= 12 and r["tokens_per_s"] > 0
        assert sum(r["choices"].values()) == pytest.approx(1, abs=0.01)


def test_draft_mode_without_a_draft_is_a_clear_error(smollm_path):
    proc = speculum("generate", "--target", smollm_path, "--mode", "draft", "hi")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("speculum: Draft mode needs a draft model")


def test_doctor_reports_versions_backend_and_folders(tmp_path):
    proc = speculum("doctor")
    assert proc.returncode == 0, proc.stderr
    for label in ("Speculum", "llama.cpp", "Qt (PySide6)", "Compute backend", "GPU offload", "Threads",
                  "Models folder", "Settings folder"):
        assert label in proc.stdout
    assert "6." in proc.stdout.split("Qt (PySide6)")[1].splitlines()[0]  # a real Qt version
    from speculum.engine.llama import cpu_settings

    # ggml's tiled path where it makes verification passes cheaper: CPUs with AVX-512
    pays = cpu_settings.tiled_matmul_pays(cpu_settings.cpu_flags())
    assert proc.stdout.split("Tiled matmul")[1].split()[0] == ("on" if pays else "prompt")  # (prompt chunks only)
    from speculum.engine.llama.native import gpu_backend
    attention = proc.stdout.split("Flash attention")[1].splitlines()[0]
    assert ("off for the target" in attention) is (gpu_backend() is None)


def test_install_demo_reuses_assembled_files(qwen_target_path, qwen_draft_path):
    proc = speculum("models", "install-demo", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert str(qwen_target_path) in proc.stdout and str(qwen_draft_path) in proc.stdout
    assert "assembling" not in proc.stderr  # verified files are reused, not rebuilt


def test_generate_summarises_a_document_longer_than_the_context_in_parts(smollm_path, tmp_path):
    from speculum import paths

    document = tmp_path / "long.md"
    document.write_text(paths.resource("samples/lighthouse.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    proc = speculum("generate", "--target", smollm_path, "--ctx", "512", "--mode", "lookup", "--max-tokens", "16",
                    "--document", document, "--json", "Summarise the document.", timeout=900)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    cycles, summary = lines[:-1], lines[-1]
    stages = [c["stage"] for c in cycles]
    parts = sorted({s for s in stages if s.startswith("Part ")})
    assert len(parts) >= 2 and all(s.endswith(f"of {len(parts)}") for s in parts)
    assert stages[0] == f"Part 1 of {len(parts)}" and stages[-1] == "Combining"
    assert summary["parts"] == len(parts)
    assert summary["tokens"] == sum(len(c["emitted"]) for c in cycles)  # every part's tokens counted
    # The answer is the combined summary, not the part summaries run together.
    assert summary["text"] == "".join(c["text"] for c in cycles if c["stage"] == "Combining")


def test_generate_with_a_document_that_fits_has_no_stage(smollm_path, tmp_path):
    document = tmp_path / "short.txt"
    document.write_text("The keepers wrote the weather in the log every night.", encoding="utf-8")
    proc = speculum("generate", "--target", smollm_path, "--mode", "lookup", "--max-tokens", "8",
                    "--document", document, "--json", "What did the keepers write?")
    assert proc.returncode == 0, proc.stderr
    cycles = [json.loads(line) for line in proc.stdout.splitlines()][:-1]
    assert cycles and all("stage" not in c for c in cycles)


def test_generate_reports_reading_a_long_prompt_on_stderr_only(smollm_path, tmp_path):
    doc = tmp_path / "log.txt"
    doc.write_text("\n".join(f"Day {i}: the lighthouse lamp was lit at dusk and the sea was calm." for i in range(60)))
    proc = speculum("generate", "--target", smollm_path, "--mode", "auto", "--document", doc, "--max-tokens", "4",
                    "--json", "Summarise.")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]  # stdout stays pure JSON
    assert lines[-1]["type"] == "summary"
    reading = [line for line in proc.stderr.splitlines() if line.startswith("Reading the prompt…")]
    assert len(reading) >= 3, proc.stderr  # off a terminal: a line per tenth or so, for a long prompt
    read, total = reading[-1].split("… ")[1].split(" tokens")[0].split(" / ")
    assert read == total and int(total.replace(",", "")) >= 512
    # A short prompt off a terminal: nothing.
    short = speculum("generate", "--target", smollm_path, "--max-tokens", "2", "--json", "Hi.")
    assert "Reading the prompt" not in short.stderr
