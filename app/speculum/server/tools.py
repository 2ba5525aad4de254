"""Tool calls: a request's `tools` and `tool_choice` read, shown to the model through its own
chat template, enforced by a grammar when a call is required, and parsed back out of its answer.

Models write calls in their template's own format: Hermes/Qwen ``<tool_call>{json}</tool_call>``,
Mistral ``[TOOL_CALLS][{json}, ...]``, or Llama 3.x's bare ``{"name": ..., "parameters": ...}``.
Which one a model uses is read from its template.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..engine.grammar.lazy import LazyGrammar, Trigger
from ..engine.grammar.schema import convert, prepare
from ..engine.grammar.state import Grammar
from ..engine.vocabulary import Word
from .errors import BadRequest

MAX_TOOLS = 128
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass(frozen=True)
class CallFormat:
    """How one family of templates writes a call: the text around it and its arguments' key."""
    name: str
    opening: str  # before each call ("" for Llama's bare JSON)
    closing: str  # after each call
    arguments_key: str  # "arguments" or Llama's "parameters"
    in_list: bool = False  # Mistral: one marker, then a JSON list of calls
    separator: str = "\n"  # between calls
    triggers: tuple[Trigger, ...] = ()  # where a call starts, in an answer that may also talk
    bare_trigger: bool = False  # a marked format whose model may forget the marker (answers a bare call)


# A call's JSON begins so; the grammar spells it without spaces inside (llama.cpp's converter).
_BARE_OPENING = Trigger('{"name"', at_start=True)
HERMES = CallFormat("hermes", "<tool_call>\n", "\n</tool_call>", "arguments",
                    triggers=(Trigger("<tool_call>"), _BARE_OPENING), bare_trigger=True)
MISTRAL = CallFormat("mistral", "[TOOL_CALLS]", "", "arguments", in_list=True, triggers=(Trigger("[TOOL_CALLS]"),))
LLAMA3 = CallFormat("llama3", "", "", "parameters", separator=";",
                    triggers=(_BARE_OPENING,))


def call_format(template: str | None) -> CallFormat | None:
    """The format a chat template teaches its model to call tools in; None: it has no tools."""
    if not template or "tools" not in template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template or "[AVAILABLE_TOOLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or "ipython" in template or '"parameters"' in template:
        return LLAMA3
    return None


class ToolChoice(Word):
    """Which call a request asks for: any or none (the model decides), at least one, or the named one."""
    AUTO = "auto"
    REQUIRED = "required"
    FUNCTION = "function"  # the one named in ``ToolUse.required_name``


@dataclass
class ToolUse:
    """What a request asks about tools: the definitions to show, and which call (if any) is required."""
    tools: list[dict]
    format: CallFormat
    choice: ToolChoice
    required_name: str | None = None
    parameters: dict[str, dict] = field(default_factory=dict)  # each function's JSON schema
    parallel: bool = True  # whether a required call may be followed by more
    places: dict[str, str] = field(default_factory=dict)  # each function's schema's place in the request
    enforced: bool = False  # the answer's grammar is these calls' (``grammar``): a call it starts is one

    def grammar(self) -> Grammar | LazyGrammar:
        """The calls' grammar in the model's format, over the offered functions and their argument
        schemas: from the first token for required or named calls; for ``auto``, held back until
        the model starts a call (its format's ``triggers``), so every call it starts is valid."""
        names = [self.required_name] if self.required_name else list(self.parameters)
        fmt = self.format
        try:
            body = call_gbnf(names, self.parameters, fmt.arguments_key, self.places)
            one = f"{_gbnf(fmt.opening)} root {_gbnf(fmt.closing)}" if fmt.opening else "root"
            if fmt.in_list:
                more = '("," " "? root)*' if self.parallel else ""
                calls = f'{_gbnf(fmt.opening)} "[" root {more} "]"'
            else:
                calls = f'{one} ({_gbnf(fmt.separator)} {one})*' if self.parallel else one
            if self.choice is not ToolChoice.AUTO:
                return Grammar(f"{body}\ntool-calls ::= {calls}\n", root="tool-calls")
            # Lazily: the format's own calls, or (where the format's calls are marked) bare ones,
            # as a model writes them when it forgets the marker.
            bare = ' root ("\\n"{0,2} root)*' if self.parallel else " root"
            lazy = f"{calls} | {bare}" if fmt.opening and fmt.bare_trigger else calls
            return LazyGrammar(Grammar(f"{body}\ntool-calls ::= {lazy}\n", root="tool-calls"),
                               fmt.triggers)
        except ValueError as exc:
            raise BadRequest(f"The tools' parameters cannot be enforced: {exc}", param="tools") from None


def _gbnf(text: str) -> str:
    return json.dumps(text) if text else '""'


