"""OpenAI's Responses API (`/v1/responses`) with the official openai client and openai-agents,
against a real server on 127.0.0.1: text, streaming, structured output, continuing a kept
response on the real SmolLM2; function tools on the demo pair (Qwen2.5-Coder 1.5B speculating
with its 0.5B draft), whose chat template has tool turns."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from pydantic import BaseModel

from speculum.engine.loading import load_decoder
from speculum.engine.settings import LoadOptions
from speculum.server.responses import KEPT
from speculum.server.service import ServedModel
from live_server import LiveServer

SMOL = "smol"
QWEN = "qwen-demo"
COPY = "Copy this exactly: The quick brown fox jumps over the lazy dog."
INSTRUCTIONS = "You copy text exactly."


@pytest.fixture(scope="module")
def smol(smollm_path):
    # Flash attention: SmolLM2's logits are the same whatever the batch, so answers compare exactly.
    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=1024, flash_attn=True, ngram_memory=False))
    server = LiveServer(ServedModel(decoder, SMOL, mode="lookup"))
    yield server
    server.stop()
    decoder.target.close()


def _count(server, **body) -> int:
    reply = httpx.post(server.url + "/v1/responses/input_tokens", json={"model": SMOL, **body}, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["object"] == "response.input_tokens"
    return reply.json()["input_tokens"]


def test_create_answers_as_chat_completions_would(smol):
    client = smol.client()
    response = client.responses.create(model=SMOL, instructions=INSTRUCTIONS, input=COPY, max_output_tokens=24,
                                       temperature=0, reasoning={"effort": "low"}, include=["reasoning.encrypted_content"],
                                       prompt_cache_key="session-1", store=False)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text.strip()
    # The same request through chat completions: instructions are the system message.
    chat = client.chat.completions.create(model=SMOL, max_tokens=24, temperature=0, messages=[
        {"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": COPY}])
    assert response.output_text == chat.choices[0].message.content
    usage = response.usage
    assert usage.input_tokens == chat.usage.prompt_tokens == _count(smol, instructions=INSTRUCTIONS, input=COPY)
    assert usage.output_tokens == chat.usage.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert response.incomplete_details is None if response.status == "completed" else \
        response.incomplete_details.reason == "max_output_tokens"


def test_stream_events_in_order_and_deltas_join_to_the_text(smol):
    client = smol.client()
    ask = {"model": SMOL, "input": [{"role": "developer", "content": INSTRUCTIONS},
                                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": COPY}]}],
           "max_output_tokens": 24, "temperature": 0}
    events = list(client.responses.create(stream=True, **ask))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    end = kinds.index("response.output_text.done")
    assert set(kinds[4:end]) == {"response.output_text.delta"}
    assert kinds[end:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                           "response.completed" if events[-1].response.status == "completed" else "response.incomplete"]
    text = "".join(deltas)
    assert events[end].text == text == events[-1].response.output_text
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    # The same text as the answer given whole.
    assert client.responses.create(**ask).output_text == text


class Verdict(BaseModel):
    ok: bool
    score: int


def test_json_schema_output_parses_and_more_than_fits_is_capped(smol):
    client = smol.client()
    # max_output_tokens far above the context: capped to its room, never a 400 (agents ask for their maximum).
    parsed = client.responses.parse(model=SMOL, input="Is the sky blue? Answer with ok and a score.",
                                    text_format=Verdict, max_output_tokens=100_000, temperature=0)
    assert isinstance(parsed.output_parsed, Verdict)
    assert parsed.text.format.type == "json_schema"
    loose = client.responses.create(model=SMOL, input="Give a JSON object describing a cat.", max_output_tokens=40,
                                    temperature=0, text={"format": {"type": "json_object"}})
    assert loose.output_text.lstrip().startswith("{")


def test_previous_response_id_continues_a_kept_response(smol):
    client = smol.client()
    first = client.responses.create(model=SMOL, input="My name is Ann. Say hello to me.", max_output_tokens=16,
                                    temperature=0, instructions=INSTRUCTIONS)
    second = client.responses.create(model=SMOL, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=16, temperature=0)
    # The prompt is the conversation so far (instructions are not carried on, as on OpenAI's) ...
    whole = [{"role": "user", "content": "My name is Ann. Say hello to me."},
             {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "What is my name?"}]
    assert second.usage.input_tokens == _count(smol, input=whole)
    assert second.previous_response_id == first.id
    # ... and what the first request read is not read again (the prompt cache across a growing prefix).
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16
    assert client.responses.retrieve(first.id).output_text == first.output_text

    unkept = client.responses.create(model=SMOL, input="Hi", max_output_tokens=4, store=False)
    for missing in (unkept.id, "resp_nosuchthing"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=SMOL, input="And?", previous_response_id=missing, max_output_tokens=4)
        body = refused.value.body
        assert body["param"] == "previous_response_id" and body["code"] == "previous_response_not_found"
        assert str(KEPT) in body["message"] and "not kept" in body["message"]


LONG = "hello " * 1200  # more tokens than SmolLM2's context here (1,024)


@pytest.mark.parametrize("change, param, named", [
    ({"tools": [{"type": "web_search"}]}, "tools[0]", "web_search"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0]", "file_search"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[0]", "input_image"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0]", "web_search_call"),
    ({"background": True}, "background", "background"),
    ({"frobnicate": 1}, "frobnicate", "frobnicate"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice", "file_search"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "\\bword"}}}}}}, "text.format", "text.format"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "role"),
    ({"input": LONG}, "input", "context holds 1,024"),
])
def test_what_cannot_be_done_is_a_400_naming_it(smol, change, param, named):
    reply = httpx.post(smol.url + "/v1/responses", json={"model": SMOL, "input": "Hi", **change}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert named in error["message"]


def test_input_tokens_counts_an_input_longer_than_the_context(smol):
    assert _count(smol, input=LONG) > 1024


# --- function tools, on the demo pair ---------------------------------------------------------------------

WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}
ASK_WEATHER = "What is the weather in Paris right now? Use the tool."
# Without a word on when to stop, the 1.5B model calls the tool again once it has the result.
WEATHER_INSTRUCTIONS = ("You answer questions about the weather. Call get_weather once; once its result is in the "
                        "conversation, answer the user in one sentence from it.")


@pytest.fixture(scope="module")
def qwen(qwen_pair):
    server = LiveServer(ServedModel(qwen_pair, QWEN, mode="draft"))
    yield server
    server.stop()


def _city(arguments: str) -> str:
    args = json.loads(arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)
    return args["city"]


@pytest.mark.qwen
def test_function_call_then_its_output_answered(qwen):
    client = qwen.client()
    asked = [{"role": "user", "content": ASK_WEATHER}]
    response = client.responses.create(model=QWEN, instructions=WEATHER_INSTRUCTIONS, input=asked, tools=[WEATHER],
                                       max_output_tokens=48, temperature=0, store=False)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id and calls[0].status == "completed"
    assert "paris" in _city(calls[0].arguments).lower()
    # Codex's way: the whole conversation sent again, the call and its output as items.
    follow = asked + [item.model_dump(exclude_none=True) for item in response.output] + [
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature_c": 21, "sky": "clear"}'}]
    answer = client.responses.create(model=QWEN, instructions=WEATHER_INSTRUCTIONS, input=follow, tools=[WEATHER],
                                     max_output_tokens=40, temperature=0, store=False)
    assert [item.type for item in answer.output] == ["message"] and "21" in answer.output_text


@pytest.mark.qwen
def test_function_call_streamed_arguments_join_to_the_call(qwen):
    events = list(qwen.client().responses.create(
        model=QWEN, input="Hello! How are you?", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False, max_output_tokens=40, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.item.type for e in added] == ["function_call"] and added[0].item.name == "get_weather"
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert fragments and "".join(fragments) == done.arguments
    _city(done.arguments)
    assert kinds.index("response.output_item.added") < kinds.index("response.function_call_arguments.delta") \
        < kinds.index("response.function_call_arguments.done") < kinds.index("response.output_item.done")
    assert kinds[-1] == "response.completed"
    final = events[-1].response.output
    assert [item.type for item in final] == ["function_call"] and final[0].arguments == done.arguments
    assert final[0].call_id == added[0].item.call_id


@pytest.mark.qwen
def test_openai_agents_default_model_calls_its_tool(qwen):
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # (traces would go to OpenAI's servers)
    asked = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"The weather in {city}: 21 degrees C and clear."

    model = OpenAIResponsesModel(model=QWEN, openai_client=openai.AsyncOpenAI(
        base_url=qwen.url + "/v1", api_key="none", max_retries=0, timeout=300))
    # max_tokens: its max_output_tokens (absent, an answer may fill the context's room).
    agent = Agent(name="Weather", instructions=WEATHER_INSTRUCTIONS, model=model, tools=[get_weather],
                  model_settings=ModelSettings(max_tokens=60))
    result = Runner.run_sync(agent, ASK_WEATHER, max_turns=3)
    assert asked and "paris" in asked[0].lower()
    assert "21" in result.final_output
