"""OpenAI's Responses API: ``POST /v1/responses``, ``POST /v1/responses/input_tokens`` and
``GET /v1/responses/{id}``, the API Codex CLI and openai-agents speak.

A Responses request is read into the chat request it means (instructions and ``input`` items as
messages, the flat function tools as chat tools, ``text.format`` as ``response_format``) and
then goes the chat path's way: the same checks, chat template, grammar, tool-call parsing and
``ServedModel.run``. What comes back is put in Responses' shapes (``responses_out``).

Responses kept (``store``, the default) are held in memory, the last ``KEPT`` of them, so that
``previous_response_id`` can continue one; ``store: false`` keeps nothing. ``prompt_cache_key``
is accepted: the prompt cache finds the longest saved prefix of every prompt by its tokens, so
a conversation continued under its key is found already, and a key adds nothing it could steer.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .api import Api, error
from .params import chat_request, json_body
from .responses_out import Answer, ItemType, ResponseStream
from .errors import BadRequest
from .service import Completion
from .streaming import CLIENT_GONE, collected, first_piece, until_disconnected

log = logging.getLogger("speculum.serve")

KEPT = 64  # responses kept for previous_response_id (a Codex turn's history is ~100 kB: a few MB at most)

# Responses' own parameters that the chat path implements under another name or shape.
READ_HERE = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
             "max_output_tokens", "temperature", "top_p", "stream", "store", "previous_response_id"}
# llama.cpp's sampling extensions, as on chat completions.
PASSED = {"seed", "top_k", "min_p"}
# Accepted, changing no answer here: platform bookkeeping, reasoning settings of reasoning models
# (no model served here reasons in OpenAI's way) and what to include of their output.
IGNORED = {"reasoning", "include", "metadata", "user", "safety_identifier", "service_tier", "prompt_cache_key",
           "prompt_cache_retention", "client_metadata", "stream_options"}
# Refused unless off: ignoring them would answer something other than what was asked.
OFF = {"background": (None, False), "conversation": (None,), "max_tool_calls": (None,), "top_logprobs": (None, 0),
       "prompt": (None,), "truncation": (None, "disabled")}

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = {"input_text", "output_text", "text", "refusal"}


def routes(api: Api) -> list[Route]:
    responses = Responses(api)
    return [Route("/v1/responses", _logged(api.guarded(responses.create)), methods=["POST"]),
            Route("/v1/responses/input_tokens", _logged(api.guarded(responses.input_tokens)), methods=["POST"]),
            Route("/v1/responses/{response_id}", _logged(api.guarded(responses.retrieve)), methods=["GET"])]


def _logged(route):
    """A route whose refusals are logged: an agent that fails shows why in the server's log."""
    async def logged(request: Request) -> Response:
        response = await route(request)
        if response.status_code >= 400 and isinstance(response, JSONResponse):
            log.warning("%s %s: %d %s", request.method, request.url.path, response.status_code,
                        json.loads(response.body)["error"]["message"])
        return response
    return logged


@dataclass
class Kept:
    """A stored response: its conversation without instructions (they are not carried on), and
    the response object as the client got it."""
    history: list[dict]  # chat messages, the answer's own last
    response: dict


@dataclass
class Asked:
    """One Responses request read: the chat request it means, and what the answer repeats back."""
    body: dict
    chat: dict  # the chat completions body it means
    history: list[dict]  # the conversation's messages without the instructions
    sources: list[str]  # for each chat message, where in the request it came from


