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

from ..engine.grammar import Grammar
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


HERMES = CallFormat("hermes", "<tool_call>\n", "\n</tool_call>", "arguments")
MISTRAL = CallFormat("mistral", "[TOOL_CALLS]", "", "arguments", in_list=True)
LLAMA3 = CallFormat("llama3", "", "", "parameters")


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


@dataclass
class ToolUse:
    """What a request asks about tools: the definitions to show, and which call (if any) is required."""
    tools: list[dict]
    format: CallFormat
    choice: str  # "auto", "required", or "function" (the one named in ``required_name``)
    required_name: str | None = None
    parameters: dict[str, dict] = field(default_factory=dict)  # each function's JSON schema
    parallel: bool = True  # whether a required call may be followed by more

    def grammar(self) -> Grammar | None:
        """For required or named calls: the grammar of one or more calls in the model's format."""
        if self.choice == "auto":
            return None
        names = [self.required_name] if self.required_name else list(self.parameters)
        call = {"anyOf": [{"type": "object",
                           "properties": {"name": {"const": name}, self.format.arguments_key: self.parameters[name]},
                           "required": ["name", self.format.arguments_key], "additionalProperties": False}
                          for name in names]}
        try:
            body = Grammar.from_json_schema(call).gbnf
            fmt = self.format
            if fmt.in_list:
                more = '("," " "? root)*' if self.parallel else ""
                wrap = f'tool-calls ::= {_gbnf(fmt.opening)} "[" root {more} "]"\n'
            elif fmt.opening:
                one = f'{_gbnf(fmt.opening)} root {_gbnf(fmt.closing)}'
                more = f'("\\n" {one})*' if self.parallel else ""
                wrap = f"tool-calls ::= {one} {more}\n"
            else:
                wrap = "tool-calls ::= root\n"
            return Grammar(body + "\n" + wrap, root="tool-calls")
        except ValueError as exc:
            raise BadRequest(f"The tools' parameters cannot be enforced: {exc}", param="tools") from None


def _gbnf(text: str) -> str:
    return json.dumps(text) if text else '""'


def tool_use(body: dict, template: str | None) -> ToolUse | None:
    """The request's tools, checked; None when none are to be shown (absent, empty, or choice none)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise BadRequest("'tool_choice' asks for a call but no 'tools' are given.", param="tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise BadRequest(f"'tools' must be a list of up to {MAX_TOOLS} tools.", param="tools")
    parameters = {}
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
    kind, name = _choice(choice, parameters)
    if kind == "none":
        return None  # the model is shown no tools, and so calls none
    fmt = call_format(template)
    if fmt is None:
        raise BadRequest("This model's chat template has no tool support, so it cannot be given 'tools'.",
                         param="tools", code="unsupported_parameter")
    return ToolUse(tools=[{"type": "function", "function": t["function"]} for t in tools], format=fmt,
                   choice=kind, required_name=name, parameters=parameters,
                   parallel=body.get("parallel_tool_calls") is not False)


def _choice(choice: Any, parameters: dict) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if choice in ("none", "auto", "required"):
        return choice, None
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise BadRequest("'tool_choice' must be 'none', 'auto', 'required' or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}.", param="tool_choice")
    if name not in parameters:
        raise BadRequest(f"'tool_choice' names the function '{name[:64]}', which is not among 'tools'.",
                         param="tool_choice")
    return "function", name


# --- reading calls back ------------------------------------------------------------------------------

@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI returns it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call(obj: Any, fmt: CallFormat, names: set[str]) -> ToolCall | None:
    """A call from one parsed JSON object, if it is one (a known name, object arguments)."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get(fmt.arguments_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _unfenced(text: str) -> str:
    """The text without a Markdown code fence around it."""
    match = re.fullmatch(r"\s*```[a-z]*\s*\n(.*?)\n?```\s*", text, re.S)
    return match.group(1) if match else text.strip()


def parse_calls(text: str, use: ToolUse) -> tuple[str | None, list[ToolCall]]:
    """The answer's text outside any calls (None when empty), and its calls in order."""
    fmt, names = use.format, set(use.parameters)
    if fmt is HERMES:
        calls, rest, at = [], [], 0
        for match in re.finditer(r"<tool_call>(.*?)(?:</tool_call>|$)", text, re.S):
            call = _call(_json(match.group(1).strip()), fmt, names)
            if call is None:
                continue  # not a call after all: left in the text
            calls.append(call)
            rest.append(text[at:match.start()])
            at = match.end()
        rest.append(text[at:])
        content = "".join(rest).strip()
        if calls:
            return content or None, calls
        call = _call(_json(_unfenced(text)), fmt, names)  # small models also write the bare call
        return (None, [call]) if call is not None else (text or None, [])
    stripped = text.strip()
    if fmt is MISTRAL:
        if not stripped.startswith("[TOOL_CALLS]"):
            return text or None, []
        items = _json(stripped[len("[TOOL_CALLS]"):].strip())
        items = items if isinstance(items, list) else [items]
    else:  # Llama 3.x: the whole answer is one call (or several, ';'-separated)
        stripped = stripped.removeprefix("<|python_tag|>").strip()
        items = [_json(part) for part in stripped.split(";")] if stripped.startswith("{") else []
    calls = [_call(item, fmt, names) for item in items]
    if not calls or any(c is None for c in calls):
        return text or None, []
    return None, calls


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
# The head of a Hermes call, up to where its arguments begin: the name is known from here on.
_BARE_CALL = re.compile(r'\s*(```[a-z]*\s*)?\{\s*"name"')
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*')


