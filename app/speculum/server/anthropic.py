"""Anthropic's Messages API over the served model: ``POST /v1/messages`` and
``/v1/messages/count_tokens``, for Claude Code and the anthropic SDKs.

A request is read (``anthropic_request``) into the chat request the OpenAI routes take, so it
goes the same way: the model's chat template, the tools' grammar, the prompt cache, speculation.
The answer is told in Anthropic's shapes (content blocks, ``stop_reason``, ``usage``, its
server-sent events), and so is every error on these routes (``errors.shaped_for``).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import SpeculumError
from .anthropic_request import message_request
from .api import Api, error
from .errors import ANTHROPIC_PATHS, BadRequest, WorkerUnreachable, shaped_for
from .params import json_body
from .service import Completion, Done
from .streaming import CLIENT_GONE, Paced, collected, first_piece, until_disconnected
from .callstream import CallStream
from .tools import ToolUse, parse_calls

log = logging.getLogger("speculum.serve")

PING_S = 10.0  # while the prompt is read (minutes on a CPU for an agent's first turn), a ping this often


class Block(enum.Enum):
    """The kinds of content block an answer is made of."""
    TEXT = "text"
    TOOL_USE = "tool_use"


# --- the answer in Anthropic's shapes --------------------------------------------------------------------

def _usage(done: Done) -> dict:
    """Anthropic's usage: input_tokens are those read, apart from those the prompt cache gave."""
    cached = done.usage["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": done.usage["prompt_tokens"] - cached, "output_tokens": done.usage["completion_tokens"],
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def _stop_reason(done: Done, called: bool) -> str:
    if called:
        return "tool_use"
    if done.stop_sequence is not None:
        return "stop_sequence"
    return "end_turn" if done.finish_reason == "stop" else "max_tokens"


def _sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps({'type': event, **data}, ensure_ascii=False)}\n\n"


