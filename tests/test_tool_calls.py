"""Reading tool calls back (pure logic: the parser and the stream splitter, no model): a call's
arguments are the JSON the model wrote, the same bytes whole and streamed however the text is
cut; calls written in another shape (doubled braces, fenced blocks, several bare ones) are read
as calls; and the grammar of the offered tools builds with each schema's ``$ref``s resolved in it."""


import pytest

from speculum.engine.grammar.lazy import LazyGrammar
from speculum.engine.grammar.state import Grammar
from speculum.server import callstream, tools
from speculum.server.errors import BadRequest

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _use(fmt=tools.HERMES, enforced=False):
    return tools.ToolUse(tools=[], format=fmt, choice=tools.ToolChoice.AUTO, parameters={"get_weather": PARAMS},
                         enforced=enforced)


def _streamed(text, size, fmt=tools.HERMES, enforced=False):
    stream, sent, deltas = callstream.CallStream(_use(fmt, enforced)), [], []
    for i in range(0, len(text), size):
        piece, found = stream.feed(text[i:i + size])
        sent.append(piece)
        deltas += found
    piece, found = stream.finish()
    calls: dict[int, list[str]] = {}
    for d in deltas + found:
        calls.setdefault(d["index"], []).append(d["function"]["arguments"])
    return "".join(sent) + piece, ["".join(parts) for _, parts in sorted(calls.items())]