def call_gbnf(names: list[str], parameters: dict[str, dict], arguments_key: str,
              places: dict[str, str] | None = None) -> str:
    """GBNF whose root is one call, ``{"name": ..., "<arguments_key>": ...}``, of any of ``names``,
    each function's arguments following its own schema (its ``$ref``s resolved in it)."""
    places = places or {}
    alternatives, defs, rules = [], {}, {}
    for i, name in enumerate(names):
        prepared = prepare(parameters[name], places.get(name, f"tools[{i}].function.parameters"), f"t{i}")
        defs.update(prepared.defs)
        rules.update(prepared.rules)
        alternatives.append({"type": "object", "properties": {"name": {"const": name},
                                                               arguments_key: prepared.schema},
                             "required": ["name", arguments_key], "additionalProperties": False})
    return convert({"anyOf": alternatives, "$defs": defs}, rules)


def tool_use(body: dict, template: str | None) -> ToolUse | None:
    """The request's tools, checked; None when none are to be shown (absent, empty, or choice none)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise BadRequest("'tool_choice' asks for a call but no 'tools' are given.", param="tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise BadRequest(f"'tools' must be a list of up to {MAX_TOOLS} tools.", param="tools")
    parameters, places = {}, {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not _NAME.match(function["name"]):
            raise BadRequest(f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                             "\"parameters\": {...}}}} with a name of letters, digits, '_', '.' or '-'.",
                             param=f"tools[{i}]")
        schema = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(schema, dict):
            raise BadRequest(f"'tools[{i}].function.parameters' must be a JSON schema object.",
                             param=f"tools[{i}].function.parameters")
        parameters[function["name"]] = schema
        places[function["name"]] = f"tools[{i}].function.parameters"
    kind, name = _choice(choice, parameters)
    if kind is None:
        return None  # the model is shown no tools, and so calls none
    fmt = call_format(template)
    if fmt is None:
        raise BadRequest("This model's chat template has no tool support, so it cannot be given 'tools'.",
                         param="tools", code="unsupported_parameter")
    return ToolUse(tools=[{"type": "function", "function": t["function"]} for t in tools], format=fmt,
                   choice=kind, required_name=name, parameters=parameters,
                   parallel=body.get("parallel_tool_calls") is not False, places=places)


def _choice(choice: Any, parameters: dict) -> tuple[ToolChoice | None, str | None]:
    """The choice asked for (None: no tools at all) and the function it names."""
    if choice is None or choice == "auto":
        return ToolChoice.AUTO, None
    if choice == "none":
        return None, None
    if choice == "required":
        return ToolChoice.REQUIRED, None
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise BadRequest("'tool_choice' must be 'none', 'auto', 'required' or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}.", param="tool_choice")
    if name not in parameters:
        raise BadRequest(f"'tool_choice' names the function '{name[:64]}', which is not among 'tools'.",
                         param="tool_choice")
    return ToolChoice.FUNCTION, name


# --- reading calls back ------------------------------------------------------------------------------
#
# A call's arguments are the JSON text the model wrote for them, as it wrote it (the grammar
# keeps it compact): the same bytes whole and streamed. Only a call read in another shape (keys
# in another order, arguments given as a JSON string) has them re-serialised.

@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI returns it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


_DECODER = json.JSONDecoder()
# The head of a call, up to where its arguments begin: the name is known from here on.
CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_FENCE = re.compile(r"```[a-zA-Z]*[ \t]*\n(.*?)\n?```", re.S)


def _call(obj: Any, fmt: CallFormat, names: set[str], text: str = "", at: int = -1) -> ToolCall | None:
    """A call from one parsed JSON object, if it is one (a known name, object arguments);
    ``text[at:]`` is where the object was written, for its arguments' own text."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get(fmt.arguments_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"], _written(text, at, obj["name"]) or json.dumps(arguments, ensure_ascii=False))


def _written(text: str, at: int, name: str) -> str | None:
    """The arguments' JSON text as written in the call object at ``text[at:]`` (None: not so)."""
    head = CALL_HEAD.match(text, at) if at >= 0 else None
    if head is None or head.group(1) != name or text[head.end():head.end() + 1] != "{":
        return None
    try:
        _, end = _DECODER.raw_decode(text, head.end())
    except (ValueError, RecursionError):
        return None
    return text[head.end():end]


def _values(text: str) -> tuple[list[tuple[Any, int]], int | None]:
    """The JSON values ``text`` holds one after another (separated by blanks, ',' or ';'), each
    with where it starts, and where what is no value begins (None: nothing). A value in doubled
    braces (``{{...}}``, a template's escape copied) is read as the object inside."""
    found, i, n = [], 0, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,;":
            i += 1
        if i >= n:
            return found, None
        doubled = text.startswith("{{", i)
        start = i + 1 if doubled else i
        try:
            value, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            return found, start
        if doubled:
            while end < n and text[end] in " \t\r\n":
                end += 1
            if not text.startswith("}", end):
                return found, start
            end += 1
        found.append((value, start))
        i = end


