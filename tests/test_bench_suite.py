"""The bundled bench suite: the copy-heavy kinds issue 47 measures, read as a client sends them
(earlier turns, a JSON schema the answer follows)."""

import json

import pytest

from speculum import bench
from speculum.engine.decoder import Decoder
from speculum.engine.vocabulary import Mode
from speculum.errors import SpeculumError

COPY_HEAVY = ("code-editing", "verbatim-extraction", "yaml-to-json", "typo-fixing", "multi-turn-edit",
              "json-schema-extraction")


def test_the_suite_holds_each_copy_heavy_kind_and_some_with_nothing_to_copy():
    names = [p.name for p in bench.load_prompts()]
    assert len(names) == len(set(names))
    assert set(COPY_HEAVY) <= set(names)
    assert {"code-writing", "open-chat", "creative", "code-explanation"} <= set(names)
    assert {p.name for p in bench.load_prompts() if p.copy_heavy} == set(COPY_HEAVY)


def test_a_multi_turn_prompt_sends_its_earlier_turns_before_the_question():
    edit = next(p for p in bench.load_prompts() if p.name == "multi-turn-edit")
    roles = [m["role"] for m in edit.messages()]
    assert roles == ["user", "assistant", "user"]
    assert "def best_player" in edit.messages()[1]["content"]  # the code the edit copies from
    assert edit.messages()[-1]["content"] == edit.user


def test_a_prompt_line_with_a_schema_that_is_not_an_object_is_refused(tmp_path):
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"name": "x", "user": "hi", "json_schema": ["not", "a", "schema"]}) + "\n")
    with pytest.raises(SpeculumError, match="suite.jsonl:1"):
        bench.load_prompts(str(suite))


def test_the_schema_prompt_is_answered_within_its_schema(smollm):
    prompt = next(p for p in bench.load_prompts() if p.name == "json-schema-extraction")
    tokens = smollm.tokenize(smollm.apply_chat_template(prompt.messages()))
    _, output = bench.run_one(Decoder(smollm), tokens, Mode.OFF, prompt, max_tokens=24)
    text = smollm.detokenize(output)
    # The grammar makes the answer the schema's object, its first property first.
    assert text.replace(" ", "").replace("\n", "").startswith('{"invoice_number":"'), text
