"""Reading a request of Anthropic's Messages API into the chat request the OpenAI routes take
(``messages``, ``tools``, ``tool_choice``, sampling), so it goes the same way: the model's chat
template, the tools' grammar, the prompt cache, speculation. Every field is used, ignored because
it does not apply to a local model, or refused with a 400 that names it.
"""

from __future__ import annotations

import functools
import json
import re
from typing import TYPE_CHECKING, Any

from ..engine.grammar.keywords import check_node
from ..engine.grammar.schema import prepare, schema_gbnf
from .errors import BadRequest
from .params import chat_request
from .service import Completion

if TYPE_CHECKING:
    from .api import Api

MAX_STOP_SEQUENCES = 64
# Claude Code's first system block: a header for Anthropic's billing, not for the model. Its text
# changes from request to request, so kept it would spoil the prompt cache from the first token.
BILLING_HEADER = "x-anthropic-billing-header:"

MESSAGE_FIELDS = {"model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p",
                  "top_k", "tools", "tool_choice", "seed"}  # (seed: Speculum's, as in its OpenAI API)
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice"}
# What a client sends that does not apply to a local model (or to this server's own prompt
# cache, which needs no breakpoints): accepted and ignored. output_config's "format" is
# honoured; its "effort", ignored.
IGNORED = {"metadata", "thinking", "context_management", "output_config", "service_tier", "cache_control",
           "inference_geo", "speed", "user_profile_id", "workspace_id"}
TOOL_FIELDS = {"type", "name", "description", "input_schema", "cache_control", "strict"}
ROLES = ("user", "assistant", "system")


def _joined(parts: list[str]) -> str:
    """Text blocks as one text: a line break between two that would otherwise run together."""
    out = ""
    for part in parts:
        if out and part and not out[-1].isspace() and not part[0].isspace():
            out += "\n"
        out += part
    return out


def _blocks(content: Any, at: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) and isinstance(b.get("type"), str)
                                                for b in content):
        raise BadRequest(f"'{at}' must be a string or a list of content blocks, each with a 'type'.", param=at)
    return content


def _text(block: dict, at: str) -> str:
    if not isinstance(block.get("text"), str):
        raise BadRequest(f"'{at}.text' must be a string.", param=f"{at}.text")
    return block["text"]


def _refused(block: dict, at: str, allowed: str) -> BadRequest:
    kind = block["type"][:40]
    if kind in ("image", "document"):
        return BadRequest(f"'{at}' is {'an' if kind == 'image' else 'a'} {kind} block: this server's models read "
                          "text only. Send the "
                          "content as text blocks.", param=at, code="unsupported_content")
    return BadRequest(f"'{at}': a '{kind}' block is not supported here ({allowed}).", param=at,
                      code="unsupported_content")


def _texts(content: Any, at: str) -> str:
    """Content that may hold only text blocks (the system prompt, a tool's result)."""
    parts = []
    for j, block in enumerate(_blocks(content, at)):
        if block["type"] != "text":
            raise _refused(block, f"{at}[{j}]", "text blocks only")
        parts.append(_text(block, f"{at}[{j}]"))
    return _joined(parts)


class Conversation:
    """An Anthropic request's turns as the chat template takes them (OpenAI's message shape), and
    where each came from: an error about a turn names the client's own field."""

    def __init__(self, body: dict):
        self.messages: list[dict] = []
        self.origins: list[str] = []
        self.prefill = ""  # a last assistant turn's text: the answer continues it
        system = body.get("system")
        if system is not None:
            blocks = _blocks(system, "system")
            for j, block in enumerate(blocks):
                if block["type"] != "text":
                    raise _refused(block, f"system[{j}]", "text blocks only")
            text = _joined([_text(b, f"system[{j}]") for j, b in enumerate(blocks)
                            if not _text(b, f"system[{j}]").startswith(BILLING_HEADER)])
            if text:
                self._add({"role": "system", "content": text}, "system")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list.", param="messages")
        for i, message in enumerate(messages):
            self._turn(message, f"messages[{i}]", last=i == len(messages) - 1)

    def _add(self, message: dict, origin: str) -> None:
        self.messages.append(message)
        self.origins.append(origin)

    def _turn(self, m: Any, at: str, last: bool) -> None:
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"'{at}' needs a role of user, assistant or system.", param=at)
        unknown = sorted(set(m) - {"role", "content"})
        if unknown:
            raise BadRequest(f"'{at}.{unknown[0]}' is not supported by this server.", param=f"{at}.{unknown[0]}",
                             code="unsupported_parameter")
        role = m["role"]
        texts, calls, results = [], [], []
        for j, block in enumerate(_blocks(m.get("content"), f"{at}.content")):
            where, kind = f"{at}.content[{j}]", block["type"]
            if kind == "text":
                texts.append(_text(block, where))
            elif kind == "tool_use" and role == "assistant":
                calls.append(_call(block, where))
            elif kind == "tool_result" and role == "user":
                results.append(_result(block, where))
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue  # a local model's answers have none; another model's are not shown to this one
            else:
                raise _refused(block, where, {"user": "text and tool_result blocks", "system": "text blocks",
                                              "assistant": "text and tool_use blocks"}[role])
        for result in results:
            self._add(result, at)
        if role == "assistant" and last and calls:
            raise BadRequest(f"'{at}' ends the conversation with tool calls: send their results in a user turn.",
                             param=at)
        if role == "assistant" and last:
            self.prefill = _joined(texts)  # Anthropic's prefill: the answer goes on from here
        elif role == "assistant":
            if texts or calls:
                self._add({"role": "assistant", "content": _joined(texts),
                           **({"tool_calls": calls} if calls else {})}, at)
        elif texts or not results:
            self._add({"role": role, "content": _joined(texts)}, at)

    def origin(self, index: int) -> str:
        return self.origins[index] if 0 <= index < len(self.origins) else f"messages[{index}]"