def calls_in(text: str, fmt: CallFormat, names: set[str]) -> list[ToolCall] | None:
    """The calls ``text`` is made of (one, several, a list of them, or fenced), or None when it
    holds anything that is no call. A call cut short at the end (max_tokens) is a call with its
    arguments as they stand, as they were streamed."""
    fenced = _FENCE.fullmatch(text.strip())
    inner = fenced.group(1) if fenced else text
    values, rest = _values(inner)
    calls = []
    for value, at in values:
        items = [(item, -1) for item in value] if isinstance(value, list) else [(value, at)]
        for item, where in items:
            call = _call(item, fmt, names, inner, where)
            if call is None:
                return None
            calls.append(call)
    if rest is not None:
        cut = _cut_call(inner, rest, names)
        if cut is None or fenced:
            return None
        calls.append(cut)
    return calls or None


def _cut_call(text: str, at: int, names: set[str]) -> ToolCall | None:
    """The call begun at ``text[at:]`` and cut short before its end, if it is one."""
    head = CALL_HEAD.match(text, at)
    if head is None or head.group(1) not in names or text[head.end():head.end() + 1] != "{":
        return None
    arguments = CallArguments()
    arguments.feed(text[head.end():])
    return None if arguments.done else ToolCall(head.group(1), text[head.end():])  # (closed: malformed, no cut)


def parse_calls(text: str, use: ToolUse) -> tuple[str | None, list[ToolCall]]:
    """The answer's text outside any calls (None when empty), and its calls in order."""
    fmt, names = use.format, set(use.parameters)
    if fmt is HERMES:
        calls, rest, at = [], [], 0
        for match in re.finditer(r"<tool_call>(.*?)(?:</tool_call>|$)", text, re.S):
            found = calls_in(match.group(1), fmt, names)
            if not found:
                continue  # not a call after all: left in the text
            calls += found
            rest.append(text[at:match.start()])
            at = match.end()
        rest.append(text[at:])
        if not calls:  # small models also write bare calls, in doubled braces or a fenced block
            return _loose_calls(text, fmt, names)
        content = "".join(rest).strip()
        return content or None, calls
    stripped = text.strip()
    if fmt is MISTRAL:
        if not stripped.startswith("[TOOL_CALLS]"):
            return text or None, []
        calls = calls_in(stripped[len("[TOOL_CALLS]"):], fmt, names)
    else:  # Llama 3.x: the whole answer is one call (or several, ';'-separated)
        calls = calls_in(stripped.removeprefix("<|python_tag|>"), fmt, names)
    return (None, calls) if calls else (text or None, [])


def _loose_calls(text: str, fmt: CallFormat, names: set[str]) -> tuple[str | None, list[ToolCall]]:
    """Calls written without their marker: the whole answer, calls that open it (the text after
    them its content), or fenced blocks within it."""
    whole = calls_in(text, fmt, names)
    if whole:
        return None, whole
    leading = _leading_calls(text, fmt, names)
    if leading is not None:
        return leading
    calls, rest, at = [], [], 0
    for match in _FENCE.finditer(text):
        found, inside = calls_in(match.group(1), fmt, names), None
        if not found:  # calls that open the block, then text (as CallStream streams them)
            inside, found = _leading_calls(match.group(1), fmt, names) or (None, None)
        if found:
            calls += found
            rest += [text[at:match.start()], inside or ""]
            at = match.end()
    if not calls:
        return text or None, []
    rest.append(text[at:])
    return "".join(rest).strip() or None, calls


def _leading_calls(text: str, fmt: CallFormat, names: set[str]) -> tuple[str | None, list[ToolCall]] | None:
    """Bare calls that open the answer and the text after them, as CallStream streams them (a
    model that calls, then talks); None when the answer does not open with one."""
    values, rest = _values(text)
    calls = []
    for value, at in values:
        call = _call(value, fmt, names, text, at)
        if call is None:
            rest = at
            break
        calls.append(call)
    if not calls:
        return None
    return (text[rest:].strip() or None) if rest is not None else None, calls


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


class CallArguments:
    """Follows a call's arguments object as it is written: which of its characters may be sent
    now (``ready``), and whether it has closed (``done``). Blanks outside strings are held
    until something follows them, so what is sent is exactly the object's text."""

    def __init__(self) -> None:
        self.text = ""
        self.depth, self.in_string, self.escaped, self.done = 0, False, False, False
        self.ready = 0

    def feed(self, text: str) -> int:
        """How many characters of ``text`` belong to the object (all, until it closes)."""
        for i, c in enumerate(text):
            self.text += c
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (c == "\\", c != '"')
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
            if self.in_string or not c.isspace():
                self.ready = len(self.text)
            if self.depth == 0:
                self.done = True
                return i + 1
        return len(text)
