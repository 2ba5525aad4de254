"""Anthropic's Messages API on `speculum serve`: the official anthropic SDK and raw HTTP against a
real server on 127.0.0.1, over real models: SmolLM2 for text, the Qwen demo pair (its chat
template renders tools) for tool calls."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from speculum.engine.loading import load_decoder
from speculum.engine.settings import LoadOptions
from speculum.server.service import ServedModel
from live_server import LiveServer

MODEL = "smol"
KEY = "test-key-123"
COPY = [{"role": "user", "content": "Copy this exactly: The quick brown fox jumps over the lazy dog."}]


@pytest.fixture(scope="module")
def smol(smollm_path):
    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=1024, flash_attn=True, ngram_memory=False))
    s = LiveServer(ServedModel(decoder, MODEL, mode="lookup"), api_key=KEY)
    yield s
    s.stop()
    decoder.target.close()


def sdk(s: LiveServer, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.url, api_key=key, max_retries=0, timeout=300)


def post(s: LiveServer, path: str, body, headers: dict | None = None) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(s.url + path, content=data, timeout=300,
                      headers={"Content-Type": "application/json", "x-api-key": KEY, **(headers or {})})


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_create_answers_as_the_chat_path_does_in_anthropics_shape(smol):
    message = sdk(smol).messages.create(model=MODEL, max_tokens=24, messages=COPY,
                                        system="You copy text exactly.")
    assert message.id.startswith("msg_") and message.role == "assistant" and message.model == MODEL
    assert message.stop_reason in ("end_turn", "max_tokens") and message.content[0].type == "text"
    assert message.usage.output_tokens <= 24
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 0
    chat = openai.OpenAI(base_url=smol.url + "/v1", api_key=KEY, max_retries=0).chat.completions.create(
        model=MODEL, max_tokens=24, messages=[{"role": "system", "content": "You copy text exactly."},
                                                             *COPY])
    assert text_of(message) == chat.choices[0].message.content  # the same request, the same greedy answer
    assert message.usage.output_tokens == chat.usage.completion_tokens


def test_stream_sends_anthropics_events_and_the_same_text(smol):
    client = sdk(smol)
    whole = client.messages.create(model=MODEL, max_tokens=24, messages=COPY)
    with client.messages.stream(model=MODEL, max_tokens=24, messages=COPY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert text_of(final) == text_of(whole) and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and kinds[-2] == "message_delta"
    assert {"content_block_start", "content_block_stop"} <= set(kinds)
    # Raw: each event named on its own line, a ping among them, text deltas adding up to the text.
    with httpx.stream("POST", smol.url + "/v1/messages", headers={"x-api-key": KEY}, timeout=300, json={
            "model": MODEL, "max_tokens": 24, "temperature": 0, "messages": COPY, "stream": True}) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    names = [line[len("event: "):] for line in lines if line.startswith("event: ")]
    data = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    assert "ping" in names and [d["type"] for d in data] == names
    assert "".join(d["delta"]["text"] for d in data if d["type"] == "content_block_delta") == text_of(whole)


def test_max_tokens_beyond_the_context_is_capped_never_refused(smol):
    message = sdk(smol).messages.create(model=MODEL, max_tokens=32000, messages=COPY)
    assert message.stop_reason == "end_turn" and text_of(message)


def test_stop_sequences_end_with_stop_sequence_named(smol):
    client = sdk(smol)
    text = text_of(client.messages.create(model=MODEL, max_tokens=24, messages=COPY))
    word = text.split()[2]
    cut = client.messages.create(model=MODEL, max_tokens=24, messages=COPY,
                                 stop_sequences=["never written", word])
    assert text_of(cut) == text[:text.index(word)]
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word


def test_a_last_assistant_turn_is_continued(smol):
    client = sdk(smol)
    text = text_of(client.messages.create(model=MODEL, max_tokens=24, messages=COPY))
    head = text[:text.index(text.split()[2])].rstrip()
    continued = client.messages.create(model=MODEL, max_tokens=24,
                                       messages=[*COPY, {"role": "assistant", "content": head}])
    assert text_of(continued) and not text_of(continued).startswith(head)
    assert text.startswith(head + text_of(continued)[:8])


def test_count_tokens_counts_what_create_reads(smol):
    client = sdk(smol)
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1.2.3.abc;"},
              {"type": "text", "text": "You copy text exactly.", "cache_control": {"type": "ephemeral"}}]
    counted = client.messages.count_tokens(model=MODEL, messages=COPY, system=system).input_tokens
    message = client.messages.create(model=MODEL, max_tokens=4, messages=COPY, system=system)
    assert counted == message.usage.input_tokens + message.usage.cache_read_input_tokens
    # The billing header is not shown to the model: the count is that of the system prompt alone.
    assert counted == client.messages.count_tokens(model=MODEL, messages=COPY,
                                                   system="You copy text exactly.").input_tokens
    longer = client.messages.count_tokens(model=MODEL, messages=COPY, system="You copy text exactly, word by word.")
    assert longer.input_tokens > counted


def test_a_second_request_reads_only_its_new_tokens(smol):
    client = sdk(smol)
    turn = [*COPY, {"role": "assistant", "content": "The quick brown fox."},
            {"role": "user", "content": "Again, please."}]
    client.messages.create(model=MODEL, max_tokens=2, messages=turn)
    again = client.messages.create(model=MODEL, max_tokens=2, messages=turn)
    assert again.usage.cache_read_input_tokens > 0 and again.usage.input_tokens < again.usage.cache_read_input_tokens


def test_fields_that_do_not_apply_locally_are_accepted(smol):
    response = post(smol, "/v1/messages?beta=true", {
        "model": MODEL, "max_tokens": 4, "messages": COPY, "metadata": {"user_id": "u"},
        "thinking": {"type": "adaptive"}, "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
        "output_config": {"effort": "high"}}, headers={"anthropic-beta": "claude-code-20250219",
                                                      "anthropic-version": "2023-06-01"})
    assert response.status_code == 200, response.text


def test_sampling_fields_reach_the_sampler(smol):
    greedy = text_of(sdk(smol).messages.create(model=MODEL, max_tokens=16, messages=COPY))
    sampled = post(smol, "/v1/messages", {"model": MODEL, "max_tokens": 16, "messages": COPY, "temperature": 1.0,
                                          "top_p": 0.9, "top_k": 1, "seed": 5})  # top_k 1: only the likeliest
    assert sampled.status_code == 200 and sampled.json()["content"][0]["text"] == greedy


def test_output_config_format_is_enforced(smol):
    schema = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40}}, "required": ["title"],
              "additionalProperties": False}
    message = sdk(smol).messages.create(model=MODEL, max_tokens=48, messages=COPY, extra_body={
        "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert set(json.loads(text_of(message))) == {"title"}


def _error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]["message"]


@pytest.mark.parametrize("change, named", [
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     "messages[0].content[1]' is an image block"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}]},
     "document block"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {}}]}]}]}, "messages[0].content[0].content[0]' is an image block"),
    ({"max_tokens": None}, "max_tokens"),
    ({"stop_sequences": "END"}, "stop_sequences"),
    ({"temperature": 7}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"container": "c1"}, "'container'"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool 'web_search_20250305'"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "word " * 2000}]}, "prompt is too long:"),
])
def test_refusals_name_the_field_in_anthropics_error_shape(smol, change, named):
    message = _error(post(smol, "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": COPY, **change}),
                     400, "invalid_request_error")
    assert named in message
    assert post(smol, "/v1/messages/count_tokens", {"model": MODEL, "messages": COPY}).status_code == 200


def test_a_prompt_longer_than_the_context_says_both_numbers(smol):
    message = _error(post(smol, "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": "apple pie " * 600}]}), 400, "invalid_request_error")
    assert message.startswith("prompt is too long: ") and "tokens > 1023 maximum" in message
    with pytest.raises(anthropic.BadRequestError) as raised:  # the SDK reads the shape too
        sdk(smol).messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "pie " * 2000}])
    assert raised.value.body["error"]["type"] == "invalid_request_error"


def test_every_error_on_these_routes_is_in_anthropics_shape(smol):
    _error(post(smol, "/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": COPY}),
           404, "not_found_error")
    _error(post(smol, "/v1/messages", b"{not json"), 400, "invalid_request_error")
    _error(post(smol, "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": COPY}, {"x-api-key": "wrong"}),
           401, "authentication_error")
    _error(httpx.post(smol.url + "/v1/messages", content=b"{}", headers={"Content-Type": "text/plain"}), 415,
           "invalid_request_error")
    _error(httpx.get(smol.url + "/v1/messages", headers={"x-api-key": KEY}), 405, "invalid_request_error")
    _error(post(smol, "/v1/messages/batches", {}), 404, "not_found_error")
    with pytest.raises(anthropic.AuthenticationError):
        sdk(smol, key="wrong").messages.create(model=MODEL, max_tokens=4, messages=COPY)
    # The key is read from Authorization: Bearer as well as from x-api-key.
    bearer = httpx.post(smol.url + "/v1/messages/count_tokens", json={"model": MODEL, "messages": COPY},
                        headers={"Authorization": f"Bearer {KEY}"})
    assert bearer.status_code == 200 and bearer.json()["input_tokens"] > 0


# --- tools, on the Qwen demo pair --------------------------------------------------------------------------

QWEN = "qwen-demo"
WEATHER = {"name": "get_weather", "description": "The current weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                            "required": ["city"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]


@pytest.fixture(scope="module")
def qwen(qwen_pair):
    s = LiveServer(ServedModel(qwen_pair, QWEN, mode="draft"))
    yield s
    s.stop()


@pytest.mark.qwen
def test_tool_use_round_trip(qwen):
    client = sdk(qwen, key="none")
    asked = client.messages.create(model=QWEN, max_tokens=64, tools=[WEATHER], messages=ASK)
    assert asked.stop_reason == "tool_use", asked
    call = next(block for block in asked.content if block.type == "tool_use")
    assert call.name == "get_weather" and call.input == {"city": "Paris"} and call.id
    # (as tests/test_clients.py's OpenAI round trip: with 'auto' the 1.5B model may call again)
    answer = client.messages.create(model=QWEN, max_tokens=64, tools=[WEATHER], tool_choice={"type": "none"},
                                    messages=[*ASK, {"role": "assistant", "content": asked.content},
                                              {"role": "user", "content": [{"type": "tool_result",
                                                                            "tool_use_id": call.id,
                                                                            "content": "Sunny, 24 degrees C."}]}])
    assert answer.stop_reason == "end_turn" and "24" in text_of(answer)


@pytest.mark.qwen
def test_streamed_tool_use_gives_the_same_input(qwen):
    client = sdk(qwen, key="none")
    whole = client.messages.create(model=QWEN, max_tokens=64, tools=[WEATHER], messages=ASK)
    with client.messages.stream(model=QWEN, max_tokens=64, tools=[WEATHER], messages=ASK) as stream:
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "input_json_delta" in deltas
    calls = [(b.name, b.input) for b in final.content if b.type == "tool_use"]
    assert calls == [(b.name, b.input) for b in whole.content if b.type == "tool_use"] and calls
    assert final.stop_reason == "tool_use"


@pytest.mark.qwen
@pytest.mark.parametrize("choice, called", [({"type": "any"}, True), ({"type": "tool", "name": "get_weather"}, True),
                                            ({"type": "none"}, False)])
def test_tool_choice(qwen, choice, called):
    message = sdk(qwen, key="none").messages.create(
        model=QWEN, max_tokens=48, tools=[WEATHER], tool_choice=choice,
        messages=[{"role": "user", "content": "Say hello to Ann."}] if called else ASK)
    uses = [b for b in message.content if b.type == "tool_use"]
    assert bool(uses) is called and (message.stop_reason == "tool_use") is called
    if called:
        assert uses[0].name == "get_weather" and isinstance(uses[0].input["city"], str)


def test_a_call_in_a_fenced_block_over_several_lines_streams_as_tool_use():
    """What Qwen wrote for Claude Code's Read tool: a fenced JSON call, its braces on lines of their own."""
    from speculum.engine.sampling import SamplingParams
    from speculum.server.anthropic import Answer
    from speculum.server.service import Completion, Done
    from speculum.server.tools import tool_use

    read = {"type": "object", "properties": {"file_path": {"type": "string"}, "limit": {"type": "number"}},
            "required": ["file_path"]}
    use = tool_use({"tools": [{"type": "function", "function": {"name": "Read", "parameters": read}}]},
                   "{% for tool in tools %}{{ tool }}{% endfor %}<tool_call>{% if tool_calls %}'tool'{% endif %}")
    completion = Completion([1, 2, 3], 64, SamplingParams())
    completion.tools = use
    answer = Answer("m", completion)
    text = '```json\n{\n  "name": "Read",\n  "arguments": {\n    "file_path": "/w/notes.txt",\n    "limit": 100\n  }\n}\n```'
    events = [e for i in range(0, len(text), 3) for e in answer.piece(text[i:i + 3])]
    events += answer.end(Done("stop", {"prompt_tokens": 3, "completion_tokens": 40,
                                       "prompt_tokens_details": {"cached_tokens": 0}}, {}))
    data = [json.loads(e.split("data: ", 1)[1]) for e in events]
    starts = [d["content_block"] for d in data if d["type"] == "content_block_start"]
    assert [(b["type"], b.get("name")) for b in starts] == [("tool_use", "Read")]
    arguments = "".join(d["delta"]["partial_json"] for d in data if d["type"] == "content_block_delta")
    assert json.loads(arguments) == {"file_path": "/w/notes.txt", "limit": 100}
    assert data[-2]["delta"]["stop_reason"] == "tool_use" and data[-1]["type"] == "message_stop"