class Responses:
    """The routes' work: requests read into chat completions, answers kept for continuing."""

    def __init__(self, api: Api):
        self.api = api
        self.kept: OrderedDict[str, Kept] = OrderedDict()

    async def create(self, request: Request) -> Response:
        if (loading := await self.api.unavailable()) is not None:
            return loading
        read = self.read(await json_body(request))
        completion = self.completion(read)
        served = self.api.served
        completion.client = request.client.host if request.client is not None else ""
        answer = Answer(read.body, served.model_id, completion)
        pieces = until_disconnected(request, served.run(completion))
        if read.body.get("stream") is not True:
            text, done = await collected(pieces)
            answer.text(text)
            if done is None:  # the client went away
                return Response(status_code=CLIENT_GONE)
            whole = answer.finish(done)
            self.keep(read, answer, whole)
            return JSONResponse(whole)
        # The first piece is awaited a moment here, so a busy server still answers 429; then the
        # events begin while the prompt is read.
        first = await first_piece(pieces)
        if first is None:
            return Response(status_code=CLIENT_GONE)
        stream = ResponseStream(answer, first, pieces, lambda whole: self.keep(read, answer, whole))
        return StreamingResponse(stream.events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def input_tokens(self, request: Request) -> Response:
        """How many tokens the request's input (with its instructions and tools) takes."""
        if (loading := await self.api.unavailable()) is not None:
            return loading
        body = await json_body(request)
        body.pop("stream", None)
        completion = self.completion(self.read(body), counting=True)
        return JSONResponse({"object": "response.input_tokens", "input_tokens": len(completion.prompt)})

    async def retrieve(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        kept = self.kept.get(response_id)
        if kept is None:
            return error(404, f"No response '{response_id[:100]}' is kept here: {_KEPT_WHICH}", param="response_id",
                         code="not_found")
        return JSONResponse(kept.response)

    # -- reading a request --

    def read(self, body: dict) -> Asked:
        """The request's chat completions body: every field used, ignored by design, or refused by name."""
        for name, value in body.items():
            if name in READ_HERE or name in PASSED or name in IGNORED:
                continue
            if name in OFF:
                if any(value == off and type(value) is type(off) for off in OFF[name]):
                    continue
                raise BadRequest(f"'{name}' is not supported by this server.", param=name, code="unsupported_parameter")
            raise BadRequest(f"Unknown parameter '{name}' for responses.", param=name, code="unknown_parameter")
        for name in ("stream", "store", "parallel_tool_calls"):
            if body.get(name) is not None and not isinstance(body[name], bool):
                raise BadRequest(f"'{name}' must be true or false.", param=name)
        history, sources = self._earlier(body.get("previous_response_id"))
        items = body.get("input")
        if isinstance(items, str):
            items = [{"type": ItemType.MESSAGE, "role": "user", "content": items}]
        if not isinstance(items, list) or (not items and not history):
            raise BadRequest("'input' must be a non-empty string or list of items.", param="input")
        for i, item in enumerate(items):
            _item(item, f"input[{i}]", history, sources)
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise BadRequest("'instructions' must be a string.", param="instructions")
        messages, at = _with_instructions(instructions, history, sources)
        chat = {"model": body.get("model"), "messages": messages, **{k: body[k] for k in PASSED if k in body}}
        for name in ("temperature", "top_p", "stream", "parallel_tool_calls"):
            if name in body:
                chat[name] = body[name]
        if body.get("tools") is not None:
            chat["tools"] = _tools(body["tools"])
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
        text = body.get("text")
        if text is not None:
            if not isinstance(text, dict):
                raise BadRequest("'text' must be an object such as {\"format\": {\"type\": \"text\"}}.", param="text")
            chat["response_format"] = _format(text.get("format"))
        return Asked(body, chat, history, at)

    def completion(self, read: Asked, counting: bool = False) -> Completion:
        """The chat path's completion for the request, at most the context's room long (``counting``:
        only its prompt is wanted, which may be longer than the context)."""
        served = self.api.served
        n_ctx = served.decoder.target.n_ctx
        asked = read.body.get("max_output_tokens")
        if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
            raise BadRequest("'max_output_tokens' must be a whole number of at least 1.", param="max_output_tokens")
        read.chat["max_tokens"] = min(asked or n_ctx, n_ctx)
        try:
            completion = chat_request(served, read.chat, self.api.bound)
            if not counting:
                served.check_fits(completion)
        except BadRequest as exc:
            raise _in_responses_terms(exc, read.sources) from None
        # Asking for more than fits is never an error (agents ask for their model's maximum); a
        # prompt that does not fit is (check_fits).
        completion.max_tokens = max(1, min(completion.max_tokens, n_ctx - len(completion.prompt)))
        return completion

    def _earlier(self, previous: Any) -> tuple[list[dict], list[str]]:
        """The conversation a previous response ended, to continue."""
        if previous is None:
            return [], []
        if not isinstance(previous, str):
            raise BadRequest("'previous_response_id' must be a response's id.", param="previous_response_id")
        kept = self.kept.get(previous)
        if kept is None:
            raise BadRequest(f"The response '{previous[:100]}' is not kept here, so it cannot be continued: "
                             f"{_KEPT_WHICH} Send the whole conversation as 'input' instead.",
                             param="previous_response_id", code="previous_response_not_found")
        self.kept.move_to_end(previous)
        return [dict(m) for m in kept.history], ["previous_response_id"] * len(kept.history)

    def keep(self, read: Asked, answer: Answer, whole: dict) -> None:
        """Keep a finished response for previous_response_id (unless ``store`` is false)."""
        if read.body.get("store") is False:
            return
        self.kept[whole["id"]] = Kept(read.history + answer.messages(), whole)
        while len(self.kept) > KEPT:
            self.kept.popitem(last=False)


_KEPT_WHICH = (f"this server keeps, in memory, the last {KEPT} responses made with 'store' true (the default) "
               "since it started.")


# --- input items as chat messages ------------------------------------------------------------------------

def _item(item: Any, at: str, messages: list[dict], sources: list[str]) -> None:
    """Add one input item to the chat ``messages`` (``sources``: where each came from)."""
    if not isinstance(item, dict):
        raise BadRequest(f"'{at}' must be an object.", param=at)
    kind = item.get("type", ItemType.MESSAGE)
    if kind == ItemType.MESSAGE:
        role = ROLES.get(item.get("role"))
        if role is None:
            raise BadRequest(f"'{at}.role' must be user, assistant, system or developer.", param=f"{at}.role")
        messages.append({"role": role, "content": _content(item.get("content"), f"{at}.content")})
        sources.append(at)
    elif kind == ItemType.FUNCTION_CALL:
        for name in ("call_id", "name", "arguments"):
            if not isinstance(item.get(name), str):
                raise BadRequest(f"'{at}.{name}' must be a string.", param=f"{at}.{name}")
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and sources[-1] != "previous_response_id":
            last.setdefault("tool_calls", []).append(call)  # one turn: its text and its calls
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            sources.append(at)
    elif kind == ItemType.FUNCTION_CALL_OUTPUT:
        if not isinstance(item.get("call_id"), str):
            raise BadRequest(f"'{at}.call_id' must name the call this output answers.", param=f"{at}.call_id")
        messages.append({"role": "tool", "tool_call_id": item["call_id"],
                         "content": _content(item.get("output"), f"{at}.output")})
        sources.append(at)
    elif kind != ItemType.REASONING:  # another model's reasoning, resent: nothing the model here can read
        raise BadRequest(f"'{at}' is an item of type '{str(kind)[:64]}', which this server does not take: "
                         "only message, function_call and function_call_output items.", param=at,
                         code="unsupported_parameter")


def _content(content: Any, at: str) -> str:
    """A message's text: a string, or text parts (input_text, output_text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"'{at}' must be a string or a list of text parts.", param=at)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise BadRequest(f"'{at}[{j}]' is a part of type '{str(kind)[:64]}': this server takes text only "
                             "(input_text, output_text).", param=f"{at}[{j}]", code="unsupported_parameter")
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise BadRequest(f"'{at}[{j}].text' must be a string.", param=f"{at}[{j}]")
        texts.append(text)
    return "".join(texts)


def _with_instructions(instructions: str | None, history: list[dict], sources: list[str]):
    """The messages with the instructions and the system (developer) turns that open the
    conversation as one system message: templates take one system turn, at the start."""
    lead = 0
    while lead < len(history) and history[lead]["role"] == "system":
        lead += 1
    system = ([instructions] if instructions else []) + [m["content"] for m in history[:lead]]
    if not system:
        return list(history), list(sources)
    where = sources[0] if lead else "instructions"
    return ([{"role": "system", "content": "\n\n".join(system)}] + history[lead:], [where] + sources[lead:])


# --- tools and formats in chat's shapes ------------------------------------------------------------------

def _tools(tools: Any) -> list[dict]:
    """Responses' flat function tools in chat's shape; built-in tools refused by name."""
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of tools.", param="tools")
    shaped = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise BadRequest(f"'tools[{i}]' is a tool of type '{str(kind)[:64]}', which this server does not run: "
                             "only function tools (type 'function').", param=f"tools[{i}]",
                             code="unsupported_parameter")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        shaped.append({"type": "function", "function": function})
    return shaped


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice  # none, auto, required: as on chat
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    kind = choice.get("type") if isinstance(choice, dict) else None
    raise BadRequest(f"'tool_choice' of type '{str(kind)[:64]}' is not supported here: use 'none', 'auto', "
                     "'required' or {\"type\": \"function\", \"name\": ...}.", param="tool_choice")


def _format(fmt: Any) -> dict | None:
    """``text.format`` as chat's ``response_format``."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest("'text.format' must be an object.", param="text.format")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    return fmt  # text, json_object, or what the chat path refuses by name


_RENAMED = [(re.compile(r"\bresponse_format\b"), "text.format"), (re.compile(r"\bmax_tokens\b"), "max_output_tokens"),
            (re.compile(r"\btools\[(\d+)\]\.function\."), r"tools[\1].")]


def _in_responses_terms(exc: BadRequest, sources: list[str]) -> BadRequest:
    """A chat path's refusal with the names the client used: ``messages[3]`` is ``input[5]``."""
    def renamed(text: str | None) -> str | None:
        if text is None:
            return None
        text = re.sub(r"\bmessages\[(\d+)\]",
                      lambda m: sources[int(m.group(1))] if int(m.group(1)) < len(sources) else m.group(0), text)
        text = re.sub(r"\bmessages\b", "input", text)
        for pattern, name in _RENAMED:
            text = pattern.sub(name, text)
        return text
    return BadRequest(renamed(str(exc)), param=renamed(exc.param), code=exc.code)