CALL = '{"name": "get_weather", "arguments": {"city": "Oslo", "note": "a } in \\"text\\""}}'
SHAPES = [  # answer, content, the arguments of its calls
    (f"<tool_call>\n{CALL}\n</tool_call>", None, ['{"city": "Oslo", "note": "a } in \\"text\\""}']),
    ('<tool_call>\n{"name": "get_weather", "arguments":{"city":"Lima"}}\n</tool_call>', None, ['{"city":"Lima"}']),
    ('<tool_call>\n{{"name": "get_weather", "arguments": {"city": "Rome"}}}\n</tool_call>', None,
     ['{"city": "Rome"}']),
    ('{{"name": "get_weather", "arguments": {"city": "Rome"}}}', None, ['{"city": "Rome"}']),
    ('Sure.\n```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```', "Sure.", ['{"city": "Oslo"}']),
    ('```json\n[{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
     '{"name": "get_weather", "arguments": {"city": "Rome"}}]\n```', None, ['{"city": "Oslo"}', '{"city": "Rome"}']),
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}\n{"name": "get_weather", "arguments": {"city": "Rome"}}',
     None, ['{"city": "Oslo"}', '{"city": "Rome"}']),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>\n'
     '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>', None,
     ['{"city": "Oslo"}', '{"city": "Rome"}']),
    ('<tool_call>\n{"arguments": {"city": "Oslo"}, "name": "get_weather"}\n</tool_call>', None, ['{"city": "Oslo"}']),
    # Bare calls that open the answer, then text (streamed from their heads: see below)
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}\n\nDone: one call.', "Done: one call.",
     ['{"city": "Oslo"}']),
    ('{"name":"get_weather","arguments":{"city":"Oslo"}}\n{"name":"get_weather","arguments":{"city":"Rome"}}\n'
     '{"answer": "not a call, and longer than forty characters"}', '{"answer": "not a call, and longer than forty characters"}',
     ['{"city":"Oslo"}', '{"city":"Rome"}']),
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "a } in text"}\n{"answer": 1}', '{"answer": 1}',
     ['{"city": "Oslo"}']),
    # Fenced calls, as Qwen's 1.5B writes Claude Code's (streamed from their heads too)
    ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Oslo"\n  }\n}\n```', None,
     ['{\n    "city": "Oslo"\n  }']),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n{"name": "get_weather", "arguments": '
     '{"city": "Rome"}}\n```\nDone.', "Done.", ['{"city": "Oslo"}', '{"city": "Rome"}']),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\nThat is the call.\n```', "That is the call.",
     ['{"city": "Oslo"}']),
]


@pytest.mark.parametrize("enforced", [False, True], ids=["free", "grammar"])
@pytest.mark.parametrize("text, content, arguments", SHAPES, ids=range(len(SHAPES)))
def test_calls_in_every_shape_are_read_and_streamed_byte_for_byte(text, content, arguments, enforced):
    found_content, calls = tools.parse_calls(text, _use())
    assert found_content == content and [c.arguments for c in calls] == arguments
    for size in (1, 2, 3, 7, 1000):
        sent, streamed = _streamed(text, size, enforced=enforced)
        assert streamed == arguments, size
        assert sent.strip() == (content or ""), size


def test_arguments_begin_where_the_model_wrote_them_whatever_the_chunks():
    # The space after "arguments": arriving alone in a chunk of its own was sent as the arguments' start.
    pieces = ['<tool_call>\n{"name": "get_weather", "arguments":', " ", '{"city": "Paris"}', "}\n</tool_call>"]
    stream, args = callstream.CallStream(_use()), []
    for piece in pieces:
        args += [d["function"]["arguments"] for d in stream.feed(piece)[1]]
    assert "".join(args) == '{"city": "Paris"}' == tools.parse_calls("".join(pieces), _use())[1][0].arguments


def test_a_bare_call_streams_from_its_head_as_the_lazy_grammar_makes_it_a_call():
    # Qwen's 1.5B writes agents' calls without <tool_call>: held to the answer's end, such a call
    # reached Claude Code seconds after its first token (issue 48's time to first token).
    stream = callstream.CallStream(_use())
    assert stream.feed('{"name": "get_wea') == ("", [])
    text, deltas = stream.feed('ther", "arguments": {"ci')
    assert text == "" and deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"ci'
    text, deltas = stream.feed('ty": "Oslo"}}\n{"name": "get_weather", "arguments": {')
    assert [d["index"] for d in deltas] == [0, 1, 1] and deltas[1]["function"]["name"] == "get_weather"
    assert stream.feed('"city": "Rome"}}')[1] == [{"index": 1, "function": {"arguments": '"city": "Rome"}'}}]
    assert stream.finish() == ("", [])


def test_under_the_calls_grammar_a_bare_call_begins_at_its_name():
    # The lazy grammar holds an answer that opens with '{"name"' to calls: what follows the name
    # is its arguments, so the client hears of the call a few tokens sooner.
    stream = callstream.CallStream(_use(enforced=True))
    text, deltas = stream.feed('{"name": "get_weather"')
    assert text == "" and deltas == [{"index": 0, "id": deltas[0]["id"], "type": "function",
                                      "function": {"name": "get_weather", "arguments": ""}}]
    assert stream.feed(', "argu') == ("", [])
    assert stream.feed('ments": {"city": "Oslo"}}') == ("", [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}])
    assert stream.finish() == ("", [])
    # Another shape, as only another grammar lets a model write: its arguments as read whole
    stream = callstream.CallStream(_use(enforced=True))
    deltas = stream.feed('{"name": "get_weather", "id": 3, "arguments": {"city": "Rome"}}')[1] + stream.finish()[1]
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city": "Rome"}'
    # Cut short between its name and its arguments (max_tokens): a call with none
    stream = callstream.CallStream(_use(enforced=True))
    assert len(stream.feed('{"name": "get_weather", "')[1]) == 1 and stream.finish() == ("", [])


def test_a_fenced_call_streams_from_its_head():
    stream = callstream.CallStream(_use())
    assert stream.feed('Reading it.\n```json\n{\n  "name": "get_weather",\n') == ("Reading it.\n", [])
    text, deltas = stream.feed('  "arguments": {\n    "city": "Os')
    assert text == "" and deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert "".join(d["function"]["arguments"] for d in deltas) == '{\n    "city": "Os'
    assert stream.feed('lo"\n  }\n}\n``') == ("", [{"index": 0, "function": {"arguments": 'lo"\n  }'}}])
    assert stream.feed("`\nDone.") == ("Done.", []) and stream.finish() == ("", [])


def test_code_fences_that_are_no_calls_stream_as_text():
    text = "Here:\n```python\nprint('{\"name\": 1}')\n```\nand ```json\n{\"a\": 1}\n``` done."
    assert tools.parse_calls(text, _use()) == (text, [])
    for size in (1, 5, 1000):
        assert _streamed(text, size) == (text, [])


NESTED = {"type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
          "required": ["items"], "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}},
                                                    "required": ["n"]}}}
OTHER = {"type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}},
         "$defs": {"Item": {"type": "string"}}}  # the same name, another schema


def _request(choice):
    return {"tools": [{"type": "function", "function": {"name": "order", "parameters": NESTED}},
                      {"type": "function", "function": {"name": "label", "parameters": OTHER}}],
            "tool_choice": choice}


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "order"}}])
def test_each_tools_refs_resolve_in_its_own_schema(choice):
    use = tools.tool_use(_request(choice), "{% if tools %}<tool_call>{% endif %}")
    grammar = use.grammar()
    assert isinstance(grammar, LazyGrammar if choice == "auto" else Grammar)
    gbnf = grammar.grammar.gbnf if isinstance(grammar, LazyGrammar) else grammar.gbnf
    assert "t0-Item" in gbnf  # order's Item (an object), not label's (a string)


