"""`speculum serve` refuses by name what it does not implement, takes tool turns where the
model's template has them, and says how it is (/health, /v1/models/{id}): the official openai
client against a real server on 127.0.0.1 over SmolLM2 (and Qwen2.5-Coder 0.5B for tool turns)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from speculum.engine.loading import load_decoder
from speculum.engine.settings import LoadOptions
from speculum.server.pace import Pace
from speculum.server.service import ServedModel, ServerState
from live_server import MESSAGES, MODEL, LiveServer
from speculum.protocol import Started, CycleEvent

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}

REFUSED_CHAT = [
    ("tools", {"tools": [TOOL]}),
    ("tool_choice", {"tool_choice": "required"}),
    ("functions", {"functions": [TOOL["function"]]}),
    ("function_call", {"function_call": {"name": "get_weather"}}),
    ("top_logprobs", {"top_logprobs": 3}),  # (without logprobs: true)
    ("response_format", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "strict": True, "schema": {"type": "bogus"}}}}),
    ("response_format", {"response_format": {"type": "xml"}}),
    ("logit_bias", {"logit_bias": {"42": -100}}),
    ("n", {"n": 2}),
    ("audio", {"audio": {"voice": "alloy", "format": "wav"}}),
    ("modalities", {"modalities": ["text", "audio"]}),
    ("reasoning_effort", {"reasoning_effort": "high"}),
    ("verbosity", {"verbosity": "low"}),
    ("web_search_options", {"web_search_options": {}}),
    ("mirostat", {"extra_body": {"mirostat": 2}}),
]


def count_requests(s) -> list:
    started = []
    s.served.on_event = lambda event: started.append(event.prompt_tokens) if isinstance(event, Started) else None
    return started


@pytest.mark.parametrize("name, options", REFUSED_CHAT, ids=[f"{n}-{i}" for i, (n, _) in enumerate(REFUSED_CHAT)])
def test_each_parameter_not_implemented_is_a_400_naming_it(server, name, options):
    s = server()
    started = count_requests(s)
    with pytest.raises(openai.BadRequestError) as refused:
        s.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, **options)
    assert refused.value.param == name and f"'{name}'" in refused.value.message
    assert started == []


@pytest.mark.parametrize("name, options", [
    ("echo", {"echo": True}), ("suffix", {"suffix": "end"}), ("logprobs", {"logprobs": 9}),
    ("best_of", {"best_of": 3}), ("presence_penalty", {"presence_penalty": 3}),
    ("messages", {"extra_body": {"messages": MESSAGES}}),
])
def test_text_completions_refuse_by_name_too(server, name, options):
    s = server()
    with pytest.raises(openai.BadRequestError) as refused:
        s.client().completions.create(model=MODEL, prompt="One, two,", max_tokens=4, **options)
    assert refused.value.param == name


def test_bookkeeping_parameters_and_parameters_left_off_are_accepted(server):
    s = server()
    reply = s.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, user="someone", metadata={"run": "7"}, store=False,
        service_tier="auto", safety_identifier="abc", prompt_cache_key="k", parallel_tool_calls=False,
        tools=[], tool_choice="none", response_format={"type": "text"}, logprobs=False,
        presence_penalty=0, frequency_penalty=0.0, logit_bias={}, n=1, modalities=["text"],
        extra_body={"top_k": 40, "min_p": 0.05})
    assert reply.choices[0].message.content


@pytest.fixture(scope="module")
def qwen_small(qwen_draft_path):
    d = load_decoder(qwen_draft_path, None, LoadOptions(n_ctx=1024))
    yield d
    d.target.close()


WEATHER = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 21, "sky": "clear"}'},
]


@pytest.mark.qwen
def test_tool_turns_reach_a_template_that_has_them(qwen_small):
    s = LiveServer(ServedModel(qwen_small, "qwen", mode="off"))
    try:
        reply = s.client().chat.completions.create(model="qwen", messages=WEATHER, max_tokens=4, temperature=0)
    finally:
        s.stop()
    assert reply.choices[0].message.content
    # The whole conversation was rendered, the call's arguments as the template writes JSON.
    target = qwen_small.target
    rendered = target.apply_chat_template([WEATHER[0], {
        "role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]}, WEATHER[2]])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in rendered
    assert "<tool_response>\n" + WEATHER[2]["content"] in rendered
    assert reply.usage.prompt_tokens == len(target.tokenize(rendered))


def test_a_template_without_tool_turns_says_so(server):
    s = server()
    with pytest.raises(openai.BadRequestError) as refused:
        s.client().chat.completions.create(model=MODEL, messages=WEATHER, max_tokens=4)
    assert "no tool turns" in refused.value.message and refused.value.param == "messages[1]"
    # An assistant turn without content is just an empty turn.
    reply = s.client().chat.completions.create(model=MODEL, max_tokens=4, messages=[
        {"role": "user", "content": "Hello"}, {"role": "assistant", "content": None},
        {"role": "user", "content": "Say hello again."}])
    assert reply.choices[0].message.content


def test_health_says_ready_or_why_not(server):
    s = server()
    health = httpx.get(s.url + "/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ready"
    assert health.json()["model"] == MODEL
    s.served.state = ServerState.WORKER_LOST
    s.served.state_message = "The RPC worker at 10.0.0.2:50052 stopped answering."
    lost = httpx.get(s.url + "/health", timeout=30)
    assert lost.status_code == 503 and lost.json()["status"] == "worker_lost"
    assert "10.0.0.2" in lost.json()["message"]
    assert httpx.get(s.url + "/health", headers={"Host": "evil.example"}, timeout=30).status_code == 403


def test_one_model_by_its_id(server):
    client = server().client()
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found" and "gpt-4o" in missing.value.message


def test_retry_after_is_the_running_requests_expected_remaining_time():
    now = [0.0]
    pace = Pace(clock=lambda: now[0])
    assert pace.retry_after() == 1  # nothing runs: a place frees at once
    pace.started(prompt_tokens=1000, max_tokens=100)
    pace.prompt_read(0, 1000)
    now[0] = 1.0
    pace.prompt_read(500, 1000)  # 500 prompt tokens a second
    now[0] = 2.0
    pace.prompt_read(1000, 1000)
    pace.wrote(1)  # the first pass ends the prompt
    now[0] = 3.0
    pace.wrote(4)  # then 4 tokens a second
    assert pace.remaining_s() == pytest.approx((100 - 5) / 4)
    now[0] = 4.0
    pace.wrote(4)
    pace.finished()  # answers here end after 9 tokens
    pace.started(prompt_tokens=250, max_tokens=2000)
    # Not the last request's 4 s times the queue: 250 tokens to read and ~9 to write.
    assert pace.remaining_s() == pytest.approx(250 / 500 + 9 / 4)
    assert pace.retry_after() == 3


def test_a_generation_that_fails_midway_ends_its_stream_with_an_error_and_done(server):
    s = server(mode="off")
    cycles = []

    def failing_view(cycle):  # an observer of the engine (the window's live view) that breaks
        cycles.append(cycle)
        if len(cycles) == 3:
            raise RuntimeError("the live view broke")

    s.served.on_event = lambda event: failing_view(event.cycle) if isinstance(event, CycleEvent) else None
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 40, "stream": True}
    with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=120) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][len("data: "):])["error"]
    assert "the live view broke" in error["message"] and error["type"] == "server_error"
    # The official client reports it as an error, not as a short answer.
    cycles.clear()
    with pytest.raises(openai.APIError, match="live view broke"):
        for _ in s.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=40, stream=True):
            pass
    s.served.on_event = None
    assert s.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4).choices[0].message.content


def test_requests_wait_for_a_model_that_is_loading(server):
    s = server()
    decoder = s.served.decoder
    s.served.loading("Loading the target model: 40%.")
    with pytest.raises(openai.InternalServerError) as loading:
        s.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert loading.value.status_code == 503 and loading.value.response.headers["Retry-After"]
    assert httpx.get(s.url + "/health", timeout=30).json()["status"] == "loading"
    s.served.loaded(decoder)
    assert s.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4).choices
