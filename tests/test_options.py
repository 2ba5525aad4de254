"""The command line read once into typed options: each subcommand's values checked and converted
before anything loads or listens (no model, no process: what `options.parse` makes of argv)."""

from __future__ import annotations

import pytest

from speculum.engine.vocabulary import Mode
from speculum.errors import SpeculumError
from speculum.options import (BenchOptions, GenerateOptions, ModelsCheck, ModelsList, SelfTestOptions, ServeCommand,
                              WindowOptions, parse)


def test_generate_reads_its_model_load_and_sampling_options_typed():
    options = parse(["generate", "--target", "t.gguf", "--draft", "d.gguf", "--ctx", "2048", "--flash-attn", "off",
                     "--cache-ram", "0", "--no-ngram-memory", "--mode", "lookup", "-k", "6", "--fixed-k",
                     "--color", "never", "hello"])
    assert isinstance(options, GenerateOptions) and options.prompt == "hello" and options.color is False
    load = options.models.load
    assert (options.models.target, options.models.draft) == ("t.gguf", "d.gguf")
    assert (load.n_ctx, load.flash_attn, load.prompt_cache_mib, load.ngram_memory) == (2048, False, 0, False)
    assert options.sampling.mode is Mode.LOOKUP and options.sampling.draft_length == 6
    assert parse(["generate", "--target", "t.gguf", "hi"]).sampling.draft_length is None  # -k alone: adapted


def test_bench_modes_are_modes_and_a_wrong_one_is_named():
    options = parse(["bench", "--target", "t.gguf", "--modes", "off, lookup,auto"])
    assert isinstance(options, BenchOptions) and options.modes == (Mode.OFF, Mode.LOOKUP, Mode.AUTO)
    with pytest.raises(SpeculumError, match="Unknown mode 'fast'"):
        parse(["bench", "--target", "t.gguf", "--modes", "off,fast"])


def test_serve_options_carry_where_and_what_is_served():
    command = parse(["serve", "--target", "models/qwen-7b.gguf", "--n-ctx", "8192", "--mode", "draft",
                     "--port", "9000", "--cors-origin", "https://a.example", "--cors-origin", "https://b.example"])
    assert isinstance(command, ServeCommand) and command.models.load.n_ctx == 8192  # --n-ctx is --ctx
    serving = command.serving
    assert (serving.model_id, serving.mode, serving.port) == ("qwen-7b", Mode.DRAFT, 9000)
    assert serving.cors_origins == ("https://a.example", "https://b.example")
    with pytest.raises(SpeculumError, match="--api-key"):
        parse(["serve", "--target", "t.gguf", "--host", "0.0.0.0"])
    assert parse(["serve", "--target", "t.gguf", "--host", "0.0.0.0", "--api-key", "k"]).serving.api_key == "k"


@pytest.mark.parametrize("argv,words", [
    (["--cache-ram", "-1"], "--cache-ram is a size in MiB"),
    (["--tensor-split", "3,x"], "--tensor-split takes numbers"),
    (["--rpc", "no-port-here"], "no-port-here"),
])
def test_a_value_that_cannot_be_used_is_said_before_anything_loads(argv, words):
    with pytest.raises(SpeculumError, match=words):
        parse(["generate", "--target", "t.gguf", *argv, "hi"])


def test_the_rpc_workers_and_split_become_load_options():
    load = parse(["generate", "--target", "t.gguf", "--rpc", "127.0.0.1:50052,[::1]:50053", "--tensor-split", "3,1",
                  "hi"]).models.load
    assert load.rpc == ("127.0.0.1:50052", "[::1]:50053") and load.tensor_split == (3.0, 1.0)


def test_the_window_the_self_test_and_models_commands_have_their_own():
    assert parse([]) == WindowOptions()
    assert parse(["--self-test", "m.gguf"]) == SelfTestOptions("m.gguf")
    assert parse(["models", "list", "--json"]) == ModelsList(json=True)
    assert parse(["models", "check", "t.gguf"]) == ModelsCheck("t.gguf", None)
