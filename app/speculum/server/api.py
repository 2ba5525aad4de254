"""OpenAI's routes, shapes and errors over ``ServedModel`` (server/app.py assembles the application).

Every failure a client can cause is a 4xx in OpenAI's error shape
(``{"error": {"message", "type", "param", "code"}}``); anything else is a 500 in the same
shape, and the server keeps serving. Streaming answers are server-sent events ending in
``data: [DONE]``. What a request must show before any of this runs is in ``guard``; how a
request's body and parameters are read, in ``params``.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import SpeculumError
from .params import PromptBound, chat_request, json_body, text_request
from .streaming import CLIENT_GONE, until_disconnected
from .errors import BadRequest, Busy, WorkerUnreachable
from .service import Completion, Delta, Done, ServedModel, ServerState
from .callstream import CallStream
from .tools import parse_calls

log = logging.getLogger("speculum.serve")

def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
          code: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


class Api:
    """The routes' work over one served model."""

    def __init__(self, served: ServedModel, api_key: str | None):
        self.served = served
        self.api_key = api_key
        self.created = int(time.time())
        self.bound = PromptBound(served)

    def authorised(self, request: Request) -> bool:
        if self.api_key is None:
            return True
        key = self.api_key.encode()
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key):
            return True
        return hmac.compare_digest(request.headers.get("x-api-key", "").strip().encode(), key)  # (Anthropic's clients)

    def guarded(self, endpoint):
        """An endpoint with the API key checked and the client's own faults as 4xx answers."""
        async def route(request: Request) -> Response:
            if not self.authorised(request):
                return error(401, "A valid API key is required: Authorization: Bearer KEY.", code="invalid_api_key")
            try:
                return await endpoint(request)
            except Busy as exc:
                return error(429, str(exc), kind="rate_limit_error", code="busy",
                             headers={"Retry-After": str(exc.retry_after)})
            except BadRequest as exc:
                return error(400, str(exc), param=exc.param, code=exc.code)
            except WorkerUnreachable as exc:  # this request ends; the server serves again once the worker is back
                return error(503, str(exc), kind="server_error", code="worker_lost", headers={"Retry-After": "5"})
            except SpeculumError as exc:  # the engine's own failure, in plain words: this request ends
                return error(500, str(exc), kind="server_error")
        return route

    async def unavailable(self) -> Response | None:
        """503 while the models load or an RPC worker is lost (the routes that need them wait for
        ready); a lost worker that answers again has the models loaded afresh first."""
        await self.served.recover()
        if self.served.state == ServerState.WORKER_LOST:
            return error(503, self.served.state_message, kind="server_error", code="worker_lost",
                         headers={"Retry-After": "5"})
        if self.served.state == ServerState.LOAD_FAILED:
            return error(503, self.served.state_message, kind="server_error", code="load_failed")
        if self.served.state != ServerState.LOADING:
            return None
        return error(503, self.served.state_message or "The model is still loading; retry shortly.",
                     kind="server_error", code="model_loading", headers={"Retry-After": "5"})

    # -- the routes --

    async def health(self, request: Request) -> Response:
        """Ready, loading, worker lost or load failed: 200 only when a request would be served now."""
        served = self.served
        await served.recover()  # a lost worker back: the models load again
        body = {"status": served.state.value, "model": served.model_id, "waiting": served.waiting}
        if served.state_message:
            body["message"] = served.state_message
        if served.state == ServerState.READY:
            return JSONResponse(body)
        retry = {} if served.state == ServerState.LOAD_FAILED else {"Retry-After": "5"}  # (load_failed: it ends)
        return JSONResponse(body, status_code=503, headers=retry)

    def _card(self) -> dict:
        return {"id": self.served.model_id, "object": "model", "created": self.created, "owned_by": "speculum"}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        if model_id != self.served.model_id:
            return error(404, f"The model '{model_id[:200]}' is not served here; this server serves "
                              f"'{self.served.model_id}'.", param="model", code="model_not_found")
        return JSONResponse(self._card())

    async def chat(self, request: Request) -> Response:
        if (loading := await self.unavailable()) is not None:
            return loading
        body = await json_body(request)
        return await self.answer(request, body, chat_request(self.served, body, self.bound), chat=True)

    async def completions(self, request: Request) -> Response:
        if (loading := await self.unavailable()) is not None:
            return loading
        body = await json_body(request)
        return await self.answer(request, body, text_request(self.served, body, self.bound), chat=False)

    # -- answering --

    async def answer(self, request: Request, body: dict, completion: Completion, chat: bool) -> Response:
        """The completion as one JSON answer or as server-sent events; either stops when the client leaves."""
        self.served.check_fits(completion)
        completion.client = request.client.host if request.client is not None else ""
        reply = Reply(self.served.model_id, chat, completion, self.served.decoder.target)
        pieces = until_disconnected(request, self.served.run(completion))
        if body.get("stream") is not True:
            return await _whole(reply, pieces)
        # The first piece is awaited here, so a busy server still answers 429; a client that
        # leaves meanwhile stops the prompt's reading within a chunk.
        try:
            first = await pieces.__anext__()
        except StopAsyncIteration:
            return Response(status_code=CLIENT_GONE)
        usage = ((body.get("stream_options") or {}).get("include_usage") is True)
        return StreamingResponse(_events(reply, first, pieces, usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class Reply:
    """OpenAI's shapes for one answer, whole or in chunks: text, tool calls, log-probabilities."""

    def __init__(self, model_id: str, chat: bool, completion: Completion | None = None, target=None):
        self.chat = chat
        self.head = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], "created": int(time.time()),
                     "model": model_id}
        self.chunk_kind = "chat.completion.chunk" if chat else "text_completion"
        self.tools = completion.tools if completion is not None else None
        self.scores = Scores(target, chat) if completion is not None and completion.logprobs is not None else None
        self.calls = CallStream(self.tools) if self.tools is not None else None
        self.held: list = []  # scored tokens of text held back (a call, maybe) until it is sent

    def whole(self, text: str, done: Done, scored: list | None = None) -> dict:
        logprobs = self.scores.shape(scored or [], 0) if self.scores is not None else None
        if not self.chat:
            choice = {"index": 0, "text": text, "finish_reason": done.finish_reason, "logprobs": logprobs}
        else:
            content, calls = parse_calls(text, self.tools) if self.tools is not None else (text, [])
            message = {"role": "assistant", "content": content if calls else text}
            if calls:
                message["tool_calls"] = [call.as_openai() for call in calls]
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else done.finish_reason,
                      "logprobs": logprobs}
        return {**self.head, "object": "chat.completion" if self.chat else "text_completion",
                "choices": [choice], "usage": done.usage, "speculum": done.speculum}

    def event(self, payload: dict) -> str:
        return f"data: {json.dumps({**self.head, 'object': self.chunk_kind, **payload}, ensure_ascii=False)}\n\n"

    def chunk(self, text: str | None, finish: str | None = None, role: bool = False, scored: list | None = None,
              offset: int = 0) -> str:
        logprobs = self.scores.shape(scored, offset) if self.scores is not None and scored else None
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else {"content": text} if text is not None else {}
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        return self.event({"choices": [choice]})

    def pieces(self, delta: Delta, offset: int) -> list[str]:
        """The chunks one piece of text makes: text now, held back (a call, maybe), or calls."""
        if self.calls is None:
            return [self.chunk(delta.text, scored=delta.scored, offset=offset)]
        self.held += delta.scored
        return self._sent(*self.calls.feed(delta.text), offset)

    def _sent(self, text: str, calls: list[dict], offset: int) -> list[str]:
        events = []
        if text:
            events.append(self.chunk(text, scored=self.held, offset=offset))
            self.held = []
        return events + [self._call_event(call) for call in calls]

    def _call_event(self, call: dict) -> str:
        return self.event({"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None,
                                        "logprobs": None}]})

    def failure(self, exc: Exception) -> list[str]:
        """A generation that failed midway: an error event in OpenAI's shape, then [DONE]."""
        message = str(exc) if isinstance(exc, SpeculumError) else f"{exc.__class__.__name__}: {exc}"
        body = {"error": {"message": f"The answer failed midway: {message}", "type": "server_error",
                          "param": None,
                          "code": "worker_lost" if isinstance(exc, WorkerUnreachable) else "generation_failed"}}
        return [f"data: {json.dumps(body)}\n\n", "data: [DONE]\n\n"]

    def last(self, done: Done, usage: bool, offset: int = 0) -> list[str]:
        """What was held back, the finishing chunk (with Speculum's numbers), the usage chunk if
        asked for, and [DONE]."""
        events = self._sent(*self.calls.finish(), offset) if self.calls is not None else []
        finish = "tool_calls" if self.calls is not None and self.calls.count else done.finish_reason
        events.append(self.event({"choices": [{"index": 0, **({"delta": {}} if self.chat else {"text": ""}),
                                               "finish_reason": finish, "logprobs": None}],
                                  "speculum": done.speculum}))
        if usage:
            events.append(self.event({"choices": [], "usage": done.usage}))
        return events + ["data: [DONE]\n\n"]


