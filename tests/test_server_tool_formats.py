"""Tool calls in the Mistral and Llama 3.x formats, end to end on a real model: SmolLM2's
weights behind a chat template written the way each family writes its own (tools shown to the
model, calls marked as that family marks them). `tool_choice: required` makes the grammar write
a call in that format; the server reads it back into `tool_calls`, whole and streamed, and a
tool result sent back renders through the same template."""

from __future__ import annotations

import json

import pytest

from speculum.server import tools
from live_server import MODEL

MISTRAL_STYLE = (
    "{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{%- elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}</s>"
    "{%- elif m.role == 'assistant' %}{{ m.content }}</s>"
    "{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{%- endif %}{%- endfor %}")
LLAMA3_STYLE = (
    "{%- for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>\n\n"
    "{%- if m.role == 'user' and loop.last and tools %}Answer with a JSON function call, "
    '{"name": function name, "parameters": dictionary of its arguments}, using one of:\n'
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}"
    '{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments }}}{% endfor %}'
    "{%- else %}{{ m.content }}{% endif %}<|eot_id|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(params=[("mistral", MISTRAL_STYLE), ("llama3", LLAMA3_STYLE)], ids=lambda p: p[0])
def family(request, decoder, monkeypatch):
    name, template = request.param
    monkeypatch.setattr(decoder.target, "chat_template", template)
    assert tools.call_format(template).name == name  # the template is read as that family's
    return name


def test_a_required_call_comes_back_as_tool_calls_whole_and_streamed(server, family):
    client = server(mode="lookup").client()
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=WEATHER, tool_choice="required",
                                           max_tokens=48, parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    streamed = client.chat.completions.create(model=MODEL, messages=ASK, tools=WEATHER, tool_choice="required",
                                              max_tokens=48, parallel_tool_calls=False, stream=True)
    parts, finish = {}, None
    for chunk in streamed:
        for delta in chunk.choices[0].delta.tool_calls or []:
            parts.setdefault(delta.index, []).append(delta.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and json.loads("".join(parts[0])) == json.loads(call.function.arguments)


def test_a_tool_result_sent_back_renders_and_is_answered(server, family):
    client = server(mode="lookup").client()
    called = {"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [called]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=WEATHER, tool_choice="none",
                                           max_tokens=16)
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls
