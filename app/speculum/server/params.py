"""Reading a request: the body within bounds, every parameter either implemented, harmless to
ignore, or refused by name, and the messages as the model's chat template takes them.

A parameter the server does not implement is a 400 that names it, never silently dropped:
a client asking for tools, a JSON answer or log-probabilities must not get prose that merely
looks like an answer.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any

from starlette.requests import Request

from ..engine.grammar.schema import grammar_for_response_format
from ..engine.sampling import SamplingParams
from ..errors import SpeculumError
from .errors import BadRequest
from .service import Completion, ServedModel
from .tools import ToolChoice, tool_use

MAX_STOP_SEQUENCES = 4
MAX_BODY_BYTES = 8 * 1024 * 1024  # far above any context's worth of text (~4 bytes a token)
BODY_TIMEOUT_S = 60.0  # a body trickled slower than this holds a connection for nothing
MAX_JSON_DEPTH = 64  # the deepest real request (tools' JSON schemas) is well within this
MIN_LONGEST_PIECE = 32  # characters: every real vocabulary has a token at least this long


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise BadRequest(f"'{name}' must be a number from {low:g} to {high:g}.", param=name)
    return float(value)


def _integer(body: dict, name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        raise BadRequest(f"'{name}' must be a whole number of at least {low}"
                         + (f" and at most {high:,}." if high is not None else "."), param=name)
    return value


def _text(content: Any, param: str) -> str:
    """A message content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"'{param}' may hold only text parts here.", param=param)
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"'{param}' must be a string or a list of text parts.", param=param)


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > MAX_STOP_SEQUENCES or not all(isinstance(s, str) for s in stop):
        raise BadRequest(f"'stop' must be a string or a list of up to {MAX_STOP_SEQUENCES} strings.", param="stop")
    return stop


def _prediction(body: dict) -> str | None:
    prediction = body.get("prediction")
    if prediction is None:
        return None
    if not isinstance(prediction, dict) or prediction.get("type") != "content":
        raise BadRequest("'prediction' must be {\"type\": \"content\", \"content\": ...}.", param="prediction")
    return _text(prediction.get("content"), "prediction.content")


MAX_TOP_LOGPROBS = 20  # OpenAI's bound (5 for completions' legacy logprobs)


def sampling_params(body: dict) -> SamplingParams:
    """The sampler's settings from a request in OpenAI's names (``temperature``, ``top_p``,
    ``top_k``, ``min_p``, ``seed``, the penalties): the one reading every API's request goes
    through (Anthropic's and the Responses API's are put in these names first)."""
    return SamplingParams(temperature=_number(body, "temperature", 1.0 if "temperature" in body else 0.0, 0, 2),
                          top_p=_number(body, "top_p", 1.0, 0, 1) or 1.0,
                          top_k=_integer(body, "top_k", 0) or 0, min_p=_number(body, "min_p", 0.0, 0, 1),
                          seed=_integer(body, "seed", -2**63, 2**63 - 1),
                          presence_penalty=_number(body, "presence_penalty", 0.0, -2, 2),
                          frequency_penalty=_number(body, "frequency_penalty", 0.0, -2, 2),
                          repeat_penalty=_number(body, "repeat_penalty", 1.0, 0.01, 10))


def _completion(served: ServedModel, body: dict, prompt: list[int], chat: bool) -> Completion:
    n_ctx = served.decoder.target.n_ctx
    max_tokens = _integer(body, "max_completion_tokens", 1, n_ctx) or _integer(body, "max_tokens", 1, n_ctx) or 256
    _integer(body, "n", 1, 1)
    _integer(body, "best_of", 1, 1)
    sampling = sampling_params(body)
    if not isinstance(body.get("stream", False), bool) and body.get("stream") is not None:
        raise BadRequest("'stream' must be true or false.", param="stream")
    if not isinstance(body.get("stream_options") or {}, dict):
        raise BadRequest("'stream_options' must be an object.", param="stream_options")
    return Completion(prompt, max_tokens, sampling, _stop(body), _prediction(body),
                      grammar=_response_grammar(body), logprobs=_logprobs(body, chat))


def _logprobs(body: dict, chat: bool) -> int | None:
    """None, or how many likeliest tokens to give with each token's log-probability."""
    if not chat:  # completions: 'logprobs' is itself the count
        return _integer(body, "logprobs", 0, 5)
    asked = body.get("logprobs")
    if asked is not None and not isinstance(asked, bool):
        raise BadRequest("'logprobs' must be true or false.", param="logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not asked:
        raise BadRequest("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
    return (top or 0) if asked else None


def _response_grammar(body: dict):
    """The grammar an answer in ``response_format`` follows (None: free text)."""
    try:
        return grammar_for_response_format(body.get("response_format"))
    except ValueError as exc:
        raise BadRequest(f"'response_format' cannot be enforced: {exc}", param="response_format") from None


# --- which parameters mean what ----------------------------------------------------------------------

def _off(*values):
    """A refused parameter's values that ask for nothing (the parameter's default)."""
    return lambda value: any(value == v and type(value) is type(v) for v in values)


# OpenAI's chat completions and completions parameters, plus llama.cpp's sampling extensions.
IMPLEMENTED = {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "n",
               "stop", "seed", "stream", "stream_options", "prediction", "response_format", "logprobs",
               "presence_penalty", "frequency_penalty", "repeat_penalty"}
CHAT_ONLY = {"messages", "tools", "tool_choice", "parallel_tool_calls", "top_logprobs"}
TEXT_ONLY = {"prompt", "best_of", "parse_special"}  # parse_special: read special tokens' names (ours)
# Harmless to ignore: bookkeeping for OpenAI's platform that changes no answer.
IGNORED = {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
           "prompt_cache_retention", "prompt_cache_options"}  # (this server's prompt cache is its own)
# Refused unless off: ignoring them would answer something other than what was asked.
REFUSED = {
    "functions": (_off(None, []), "function calls are not supported here"),
    "function_call": (_off(None, "none", "auto"), "function calls are not supported here"),
    "logit_bias": (_off(None, {}), "logit biases are not applied here"),
    "audio": (_off(None), "audio answers are not supported"),
    "modalities": (_off(None, ["text"]), "only text answers are supported"),
    "reasoning_effort": (_off(None), "this server runs no reasoning models' effort settings"),
    "verbosity": (_off(None), "verbosity settings are not supported"),
    "web_search_options": (_off(None), "web search is not supported"),
    "moderation": (_off(None), "moderation is not applied here"),
    "echo": (_off(None, False), "echoing the prompt is not supported"),
    "tools": (_off(None, []), "completions take no tools: use chat completions"),
    "suffix": (_off(None, ""), "insertion (suffix) is not supported"),
}


def check_parameters(body: dict, chat: bool) -> None:
    """Every parameter implemented, harmless to ignore, or off; else a 400 that names it."""
    own = CHAT_ONLY if chat else TEXT_ONLY
    for name, value in body.items():
        if name in IMPLEMENTED or name in own or name in IGNORED:
            continue
        if name in REFUSED:
            is_off, why = REFUSED[name]
            if is_off(value):
                continue
            raise BadRequest(f"'{name}' is not supported by this server: {why}.", param=name,
                             code="unsupported_parameter")
        where = "chat completions" if chat else "completions"
        raise BadRequest(f"Unknown parameter '{name}' for {where}.", param=name, code="unknown_parameter")


# --- messages ------------------------------------------------------------------------------------------

ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}
_TOOL_ROLE = re.compile(r"""['"]tool['"]""")


def template_renders_tools(template: str | None) -> bool:
    """Whether a chat template has tool turns of its own (Qwen's, Llama 3.1's, Mistral's...)."""
    return bool(template) and bool(_TOOL_ROLE.search(template)) and "tool_calls" in template


def chat_messages(body: dict, template: str | None) -> list[dict]:
    """The messages as the chat template takes them: text contents, tool turns where it has them."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list.", param="messages")
    tools_ok = template_renders_tools(template)
    return [_message(m, f"messages[{i}]", tools_ok) for i, m in enumerate(messages)]


def _message(m: Any, at: str, tools_ok: bool) -> dict:
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise BadRequest(f"{at} needs a role of system, user, assistant or tool.", param="messages")
    unknown = sorted(set(m) - MESSAGE_FIELDS)
    if unknown:
        raise BadRequest(f"'{at}.{unknown[0]}' is not supported by this server.", param=f"{at}.{unknown[0]}",
                         code="unsupported_parameter")
    role = "system" if m["role"] == "developer" else m["role"]
    calls = m.get("tool_calls")
    if (role == "tool" or calls) and not tools_ok:
        raise BadRequest(f"{at}: this model's chat template has no tool turns, so it cannot be shown "
                         f"{'a tool result' if role == 'tool' else 'tool calls'}.", param=at)
    content = m.get("content")
    clean = {"role": role, "content": "" if content is None and role == "assistant" else
             _text(content, f"{at}.content")}
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise BadRequest(f"'{at}.tool_call_id' must name the call this result answers.",
                             param=f"{at}.tool_call_id")
        clean["tool_call_id"] = m["tool_call_id"]
    if calls:
        clean["tool_calls"] = _tool_calls(calls, f"{at}.tool_calls")
    return clean


def _tool_calls(calls: Any, at: str) -> list[dict]:
    """An assistant's earlier tool calls, their arguments as objects (templates write them as JSON)."""
    if not isinstance(calls, list):
        raise BadRequest(f"'{at}' must be a list of calls.", param=at)
    clean = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments", ""), str):
            raise BadRequest(f"'{at}[{i}]' must be {{\"type\": \"function\", \"function\": "
                             "{\"name\": ..., \"arguments\": \"JSON text\"}}.", param=f"{at}[{i}]")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (ValueError, RecursionError):
            arguments = function["arguments"]  # as written: the template shows it as it came
        clean.append({"id": call.get("id"), "type": "function",
                      "function": {"name": function["name"], "arguments": arguments}})
    return clean


# --- the two kinds of request -----------------------------------------------------------------------------

def chat_request(served: ServedModel, body: dict, bound: "PromptBound") -> Completion:
    _check_model(served, body)
    check_parameters(body, chat=True)
    template = served.decoder.target.chat_template
    messages = chat_messages(body, template)
    bound.check(sum(len(m["content"]) for m in messages), "messages")
    use = tool_use(body, template)
    required = use is not None and use.choice is not ToolChoice.AUTO
    if required and body.get("response_format") not in (None, {"type": "text"}):
        raise BadRequest("'response_format' cannot be enforced while 'tool_choice' requires a call.",
                         param="response_format")
    try:
        prompt = served.chat_prompt(messages, use.tools if use is not None else None)
    except SpeculumError as exc:  # the template could not render these messages
        raise BadRequest(str(exc), param="messages") from None
    completion = _completion(served, body, prompt, chat=True)
    if use is not None:
        completion.tools = use
        # A required call's grammar from the first token; with 'auto', the calls' grammar waits
        # for the model to start one, unless the answer already follows a response_format.
        if use.choice is not ToolChoice.AUTO or completion.grammar is None:
            completion.grammar = use.grammar()
            use.enforced = True
    return completion


def text_request(served: ServedModel, body: dict, bound: "PromptBound") -> Completion:
    _check_model(served, body)
    check_parameters(body, chat=False)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("'prompt' must be a non-empty string.", param="prompt")
    bound.check(len(prompt), "prompt")
    special = body.get("parse_special", False)
    if not isinstance(special, bool):
        raise BadRequest("'parse_special' must be true or false.", param="parse_special")
    return _completion(served, body, served.text_prompt(prompt, parse_special=special), chat=False)


async def json_body(request: Request) -> dict:
    """The request's JSON object, read within bounds of size, time and nesting; text checked."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BadRequest(f"The request is larger than {MAX_BODY_BYTES // (1024 * 1024)} MB.")
    try:
        raw = await asyncio.wait_for(_read_body(request), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise BadRequest(f"The request body did not arrive within {BODY_TIMEOUT_S:g} seconds.") from None
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadRequest(f"The request's JSON is nested more than {MAX_JSON_DEPTH} levels deep.") from None
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    _check_json(body)
    return body


async def _read_body(request: Request) -> bytes:
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > MAX_BODY_BYTES:
            raise BadRequest(f"The request is larger than {MAX_BODY_BYTES // (1024 * 1024)} MB.")
    return bytes(raw)


def _check_json(body: dict) -> None:
    """Refuse nesting deeper than any request needs, and text that is not Unicode (lone surrogates)."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise BadRequest(f"The request's JSON is nested more than {MAX_JSON_DEPTH} levels deep.")
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise BadRequest(f"'{path}' holds a lone surrogate ({value[exc.start]!a}), which is not "
                                     "text: encode it as a pair or as UTF-8.", param=path or None) from None
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, path, depth + 1))
                stack.append((item, f"{path}.{key}" if path else str(key), depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


def _check_model(served: ServedModel, body: dict) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required.", param="model")
    if model != served.model_id:
        raise BadRequest(f"The model '{model}' is not served here; this server serves '{served.model_id}'.",
                         param="model", code="model_not_found")


class PromptBound:
    """Refuses, before tokenizing, a text too long for the context whatever its tokens.

    No token covers more characters than the vocabulary's longest piece, so a text longer than
    that many characters per context position cannot fit; tokenizing megabytes first would
    hold the event loop for seconds."""

    def __init__(self, served: ServedModel):
        self.served = served
        self.longest = 0

    def check(self, chars: int, param: str) -> None:
        target = self.served.decoder.target
        if chars <= target.n_ctx * MIN_LONGEST_PIECE:  # fits whatever the vocabulary: no need to look
            return
        if not self.longest:
            self.longest = max(MIN_LONGEST_PIECE, max(len(target.token_bytes(t)) for t in range(target.n_vocab)))
        if chars > target.n_ctx * self.longest:
            raise BadRequest(f"The prompt is {chars:,} characters, far more than the model's context of "
                             f"{target.n_ctx:,} tokens holds. Shorten it.", param=param,
                             code="context_length_exceeded")