def test_a_tools_schema_the_grammar_cannot_hold_is_relaxed():
    """Keywords no grammar enforces are left out of a tool's grammar, the rest kept in its order."""
    from speculum.server.anthropic_request import enforceable

    schema = {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "step": {"type": "number", "multipleOf": 0.5, "description": "half steps"},
        "rest": {"not": {"type": "null"}, "description": "anything but null"},
        "count": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["count"],
        "additionalProperties": False}
    kept = enforceable(schema)
    assert list(kept["properties"]) == ["tags", "step", "rest", "count"]
    assert kept["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert kept["properties"]["step"] == {"type": "number", "description": "half steps"}
    assert kept["properties"]["rest"] == {"description": "anything but null"}
    assert kept["properties"]["count"] == schema["properties"]["count"]
    assert kept["required"] == ["count"] and kept["additionalProperties"] is False
    enforced = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    assert enforceable(enforced) is enforced  # a schema the grammar holds whole is used as it is


@pytest.mark.qwen
def test_a_tool_the_grammar_cannot_hold_is_served_relaxed_and_refused_when_strict(qwen):
    tool = {"name": "TaskCreate", "input_schema": {"type": "object", "properties": {
        "subject": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}}
    body = {"model": QWEN, "max_tokens": 1, "messages": ASK, "tools": [tool]}
    assert post(qwen, "/v1/messages", body).status_code == 200
    strict = post(qwen, "/v1/messages", {**body, "tools": [{**tool, "strict": True}]})
    assert "'uniqueItems'" in _error(strict, 400, "invalid_request_error")