def _call(block: dict, at: str) -> dict:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
            or not isinstance(block.get("input", {}), dict):
        raise BadRequest(f"'{at}' must be {{\"type\": \"tool_use\", \"id\": ..., \"name\": ..., \"input\": {{...}}}}.",
                         param=at)
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}}


def _result(block: dict, at: str) -> dict:
    if not isinstance(block.get("tool_use_id"), str):
        raise BadRequest(f"'{at}.tool_use_id' must name the tool_use this result answers.", param=f"{at}.tool_use_id")
    content = block.get("content", "")
    text = _texts(content, f"{at}.content") if content != "" else ""
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _tools(tools: Any) -> list[dict] | None:
    """Anthropic's custom tools ({name, description, input_schema}) as OpenAI's function tools."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of tools.", param="tools")
    functions = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise BadRequest(f"'{at}' must be {{\"name\": ..., \"input_schema\": {{...}}}}.", param=at)
        if tool.get("type") not in (None, "custom"):
            raise BadRequest(f"'{at}' is the server tool '{str(tool['type'])[:60]}', which runs on Anthropic's own "
                             "servers: give it as a custom tool ({name, description, input_schema}).", param=at,
                             code="unsupported_parameter")
        unknown = sorted(set(tool) - TOOL_FIELDS)
        if unknown:
            raise BadRequest(f"'{at}.{unknown[0]}' is not supported by this server.", param=f"{at}.{unknown[0]}",
                             code="unsupported_parameter")
        if not isinstance(tool.get("input_schema"), dict):
            raise BadRequest(f"'{at}.input_schema' must be a JSON schema object.", param=f"{at}.input_schema")
        schema = tool["input_schema"] if tool.get("strict") is True else enforceable(tool["input_schema"])
        function = {"name": tool.get("name"), "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    return functions


# Where a schema holds schemas: one, a list of them, or a map of names to them.
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames", "additionalItems",
        "unevaluatedItems", "unevaluatedProperties")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def enforceable(schema: dict) -> dict:
    """A tool's input schema as its calls' grammar can hold them to: itself, or without what no
    grammar here enforces (``relaxed``), or any object. Anthropic holds a tool's calls to its
    schema only with ``strict: true``; without it, a keyword the grammar refuses (``uniqueItems``,
    ``multipleOf``, ...) would have every request that offers the tool refused."""
    kept = _enforceable(json.dumps(schema))  # (remembered: an agent sends the same tools every turn)
    return schema if kept is None else json.loads(kept)


@functools.lru_cache(maxsize=256)
def _enforceable(schema_text: str) -> str | None:
    """The schema to use instead, as JSON text; None: the schema itself (key order kept: the
    model is shown, and writes, the properties in it)."""
    schema = json.loads(schema_text)
    for candidate in (schema, relaxed(schema)):
        try:
            schema_gbnf(candidate)  # (the converter too: it refuses what prepare lets by)
        except ValueError:
            continue
        return None if candidate is schema else json.dumps(candidate)
    return json.dumps({"type": "object"})


def relaxed(schema: Any) -> Any:
    """``schema`` without the keywords a grammar here would refuse where they stand (a superset
    of what it allows: calls still follow everything else)."""
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    kept = {"type": kind} if "type" in schema else {}
    for key, value in schema.items():
        if key == "type":
            continue
        holds = key in _ONE or key in _LIST or key in _MAP  # (its schemas are relaxed in turn)
        probe = {**{k: v for k, v in kept.items() if not (k in _ONE or k in _LIST or k in _MAP)
                    and (k != "type" or isinstance(v, str))}, key: value}
        try:
            check_node(probe, "") if holds else prepare(probe, "", "probe")  # (prepare: counts, patterns too)
        except (ValueError, TypeError):
            continue  # refused here: left out
        if key in _ONE:
            value = relaxed(value)
        elif key in _LIST and isinstance(value, list):
            value = [relaxed(item) for item in value]
        elif key in _MAP and isinstance(value, dict):
            value = {name: relaxed(item) for name, item in value.items()}
        kept[key] = value
    return kept


def _tool_choice(choice: Any) -> tuple[Any, bool]:
    """OpenAI's tool_choice for Anthropic's, and whether several calls may follow one another."""
    if choice is None:
        return None, True
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none") or (kind == "tool" and not isinstance(choice.get("name"), str)):
        raise BadRequest("'tool_choice' must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or "
                         "{\"type\": \"tool\", \"name\": ...}.", param="tool_choice")
    parallel = choice.get("disable_parallel_tool_use") is not True
    if kind == "tool":
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def _output_format(config: Any) -> dict | None:
    """output_config.format (a JSON schema the answer follows) as OpenAI's response_format."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise BadRequest("'output_config' must be an object.", param="output_config")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise BadRequest("'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}.",
                         param="output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "strict": True, "schema": fmt["schema"]}}


