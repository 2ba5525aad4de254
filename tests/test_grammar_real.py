"""Constrained decoding under speculation on real llama.cpp models: with a JSON schema, greedy
speculative output equals greedy plain constrained output (design notes' tie rule for Qwen),
and the answer parses as JSON conforming to the schema."""

import json

import numpy as np
import pytest

from speculum.engine.decoder import Decoder
from speculum.engine.grammar.schema import grammar_for_response_format
from speculum.engine.llama.model import LlamaModel
from speculum.engine.settings import LoadOptions
from speculum.engine.sampling import SamplingParams
from test_backend import QWEN_MAX_NOISE
from test_engine_real import first_difference, generate, tokens_of

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"},
                                           "hobbies": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "city", "hobbies"], "additionalProperties": False}
TEXT = "Alice Smith is 34 years old and lives in Paris. She likes chess and tennis."
ASK = f"Extract the person in this text as JSON with keys name, age, city and hobbies.\n\n{TEXT}"
EXPECTED = '{"name": "Alice Smith", "age": 34, "city": "Paris", "hobbies": ["chess", "tennis"]}'


def person_grammar():
    return grammar_for_response_format({"type": "json_schema",
                                        "json_schema": {"name": "person", "strict": True, "schema": PERSON}})


def parsed_person(decoder, tokens):
    value = json.loads(decoder.target.detokenize([t for t in tokens if not decoder.target.is_eog(t)]))
    assert set(value) == set(PERSON["properties"]), value
    assert isinstance(value["name"], str) and isinstance(value["age"], int) and isinstance(value["city"], str)
    assert isinstance(value["hobbies"], list) and all(isinstance(h, str) for h in value["hobbies"])
    return value


def masked_top2_gap(path, prompt, grammar, answer):
    """The reference's top-2 logit gap among the tokens the grammar allows after ``answer``."""
    with LlamaModel(path, LoadOptions(n_ctx=1024)) as ref:
        row = ref.prefill(prompt + answer)
        state = grammar.start(ref)
        for t in answer:
            state.accept(t)
        masked = np.sort(state.mask(row).astype(np.float64))
    return masked[-1] - masked[-2]


def test_smollm_constrained_lookup_and_prediction_equal_plain(smollm_path):
    decoder = Decoder(LlamaModel(smollm_path, LoadOptions(n_ctx=2048)))
    grammar = person_grammar()
    prompt = tokens_of(decoder, ASK)
    # The prompt read once before, so every run decodes its last token in a short batch (plain
    # decoding reads it with a cold prompt's last chunk, whose rows differ in the last bits).
    generate(decoder, prompt, max_tokens=1, policy="lookup")
    plain, plain_cycles = generate(decoder, prompt, max_tokens=80, policy="off", grammar=grammar, logprobs=2)
    assert plain_cycles[-1].finish == "eog"
    parsed_person(decoder, plain)
    predicted = decoder.target.tokenize(EXPECTED, add_special=False, parse_special=False)
    for mode, prediction in (("lookup", ()), ("auto", predicted)):
        spec, cycles = generate(decoder, prompt, max_tokens=80, policy=mode, grammar=grammar, prediction=prediction,
                                logprobs=2)
        assert spec == plain, mode  # SmolLM2's rows do not depend on the batch (design notes)
        assert sum(c.n_accepted for c in cycles) > 0, mode
        # logprobs equal the plain run's at every position
        got = [x for c in cycles for x in c.logprobs]
        want = [x for c in plain_cycles for x in c.logprobs]
        assert len(got) == len(spec) and np.allclose(got, want, atol=1e-5), mode
        assert [x for c in cycles for x in c.top_tokens] == [x for c in plain_cycles for x in c.top_tokens]
    decoder.target.close()


def test_smollm_penalised_speculation_equals_penalised_plain(smollm_path):
    decoder = Decoder(LlamaModel(smollm_path, LoadOptions(n_ctx=2048)))
    prompt = tokens_of(decoder, ASK)
    sampling = SamplingParams(presence_penalty=1.5, frequency_penalty=1.0, repeat_penalty=1.1)
    unpenalised, _ = generate(decoder, prompt, max_tokens=64, policy="off")
    plain, _ = generate(decoder, prompt, max_tokens=64, policy="off", sampling=sampling)
    spec, cycles = generate(decoder, prompt, max_tokens=64, policy="lookup", sampling=sampling)
    assert spec == plain
    assert sum(c.n_accepted for c in cycles) > 0
    assert plain != unpenalised
    decoder.target.close()


@pytest.mark.qwen
def test_qwen_constrained_speculation_equals_plain_up_to_ties(qwen_pair):
    grammar = person_grammar()
    prompt = tokens_of(qwen_pair, ASK)
    plain, cycles = generate(qwen_pair, prompt, max_tokens=80, policy="off", grammar=grammar)
    assert cycles[-1].finish == "eog"
    assert parsed_person(qwen_pair, plain) == json.loads(EXPECTED)
    predicted = qwen_pair.target.tokenize(EXPECTED, add_special=False, parse_special=False)
    for mode, prediction in (("draft", ()), ("lookup", ()), ("auto", predicted)):
        spec, cycles = generate(qwen_pair, prompt, max_tokens=80, policy=mode, grammar=grammar, prediction=prediction)
        assert sum(c.n_accepted for c in cycles) > 0, mode
        parsed_person(qwen_pair, spec)
        i = first_difference(plain, spec)
        if i is not None:  # allowed only at a numerical tie among the tokens the grammar allows
            gap = masked_top2_gap(qwen_pair.target.path, prompt, grammar, plain[:i])
            assert gap < QWEN_MAX_NOISE, (mode, i, gap)