class Answer:
    """One answer in Anthropic's shapes: the whole message, or its events as text and calls come."""

    def __init__(self, model_id: str, completion: Completion):
        self.head = {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
                     "model": model_id}
        self.prompt_tokens = len(completion.prompt)
        self.tools: ToolUse | None = completion.tools
        self.calls = CallStream(self.tools) if self.tools is not None else None
        self.index = -1  # the content block open (or last closed)
        self.open: Block | None = None

    def whole(self, text: str, done: Done) -> dict:
        content, calls = parse_calls(text, self.tools) if self.tools is not None else (text, [])
        shown = content if calls else text  # (the text outside the calls)
        blocks = [{"type": "text", "text": shown}] if shown else []
        blocks += [{"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)}
                   for call in calls]
        return {**self.head, "content": blocks, "stop_reason": _stop_reason(done, bool(calls)),
                "stop_sequence": done.stop_sequence, "usage": _usage(done), "speculum": done.speculum}

    # -- streamed --

    def start(self) -> list[str]:
        message = {**self.head, "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}
        return [_sse("message_start", {"message": message}), self.ping()]

    @staticmethod
    def ping() -> str:
        return _sse("ping", {})

    def piece(self, text: str) -> list[str]:
        if self.calls is None:
            return self._text(text)
        text, deltas = self.calls.feed(text)
        return self._text(text) + self._calls(deltas)

    def _begin(self, kind: Block, block: dict) -> list[str]:
        events = self._close()
        self.index += 1
        self.open = kind
        return events + [_sse("content_block_start", {"index": self.index, "content_block": block})]

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [_sse("content_block_stop", {"index": self.index})]

    def _text(self, text: str) -> list[str]:
        if not text:
            return []
        events = self._begin(Block.TEXT, {"type": "text", "text": ""}) if self.open is not Block.TEXT else []
        return events + [_sse("content_block_delta", {"index": self.index,
                                                      "delta": {"type": "text_delta", "text": text}})]

    def _calls(self, deltas: list[dict]) -> list[str]:
        """OpenAI's call deltas (CallStream's) as tool_use blocks and their input's JSON in pieces."""
        events = []
        for delta in deltas:
            if "id" in delta:
                events += self._begin(Block.TOOL_USE, {"type": "tool_use", "id": delta["id"],
                                                       "name": delta["function"]["name"], "input": {}})
            arguments = delta["function"].get("arguments")
            if arguments:
                events.append(_sse("content_block_delta", {"index": self.index, "delta": {
                    "type": "input_json_delta", "partial_json": arguments}}))
        return events

    def end(self, done: Done) -> list[str]:
        """What was held back, the last block closed, the stop reason with the usage, message_stop."""
        events = []
        if self.calls is not None:
            text, deltas = self.calls.finish()
            events = self._text(text) + self._calls(deltas)
        events += self._close()
        called = self.calls is not None and self.calls.count > 0
        return events + [_sse("message_delta", {"delta": {"stop_reason": _stop_reason(done, called),
                                                          "stop_sequence": done.stop_sequence},
                                                "usage": _usage(done), "speculum": done.speculum}),
                         _sse("message_stop", {})]

    def failure(self, exc: Exception) -> str:
        """A generation that failed midway: Anthropic's error event (the stream then ends)."""
        kind = ("invalid_request_error" if isinstance(exc, BadRequest) else
                "overloaded_error" if isinstance(exc, WorkerUnreachable) else "api_error")
        message = str(exc) if isinstance(exc, SpeculumError) else f"{exc.__class__.__name__}: {exc}"
        return _sse("error", {"error": {"type": kind, "message": f"The answer failed midway: {message}"}})


# --- the routes ----------------------------------------------------------------------------------------------

ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]


class Messages:
    """The Messages API's routes over the OpenAI API's ``Api`` (its served model, key and guards)."""

    def __init__(self, api: Api):
        self.api = api

    def routes(self) -> list[Route]:
        return [Route(ANTHROPIC_PATHS, self._route(self.messages), methods=ANY_METHOD),
                Route(ANTHROPIC_PATHS + "/count_tokens", self._route(self.count_tokens), methods=ANY_METHOD),
                Route(ANTHROPIC_PATHS + "/{rest:path}", self._missing, methods=ANY_METHOD)]

    def _route(self, endpoint):
        """``endpoint`` with the API's key and guards, every refusal and failure in Anthropic's shape."""
        guarded = self.api.guarded(endpoint)

        async def route(request: Request) -> Response:
            if request.method != "POST":
                return _refusal(request, error(405, f"{request.url.path} takes POST only.", code="method_not_allowed"))
            if not self.api.authorised(request):
                return _refusal(request, error(401, "A valid API key is required: x-api-key: KEY (or Authorization: "
                                                    "Bearer KEY).", code="invalid_api_key"))
            try:
                response = await guarded(request)
            except Exception as exc:  # noqa: BLE001 - the server keeps serving; the client hears why
                log.error("A request to %s failed: %s", request.url.path, exc, exc_info=True)
                response = error(500, f"The server failed on this request: {exc.__class__.__name__}: {exc}",
                                 kind="server_error")
            return _refusal(request, response) if response.status_code >= 400 else response
        return route

    async def _missing(self, request: Request) -> Response:
        return _refusal(request, error(404, f"No route {request.method} {request.url.path[:200]}.", code="not_found"))

    async def messages(self, request: Request) -> Response:
        if (refused := await self.api.unavailable()) is not None:
            return refused
        body = await json_body(request)
        completion = message_request(self.api, body)
        served = self.api.served
        completion.client = request.client.host if request.client is not None else ""
        answer = Answer(served.model_id, completion)
        pieces = until_disconnected(request, served.run(completion))
        if body.get("stream") is not True:
            return await _whole(answer, pieces)
        # The first piece is awaited a moment here, so a busy server still answers 429; then the
        # events begin, and pings keep the client waiting while a long prompt is read.
        first = await first_piece(pieces)
        if first is None:
            return Response(status_code=CLIENT_GONE)
        return StreamingResponse(_events(answer, first, pieces), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def count_tokens(self, request: Request) -> Response:
        if (refused := await self.api.unavailable()) is not None:
            return refused
        completion = message_request(self.api, await json_body(request), counting=True)
        return JSONResponse({"input_tokens": len(completion.prompt)})


def _refusal(request: Request, response: Response) -> Response:
    """An answer of the OpenAI routes' error helpers in Anthropic's shape (Retry-After kept), logged:
    an agent that fails shows why in the server's log."""
    if not isinstance(response, JSONResponse) or response.status_code < 400:
        return response
    openai_body = json.loads(response.body)
    # A model not served here is Anthropic's 404 (the OpenAI routes say 400, as OpenAI does).
    status = 404 if openai_body["error"].get("code") == "model_not_found" else response.status_code
    body = shaped_for(request.url.path, status, openai_body)
    log.warning("%s %s: %d %s", request.method, request.url.path, status, body["error"]["message"])
    keep = {k: v for k, v in response.headers.items() if k.lower() == "retry-after"}
    return JSONResponse(body, status_code=status, headers=keep)


async def _whole(answer: Answer, pieces) -> Response:
    text, done = await collected(pieces)
    if done is None:  # the client went away
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(answer.whole(text, done))


async def _events(answer: Answer, first: asyncio.Future, pieces):
    paced = Paced(first, pieces, PING_S)
    try:
        for event in answer.start():
            yield event
        try:
            async for piece in paced:
                events = ([answer.ping()] if piece is None else answer.end(piece) if isinstance(piece, Done)
                          else answer.piece(piece.text))
                for event in events:
                    yield event
        except Exception as exc:  # noqa: BLE001 - the request fails, the stream still ends properly
            log.error("A streamed answer failed: %s", exc, exc_info=not isinstance(exc, SpeculumError))
            yield answer.failure(exc)
    finally:
        await paced.close()

