"""The HTTP side of `speculum serve`: OpenAI's routes, shapes and errors, over ``ServedModel``.

Every failure a client can cause is a 4xx in OpenAI's error shape
(``{"error": {"message", "type", "param", "code"}}``); anything else is a 500 in the same
shape, and the server keeps serving. Streaming answers are server-sent events ending in
``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engine.sampling import SamplingParams
from ..errors import SpeculumError
from . import listen
from .guard import Guard
from .service import BadRequest, Busy, Completion, Delta, Done, ServedModel

MAX_STOP_SEQUENCES = 4
MAX_BODY_BYTES = 8 * 1024 * 1024  # far above any context's worth of text (~4 bytes a token)
BODY_TIMEOUT_S = 60.0  # a body trickled slower than this holds a connection for nothing
MAX_JSON_DEPTH = 64  # the deepest real request (tools' JSON schemas) is well within this


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
          code: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


# --- reading a request ---------------------------------------------------------------------------

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


def _completion(served: ServedModel, body: dict, prompt: list[int]) -> Completion:
    n_ctx = served.decoder.target.n_ctx
    max_tokens = _integer(body, "max_completion_tokens", 1, n_ctx) or _integer(body, "max_tokens", 1, n_ctx) or 256
    if _integer(body, "n", 1, 1) not in (None, 1):
        raise BadRequest("Only n = 1 is supported.", param="n")
    sampling = SamplingParams(temperature=_number(body, "temperature", 1.0 if "temperature" in body else 0.0, 0, 2),
                              top_p=_number(body, "top_p", 1.0, 0, 1) or 1.0,
                              seed=_integer(body, "seed", -2**63, 2**63 - 1))
    return Completion(prompt, max_tokens, sampling, _stop(body), _prediction(body))


async def _json_body(request: Request) -> dict:
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
        if chars <= target.n_ctx * 16:  # (no vocabulary has shorter longest pieces)
            return
        if not self.longest:
            self.longest = max(32, max(len(target.token_bytes(t)) for t in range(target.n_vocab)))
        if chars > target.n_ctx * self.longest:
            raise BadRequest(f"The prompt is {chars:,} characters, far more than the model's context of "
                             f"{target.n_ctx:,} tokens holds. Shorten it.", param=param,
                             code="context_length_exceeded")


# --- answering ------------------------------------------------------------------------------------

def create_app(served: ServedModel, api_key: str | None = None, cors_origins: list[str] | None = None,
               bind_host: str | None = "127.0.0.1") -> Starlette:
    """The API's routes; ``bind_host``: where it listens (on loopback only loopback host names are served)."""
    created = int(time.time())
    bound = PromptBound(served)

    def authorised(request: Request) -> bool:
        if api_key is None:
            return True
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())

    def guarded(endpoint):
        """An endpoint with the API key checked and the client's own faults as 4xx answers."""
        async def route(request: Request) -> Response:
            if not authorised(request):
                return error(401, "A valid API key is required: Authorization: Bearer KEY.", code="invalid_api_key")
            try:
                return await endpoint(request)
            except Busy as exc:
                return error(429, str(exc), kind="rate_limit_error", code="busy",
                             headers={"Retry-After": str(exc.retry_after)})
            except BadRequest as exc:
                return error(400, str(exc), param=exc.param, code=exc.code)
        return route

    @guarded
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": served.model_id, "object": "model", "created": created, "owned_by": "speculum"}]})

    @guarded
    async def chat(request: Request) -> Response:
        body = await _json_body(request)
        _check_model(served, body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list.", param="messages")
        clean = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
                raise BadRequest(f"messages[{i}] needs a role of system, user or assistant.", param="messages")
            role = "system" if m["role"] == "developer" else m["role"]
            clean.append({"role": role, "content": _text(m.get("content", ""), f"messages[{i}].content")})
        bound.check(sum(len(m["content"]) for m in clean), "messages")
        try:
            prompt = served.chat_prompt(clean)
        except SpeculumError as exc:  # the template could not render these messages
            raise BadRequest(str(exc), param="messages") from None
        completion = _completion(served, body, prompt)
        return await respond(request, body, completion, chat=True)

    @guarded
    async def completions(request: Request) -> Response:
        body = await _json_body(request)
        _check_model(served, body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("'prompt' must be a non-empty string.", param="prompt")
        bound.check(len(prompt), "prompt")
        completion = _completion(served, body, served.text_prompt(prompt))
        return await respond(request, body, completion, chat=False)

    async def respond(request: Request, body: dict, completion: Completion, chat: bool) -> Response:
        served.check_fits(completion)
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        now = int(time.time())
        stream = body.get("stream") is True
        options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
        head = {"id": ident, "created": now, "model": served.model_id}
        pieces = served.run(completion)
        if not stream:
            text, done = [], None
            async for piece in _until_disconnected(request, pieces):
                if isinstance(piece, Delta):
                    text.append(piece.text)
                else:
                    done = piece
            if done is None:  # the client went away
                return Response(status_code=499)
            content = "".join(text)
            choice = ({"index": 0, "message": {"role": "assistant", "content": content},
                       "finish_reason": done.finish_reason, "logprobs": None} if chat else
                      {"index": 0, "text": content, "finish_reason": done.finish_reason, "logprobs": None})
            return JSONResponse({**head, "object": "chat.completion" if chat else "text_completion",
                                 "choices": [choice], "usage": done.usage, "speculum": done.speculum})
        # Streaming: the first piece is awaited here, so a busy server still answers 429.
        first = await pieces.__anext__()
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_text: str | None, finish: str | None, role: bool = False) -> str:
            if chat:
                delta = ({"role": "assistant", "content": ""} if role else
                         {"content": delta_text} if delta_text is not None else {})
                choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": 0, "text": delta_text or "", "finish_reason": finish, "logprobs": None}
            return f"data: {json.dumps({**head, 'object': kind, 'choices': [choice]}, ensure_ascii=False)}\n\n"

        async def events():
            if chat:
                yield chunk(None, None, role=True)
            piece = first
            while True:
                if isinstance(piece, Delta):
                    yield chunk(piece.text, None)
                else:
                    final = {**head, "object": kind, "choices": [
                        {"index": 0, **({"delta": {}} if chat else {"text": ""}), "finish_reason": piece.finish_reason,
                         "logprobs": None}], "speculum": piece.speculum}
                    yield f"data: {json.dumps(final)}\n\n"
                    if options.get("include_usage"):
                        usage = {**head, "object": kind, "choices": [], "usage": piece.usage}
                        yield f"data: {json.dumps(usage)}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                try:
                    piece = await pieces.__anext__()
                except StopAsyncIteration:
                    return

        async def closing():
            try:
                async for event in events():
                    yield event
            finally:
                await pieces.aclose()  # a client that disconnected stops its generation

        return StreamingResponse(closing(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def not_found(request: Request, exc) -> Response:
        return error(404, f"No route {request.method} {request.url.path}.", code="not_found")

    async def failed(request: Request, exc: Exception) -> Response:
        return error(500, f"The server failed on this request: {exc.__class__.__name__}: {exc}", kind="server_error")

    middleware = [Middleware(Guard, bind_host=bind_host, cors_origins=cors_origins or ())]
    routes = [Route("/v1/models", models, methods=["GET"]),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"])]
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={404: not_found, 405: not_found, Exception: failed})


class Serving(listen.Serving):
    """The API over ``served`` on a thread of its own (the window's engine process serves while it chats)."""

    def __init__(self, served: ServedModel, host: str, port: int, api_key: str | None = None):
        super().__init__(create_app(served, api_key=api_key, bind_host=host), host, port)


async def _until_disconnected(request: Request, pieces):
    """The pieces of a non-streaming answer; stops (and so stops the generation) if the client leaves."""
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        while True:
            step = asyncio.ensure_future(pieces.__anext__())
            await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():  # the client left: end the generation before closing it
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        watcher.cancel()
        await pieces.aclose()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