def test_a_tool_schema_that_cannot_be_enforced_is_a_400_naming_keyword_and_place():
    body = {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"v": {"type": "integer", "multipleOf": 5}}}}}]}
    with pytest.raises(BadRequest) as refused:
        tools.tool_use(body, "{% if tools %}<tool_call>{% endif %}").grammar()
    assert "'multipleOf' at tools[0].function.parameters.properties.v" in str(refused.value)


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n{"name": "get_weather", "arguments": {"city": "Par',
])
def test_a_call_cut_short_by_max_tokens_is_a_call_whole_and_streamed(text):
    content, calls = tools.parse_calls(text, _use())
    assert content is None and calls[-1].name == "get_weather" and calls[-1].arguments == '{"city": "Par'
    for size in (1, 4, 1000):
        assert _streamed(text, size) == ("", [c.arguments for c in calls])


# Shapes from Claude Code's own tools (a captured request): each enforced, none a 400.
AGENT_TOOLS = [
    ("WebFetch", {"type": "object", "properties": {"url": {"type": "string", "format": "uri"},
                                                   "prompt": {"type": "string"}}, "required": ["url", "prompt"],
                  "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}),
    ("TaskOutput", {"type": "object", "properties": {"timeout": {"type": "number", "minimum": 0, "maximum": 600000}}}),
    ("Read", {"type": "object", "properties": {"offset": {"type": "integer", "minimum": 0,
                                                          "maximum": 9007199254740991},
                                               "limit": {"type": "integer", "exclusiveMinimum": 0}}}),
    ("TaskCreate", {"type": "object", "properties": {"metadata": {"type": "object", "propertyNames": {"type": "string"},
                                                                  "additionalProperties": {}}}}),
    ("Workflow", {"type": "object", "properties": {"script": {"type": "string", "maxLength": 524288},
                                                   "args": {"description": "any JSON value"}}}),
]


def test_an_agents_tool_schemas_build_one_grammar():
    body = {"tools": [{"type": "function", "function": {"name": name, "parameters": schema}}
                      for name, schema in AGENT_TOOLS]}
    grammar = tools.tool_use(body, "{% if tools %}<tool_call>{% endif %}").grammar()
    assert isinstance(grammar, LazyGrammar) and "Workflow" in grammar.grammar.gbnf


def test_under_the_calls_grammar_a_marked_call_begins_at_its_name_or_sooner():
    # Hermes calls began once '"arguments": {' was read, 8-12 tokens after <tool_call>; under the
    # grammar the name is all a client needs first, and it is known as soon as one offered name
    # begins as written (the grammar forces the rest of it).
    use = tools.ToolUse(tools=[], format=tools.HERMES, choice=tools.ToolChoice.AUTO, enforced=True,
                        parameters={"get_weather": PARAMS, "get_time": PARAMS, "Edit": PARAMS, "EditFile": PARAMS})
    stream = callstream.CallStream(use)
    assert stream.feed("Checking.\n<tool_call>\n") == ("Checking.\n", [])
    assert stream.feed('{"name": "get_') == ("", [])  # get_weather or get_time: not yet
    text, deltas = stream.feed("w")
    assert text == "" and [d["function"] for d in deltas] == [{"name": "get_weather", "arguments": ""}]
    assert stream.feed("eat") == ("", []) and stream.feed("her") == ("", [])  # the rest of its name: read
    assert stream.feed('", "arguments": {"city": ') == ("", [{"index": 0, "function": {"arguments": '{"city":'}}])
    assert stream.feed('"Oslo"}}\n</tool_call>\n<tool_call>\n{"name": "Edit')[1] == [
        {"index": 0, "function": {"arguments": ' "Oslo"}'}}]  # Edit or EditFile: not yet
    text, deltas = stream.feed('", "arguments": {"city": "Rome"}}\n</tool_call>')
    assert [d["function"].get("name") for d in deltas] == ["Edit", None]
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city": "Rome"}'
    assert stream.feed("\nDone.") == ("Done.", []) and stream.finish() == ("", [])


def test_with_one_tool_under_its_grammar_a_call_begins_at_its_opening():
    stream = callstream.CallStream(_use(enforced=True))
    text, deltas = stream.feed('<tool_call>\n{"name": "')
    assert text == "" and deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert stream.feed('get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')[1] == [
        {"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]
    assert stream.finish() == ("", [])