class Scores:
    """Tokens' log-probabilities in OpenAI's shapes: chat's ``content`` list, completions' legacy one."""

    def __init__(self, target, chat: bool):
        self.target = target
        self.chat = chat

    def _token(self, token: int) -> tuple[str, list[int]]:
        raw = self.target.token_bytes(token)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def shape(self, scored: list, offset: int) -> dict:
        """``scored``: (token, logprob, top ids, top logprobs); ``offset``: the text's length before them."""
        if self.chat:
            content = []
            for token, logprob, ids, values in scored:
                text, raw = self._token(token)
                top = [dict(zip(("token", "bytes"), self._token(i)), logprob=v) for i, v in zip(ids, values)]
                content.append({"token": text, "logprob": logprob, "bytes": raw,
                                "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                                                 for t in top]})
            return {"content": content, "refusal": None}
        tokens, offsets = [], []
        for token, *_ in scored:
            offsets.append(offset)
            tokens.append(self._token(token)[0])
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _, _ in scored],
                "top_logprobs": [{self._token(i)[0]: v for i, v in zip(ids, values)} for _, _, ids, values in scored],
                "text_offset": offsets}


async def _whole(reply: Reply, pieces) -> Response:
    text, scored, done = [], [], None
    async for piece in pieces:
        if isinstance(piece, Delta):
            text.append(piece.text)
            scored += piece.scored
        else:
            done = piece
    if done is None:  # the client went away
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(reply.whole("".join(text), done, scored))


async def _events(reply: Reply, first, pieces, usage: bool):
    offset = 0
    try:
        if reply.chat:
            yield reply.chunk(None, role=True)
        piece = first
        while not isinstance(piece, Done):
            for event in reply.pieces(piece, offset):
                yield event
            offset += len(piece.text)
            try:
                piece = await pieces.__anext__()
            except StopAsyncIteration:  # the client left: no more to say
                return
            except Exception as exc:  # noqa: BLE001 - the request fails, the stream still ends properly
                log.error("A streamed answer failed: %s", exc, exc_info=not isinstance(exc, SpeculumError))
                for event in reply.failure(exc):
                    yield event
                return
        for event in reply.last(piece, usage, offset):
            yield event
    finally:
        await pieces.aclose()  # the model's turn passes on as soon as the answer is out


async def not_found(request: Request, exc) -> Response:
    return error(404, f"No route {request.method} {request.url.path[:200]}.", code="not_found")


async def failed(request: Request, exc: Exception) -> Response:
    return error(500, f"The server failed on this request: {exc.__class__.__name__}: {exc}", kind="server_error")
