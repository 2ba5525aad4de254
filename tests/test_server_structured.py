"""`speculum serve` answers in the shape asked for: JSON that follows a schema, log-probabilities,
penalties — the official openai client against a real server over SmolLM2 — and tool calls read
back from each family's own format (pure parsing, no model)."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

from speculum.server import callstream, tools
from live_server import MODEL

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Ann is 31 years old. Give her name and age as JSON."}]


def test_a_json_schema_answer_conforms_streamed_or_not(server):
    client = server(mode="lookup").client()
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=48, response_format=fmt)
    person = json.loads(reply.choices[0].message.content)
    assert set(person) == {"name", "age"} and isinstance(person["name"], str) and isinstance(person["age"], int)
    streamed = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=48, response_format=fmt,
                                              stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert json.loads(text) == person  # greedy: the same answer either way


def test_auto_drafts_a_schemas_forced_keys_and_answers_as_off_does(server):
    # The grammar's forced text (its keys and punctuation) is drafted in auto mode and reported
    # by its source; the answer is plain decoding's.
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
    ask = [{"role": "user", "content": "Ann is 31, Bob is 40 and Cy is 25. Give Bob's name and age as JSON."}]
    answers = {}
    for mode in ("off", "auto"):
        reply = server(mode=mode).client().chat.completions.create(model=MODEL, messages=ask, max_tokens=48,
                                                                   response_format=fmt, temperature=0)
        answers[mode] = reply.choices[0].message.content, reply.model_extra["speculum"]["passes_by_drafter"]
    assert answers["auto"][0] == answers["off"][0]
    assert answers["auto"][1].get("grammar", 0) >= 1, answers
    assert "grammar" not in answers["off"][1]


def test_json_object_answers_are_a_json_object(server):
    client = server().client()
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40,
                                           response_format={"type": "json_object"})
    text = reply.choices[0].message.content
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # cut by max_tokens: still the start of an object
        assert text.lstrip().startswith("{")


def refused_schema(s, schema):
    """The 400 a schema gets, checked to name response_format with no generation started."""
    started = []
    s.served.on_event = started.append
    with pytest.raises(openai.BadRequestError) as refused:
        s.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert refused.value.param == "response_format" and started == []
    return refused.value


def test_a_schema_that_cannot_be_enforced_is_a_400_naming_response_format(server):
    refused_schema(server(), {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}})


@pytest.mark.parametrize("pattern", ["^(a?){1000}$", "^((.?){3}.){20}$"])
def test_a_pattern_that_would_stall_the_grammar_is_a_400_naming_the_field(server, pattern):
    s = server()
    refused = refused_schema(s, {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}},
                                 "required": ["code"]})
    assert "properties.code.pattern" in refused.message
    # The server answers the next request as before.
    answer = s.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=4)
    assert answer.choices[0].message.content is not None


def test_a_pydantic_pattern_with_shorthand_escapes_is_enforced(server):
    """pydantic writes patterns with ``\\d``, ``\\.`` and no anchors; the answer still validates."""
    from typing import Annotated

    from pydantic import BaseModel, StringConstraints

    class Release(BaseModel):
        version: Annotated[str, StringConstraints(pattern=r"^v\d+\.\d+\.\d+$")]
        ticket: Annotated[str, StringConstraints(pattern=r"[A-Z]{2}-\d{3}")]

    ask = [{"role": "user", "content": "Version 2.10.3 closed ticket AB-123. Give the version and ticket as JSON."}]
    reply = server().client().beta.chat.completions.parse(model=MODEL, messages=ask, max_tokens=64,
                                                          response_format=Release)
    release = reply.choices[0].message.parsed  # pydantic validated both patterns
    assert release.version.startswith("v") and "-" in release.ticket


def _entries(logprobs):
    return [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in logprobs.content]


def test_chat_logprobs_whole_and_streamed(server):
    client = server(mode="lookup").client()
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert "".join(e.token for e in content) == reply.choices[0].message.content
    assert len(content) == reply.usage.completion_tokens - (reply.choices[0].finish_reason == "stop")
    for entry in content:
        assert entry.logprob <= 0 and bytes(entry.bytes).decode("utf-8", "replace") == entry.token
        assert len(entry.top_logprobs) == 3
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the likeliest token is the one written
        assert math.isclose(entry.logprob, values[0], abs_tol=1e-6)
    streamed = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, logprobs=True,
                                              top_logprobs=3, stream=True)
    pieces = [e for c in streamed if c.choices and c.choices[0].logprobs for e in _entries(c.choices[0].logprobs)]
    assert [(t, round(lp, 5)) for t, lp, _ in pieces] == [(t, round(lp, 5)) for t, lp, _ in _entries(
        reply.choices[0].logprobs)]


def test_completions_logprobs_in_the_legacy_shape(server):
    s = server()
    reply = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "One, two, three,",
                                                        "max_tokens": 6, "logprobs": 2}, timeout=120).json()
    choice = reply["choices"][0]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert len(logprobs["token_logprobs"]) == len(logprobs["tokens"]) == len(logprobs["top_logprobs"])
    assert logprobs["text_offset"][0] == 0
    assert all(len(top) <= 2 and logprobs["tokens"][i] in top for i, top in enumerate(logprobs["top_logprobs"]))


def test_penalties_change_a_repetitive_answer(server):
    client = server().client()
    prompt = "1, 2, 3, 4, 5,"
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12).choices[0].text
    penalised = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, frequency_penalty=2.0,
                                          presence_penalty=2.0).choices[0].text
    repeated = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12,
                                         extra_body={"repeat_penalty": 1.5}).choices[0].text
    assert plain.count(",") >= 4  # counting on: ", " again and again
    assert penalised.count(",") < plain.count(",") and repeated != plain, (plain, penalised, repeated)


def test_tools_for_a_template_without_tools_is_a_400_saying_so(server):
    s = server()
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        s.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, tools=[weather])
    assert refused.value.param == "tools" and "no tool support" in refused.value.message
    # tool_choice none shows no tools: nothing to refuse.
    reply = s.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, tools=[weather],
                                               tool_choice="none")
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls


@pytest.mark.parametrize("options, param", [
    ({"tools": [{"type": "function", "function": {"name": "no spaces allowed"}}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "text"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"}, "tool_choice"),
])
def test_tools_asked_wrongly_are_400s_naming_what(server, options, param):
    s = server()
    response = httpx.post(s.url + "/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 4,
                                                               **options}, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


# --- reading calls back: each family's format (pure parsing) ---------------------------------------------

def _use(fmt):
    return tools.ToolUse(tools=[], format=fmt, choice=tools.ToolChoice.AUTO, parameters={"get_weather": {"type": "object"}})


@pytest.mark.parametrize("fmt, text", [
    (tools.HERMES, 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    (tools.HERMES, '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'),
    (tools.MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    (tools.LLAMA3, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    (tools.LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
])
def test_calls_are_read_in_each_format_whole_and_streamed(fmt, text):
    content, calls = tools.parse_calls(text, _use(fmt))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    for size in (1, 5, 1000):
        sent, deltas = _streamed(fmt, text, size)
        assert [d["function"]["name"] for d in deltas if "id" in d] == ["get_weather"]
        assert deltas[0]["index"] == 0 and deltas[0]["type"] == "function" and deltas[0]["function"]["arguments"] == ""
        assert json.loads("".join(d["function"]["arguments"] for d in deltas)) == {"city": "Paris"}
        assert sent.strip() == (content or "")


def _streamed(fmt, text, size):
    stream, sent, deltas = callstream.CallStream(_use(fmt)), [], []
    for i in range(0, len(text), size):
        piece, found = stream.feed(text[i:i + size])
        sent.append(piece)
        deltas += found
    piece, found = stream.finish()
    return "".join(sent) + piece, deltas + found


def test_a_code_block_is_streamed_once_it_is_plainly_no_call():
    stream = callstream.CallStream(_use(tools.HERMES))
    code = "```python\ndef get_weather(city: str) -> str:\n"
    assert stream.feed(code[:10]) == ("", [])  # may still be a call in a fence
    assert stream.feed(code[10:]) == (code, [])


def test_a_hermes_call_streams_its_arguments_as_they_are_written():
    head = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    stream = callstream.CallStream(_use(tools.HERMES))
    text, deltas = stream.feed(head)
    assert text == "" and deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city": "Pa'
    text, deltas = stream.feed('ris"}}\n</tool_')
    assert "".join(d["function"]["arguments"] for d in deltas) == 'ris"}'
    assert stream.feed("call>")[1] == [] and stream.finish() == ("", [])
    # Cut short by max_tokens: what was written is sent.
    stream = callstream.CallStream(_use(tools.HERMES))
    sent = stream.feed(head + 'ris"}')[1] + stream.finish()[1]
    assert json.loads("".join(d["function"]["arguments"] for d in sent)) == {"city": "Paris"}


@pytest.mark.parametrize("fmt, text", [
    (tools.HERMES, "The weather is fine."),
    (tools.HERMES, "```python\ndef get_weather(city):\n    return 'sunny'\n```"),
    (tools.HERMES, '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>'),  # not offered
    (tools.MISTRAL, "[TOOL_CALLS] not json"),
    (tools.LLAMA3, '{"answer": 42}'),
])
def test_text_that_is_no_call_stays_text(fmt, text):
    content, calls = tools.parse_calls(text, _use(fmt))
    assert calls == [] and content == text
    for size in (1, 4, 1000):
        sent, deltas = _streamed(fmt, text, size)
        assert sent == text and deltas == []


def test_which_templates_have_which_call_format():
    assert tools.call_format("{% if tools %}<tool_call>{% endif %}") is tools.HERMES
    assert tools.call_format("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]") is tools.MISTRAL
    assert tools.call_format("{% if tools %}<|python_tag|>{% endif %}ipython") is tools.LLAMA3
    assert tools.call_format("{{ messages }}") is None and tools.call_format(None) is None