class CallStream:
    """Splits a streamed answer into text to send now and tool-call deltas in OpenAI's chunk
    shape: a call's index, id, type and name first, then its arguments in fragments.

    Hermes calls stream as they are written: the name once the call's head is read, then the
    arguments, holding back only what may be the call's end. Text that may start a call is held
    back. Formats without a closing marker (Mistral, Llama 3.x) and bare JSON calls are held
    from their first character to the end when they look like calls, and sent whole then.
    """

    def __init__(self, use: ToolUse):
        self.use = use
        self.pending = ""
        self.count = 0  # calls sent (begun)
        self.whole = False  # holding everything to the end (an answer that starts like a call)
        self.started = False  # any text seen that is not whitespace
        self.streaming: str | None = None  # inside a Hermes call: the arguments sent so far

    def feed(self, text: str) -> tuple[str, list[dict]]:
        self.pending += text
        fmt = self.use.format
        if not self.started and self.pending.strip():
            self.started = True
            head = self.pending.lstrip()
            markers = {LLAMA3: ("{", "<|python_tag|>"), MISTRAL: ("[TOOL_CALLS]",), HERMES: ("{", "```")}[fmt]
            self.whole = any(head.startswith(m) or m.startswith(head) for m in markers)
        if self.whole and fmt is HERMES and not _BARE_CALL.match(self.pending) and len(self.pending.strip()) > 40:
            self.whole = False  # a code block or JSON that is no call: streamed as text after all
        if self.whole or not self.started:
            return "", []
        if fmt is not HERMES:
            out, self.pending = self.pending, ""
            return out, []
        return self._hermes()

    def _hermes(self) -> tuple[str, list[dict]]:
        out, deltas = [], []
        while True:
            if self.streaming is None:
                start = self.pending.find(_OPEN)
                if start < 0:
                    hold = _partial_tail(self.pending, _OPEN)
                    out.append(self.pending[:len(self.pending) - hold])
                    self.pending = self.pending[len(self.pending) - hold:]
                    break
                head = _HEAD.match(self.pending, start + len(_OPEN))
                if head is None or head.group(1) not in self.use.parameters:
                    if _CLOSE in self.pending[start:] or (head is None and len(self.pending) - start > 200):
                        end = self.pending.find(_CLOSE, start)
                        end = len(self.pending) if end < 0 else end + len(_CLOSE)
                        out.append(self.pending[:end])  # not a call after all: text
                        self.pending = self.pending[end:]
                        continue
                    out.append(self.pending[:start])
                    self.pending = self.pending[start:]
                    break
                out.append(self.pending[:start])
                deltas.append(self._begin(head.group(1)))
                self.pending, self.streaming = self.pending[head.end():], ""
            end = self.pending.find(_CLOSE)
            end_of_text = end if end >= 0 else len(self.pending) - _partial_tail(self.pending, _CLOSE)
            body = self.pending[:end_of_text]
            # The arguments end before the call object's last "}": held back until the call closes.
            cut = body.rstrip()
            cut = cut[:-1] if cut.endswith("}") else cut
            if len(cut) > len(self.streaming):
                deltas.append({"index": self.count - 1, "function": {"arguments": cut[len(self.streaming):]}})
                self.streaming = cut
            if end < 0:
                break
            self.pending, self.streaming = self.pending[end + len(_CLOSE):].lstrip("\n"), None
        text = "".join(out)
        return ("" if self.count and not text.strip() else text), deltas

    def _begin(self, name: str) -> dict:
        self.count += 1
        return {"index": self.count - 1, "id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                "function": {"name": name, "arguments": ""}}

    def finish(self) -> tuple[str, list[dict]]:
        """What was held back, at the end of the answer."""
        rest, self.pending = self.pending, ""
        if self.streaming is not None:  # a call cut short (max_tokens): its arguments as they stand
            sent, self.streaming = self.streaming, None
            more = rest[len(sent):]
            return "", [{"index": self.count - 1, "function": {"arguments": more}}] if more else []
        if not rest:
            return "", []
        content, calls = parse_calls(rest, self.use)
        deltas = []
        for call in calls:
            first = self._begin(call.name)
            first["id"] = call.id
            deltas.append(first)
            deltas += [{"index": self.count - 1, "function": {"arguments": fragment}}
                       for fragment in argument_fragments(call.arguments)]
        return content or "", deltas


def _partial_tail(text: str, marker: str) -> int:
    """How many of ``text``'s last characters are the start of ``marker``."""
    return max((n for n in range(min(len(marker) - 1, len(text)), 0, -1) if text.endswith(marker[:n])), default=0)


def argument_fragments(arguments: str, size: int = 16) -> list[str]:
    """A call's arguments in pieces, as OpenAI streams them."""
    return [arguments[i:i + size] for i in range(0, len(arguments), size)] or [""]