def _stop_sequences(body: dict) -> list[str]:
    stops = body.get("stop_sequences")
    if stops is None:
        return []
    if not isinstance(stops, list) or len(stops) > MAX_STOP_SEQUENCES or not all(isinstance(s, str) for s in stops):
        raise BadRequest(f"'stop_sequences' must be a list of up to {MAX_STOP_SEQUENCES} strings.",
                         param="stop_sequences")
    return stops


def _max_tokens(body: dict) -> int:
    value = body.get("max_tokens")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest("'max_tokens' is required: a whole number of at least 1 (it is capped to the room the "
                         "context leaves).", param="max_tokens")
    return value


# OpenAI's names in the errors of the shared request path, and Anthropic's for them.
_RENAMED = [(re.compile(r"tools\[(\d+)\]\.function\.parameters"), r"tools[\1].input_schema"),
            (re.compile(r"\bresponse_format\b"), "output_config.format")]


def _renamed(exc: BadRequest, conversation: Conversation) -> BadRequest:
    def fix(text: str) -> str:
        text = re.sub(r"messages\[(\d+)\]", lambda m: conversation.origin(int(m.group(1))), text)
        for pattern, name in _RENAMED:
            text = pattern.sub(name, text)
        return text
    return BadRequest(fix(str(exc)), param=fix(exc.param) if exc.param else None, code=exc.code)


def message_request(api: Api, body: dict, counting: bool = False) -> Completion:
    """A /v1/messages request (or count_tokens's) read into a completion of the chat path."""
    fields = COUNT_FIELDS if counting else MESSAGE_FIELDS
    for name in body:
        if name not in fields and name not in IGNORED:
            raise BadRequest(f"'{name[:100]}' is not supported by this server.", param=name[:100],
                             code="unsupported_parameter")
    max_tokens = 1 if counting else _max_tokens(body)
    stops = [] if counting else _stop_sequences(body)
    conversation = Conversation(body)
    choice, parallel = _tool_choice(body.get("tool_choice"))
    chat = {"model": body.get("model"), "messages": conversation.messages,
            **{name: body[name] for name in ("temperature", "top_p", "top_k", "seed", "stream") if name in body}}
    tools = _tools(body.get("tools"))
    if tools is not None:
        chat["tools"] = tools
    if choice is not None:
        chat["tool_choice"] = choice
    if not parallel:
        chat["parallel_tool_calls"] = False
    if (response_format := _output_format(body.get("output_config"))) is not None:
        chat["response_format"] = response_format
    served = api.served
    try:
        completion = chat_request(served, chat, api.bound)
    except BadRequest as exc:
        raise _renamed(exc, conversation) from None
    target = served.decoder.target
    if conversation.prefill:
        completion.prompt += target.tokenize(conversation.prefill, add_special=False, parse_special=False)
    room = target.n_ctx - len(completion.prompt)
    if room < 1 and not counting:  # (in the words Claude Code looks for to compact its conversation)
        raise BadRequest(f"prompt is too long: {len(completion.prompt)} tokens > {target.n_ctx - 1} maximum "
                         f"(the model's context holds {target.n_ctx:,} tokens; speculum serve --ctx sets it).",
                         param="messages", code="context_length_exceeded")
    completion.max_tokens = max(1, min(max_tokens, room))  # agents ask 32,000: never refused for asking more
    completion.stop = stops
    return completion
