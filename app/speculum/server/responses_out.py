"""Answers in the Responses API's shapes: the ``response`` object with its output items
(``message`` with ``output_text``, ``function_call``), and the streamed events that build it,
each with its ``sequence_number``.

A streamed answer's items are built from the same pieces its events carry, so the deltas of a
text or of a call's arguments always join to what the ``.done`` events and the final
``response.completed`` say.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import AsyncIterator, Callable

from ..engine.vocabulary import Word
from ..errors import SpeculumError
from .errors import WorkerUnreachable
from .service import Completion, Done
from .streaming import Paced
from .callstream import CallStream
from .tools import parse_calls

log = logging.getLogger("speculum.serve")

KEEP_ALIVE_S = 10.0  # while the prompt is read, a comment this often
CUT_SHORT = "length"  # the chat path's finish_reason when max tokens ended the answer


class ItemType(Word):
    """The input and output items this server reads and writes."""
    MESSAGE = "message"
    FUNCTION_CALL = "function_call"
    FUNCTION_CALL_OUTPUT = "function_call_output"
    REASONING = "reasoning"  # another model's, resent by a client: skipped


class Status(Word):
    """A response's status, and its items' (in progress, then completed)."""
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def message_item(text: str, status: Status = Status.COMPLETED) -> dict:
    return {"type": ItemType.MESSAGE, "id": _id("msg_"), "status": status, "role": "assistant",
            "content": [_text_part(text)] if status == Status.COMPLETED else []}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(call_id: str, name: str, arguments: str, status: Status = Status.COMPLETED) -> dict:
    return {"type": ItemType.FUNCTION_CALL, "id": _id("fc_"), "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


class Answer:
    """One response being made: its output items, and the response object around them."""

    def __init__(self, body: dict, model_id: str, completion: Completion):
        self.id = _id("resp_")
        self.created = int(time.time())
        self.body = body
        self.model_id = model_id
        self.completion = completion
        self.tools = completion.tools
        self.output: list[dict] = []
        self._parts: list[str] = []

    def text(self, text: str) -> None:
        """Text of an answer given whole (its calls are read from it at the end)."""
        self._parts.append(text)

    def finish(self, done: Done) -> dict:
        """The whole answer's items, from its text, and the finished response object."""
        text = "".join(self._parts)
        content, calls = parse_calls(text, self.tools) if self.tools is not None else (text, [])
        if content or not calls:
            self.output.append(message_item(content or ""))
        self.output += [call_item(call.id, call.name, call.arguments) for call in calls]
        return self.response(done)

    def response(self, done: Done | None = None, status: Status | None = None, failure: dict | None = None) -> dict:
        """The response object as it stands: in progress (no ``done``), finished, or failed."""
        body, sampling = self.body, self.completion.sampling
        if status is None:
            status = Status.IN_PROGRESS if done is None else \
                Status.INCOMPLETE if done.finish_reason == CUT_SHORT else Status.COMPLETED
        fmt = (body.get("text") or {}).get("format") or {"type": "text"}
        whole = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                 "background": False, "error": failure,
                 "incomplete_details": {"reason": "max_output_tokens"} if status == Status.INCOMPLETE else None,
                 "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
                 "max_tool_calls": None, "model": self.model_id, "output": self.output if done is not None else [],
                 "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
                 "previous_response_id": body.get("previous_response_id"),
                 "prompt_cache_key": body.get("prompt_cache_key"),
                 "reasoning": {"effort": None, "summary": None}, "service_tier": "default",
                 "store": body.get("store") is not False, "temperature": sampling.temperature,
                 "text": {"format": fmt}, "tool_choice": body.get("tool_choice", "auto"),
                 "tools": body.get("tools") or [], "top_p": sampling.top_p, "truncation": "disabled",
                 "usage": usage(done.usage) if done is not None else None,
                 "user": body.get("user"), "metadata": body.get("metadata") or {}}
        if done is not None:
            whole["speculum"] = done.speculum
        return whole

    def messages(self) -> list[dict]:
        """The answer as the chat template takes it again, for a response that continues it."""
        texts = [p["text"] for item in self.output if item["type"] == ItemType.MESSAGE for p in item["content"]]
        calls = [{"id": item["call_id"], "type": "function",
                  "function": {"name": item["name"], "arguments": item["arguments"]}}
                 for item in self.output if item["type"] == ItemType.FUNCTION_CALL]
        message = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
        if calls:
            message["tool_calls"] = calls
        return [message]


def usage(chat: dict) -> dict:
    """Chat's usage in Responses' names."""
    cached = (chat.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": chat["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": chat["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat["total_tokens"]}


class ResponseStream:
    """An answer as Responses' server-sent events: created, in progress, each item added, its
    text or arguments in deltas, done, and the response completed (or incomplete, or failed)."""

    def __init__(self, answer: Answer, step: asyncio.Future, pieces: AsyncIterator, on_done: Callable[[dict], None]):
        self.answer = answer
        self.step = step  # the first piece, awaited
        self.pieces = pieces
        self.on_done = on_done  # with the finished response object (to keep it)
        self.calls = CallStream(answer.tools) if answer.tools is not None else None
        self.sequence = 0
        self.message: dict | None = None  # the message item being written
        self.call: dict | None = None  # the function_call item being written

    def event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    async def events(self):
        answer, paced = self.answer, Paced(self.step, self.pieces, KEEP_ALIVE_S)
        try:
            yield self.event("response.created", response=answer.response())
            yield self.event("response.in_progress", response=answer.response())
            try:
                async for piece in paced:  # (a long prompt is read: minutes on a CPU for an agent's first turn)
                    events = ([": reading the prompt\n\n"] if piece is None  # an SSE comment: clients skip it
                              else self.end(piece) if isinstance(piece, Done) else self.feed(piece.text))
                    for event in events:
                        yield event
            except Exception as exc:  # noqa: BLE001 - the request fails, the stream still ends properly
                log.error("A streamed response failed: %s", exc, exc_info=not isinstance(exc, SpeculumError))
                yield self.failed(exc)
        finally:
            await paced.close()

    def feed(self, text: str) -> list[str]:
        said, calls = self.calls.feed(text) if self.calls is not None else (text, [])
        return self._text(said) + [e for delta in calls for e in self._call(delta)]

    def end(self, done: Done) -> list[str]:
        events = []
        if self.calls is not None:
            said, calls = self.calls.finish()
            events += self._text(said) + [e for delta in calls for e in self._call(delta)]
        events += self._close()
        if not self.answer.output:  # nothing said at all: an empty message, as OpenAI gives
            events += self._text("", force=True) + self._close()
        whole = self.answer.response(done)
        self.on_done(whole)
        kind = "response.incomplete" if whole["status"] == Status.INCOMPLETE else "response.completed"
        return events + [self.event(kind, response=whole)]

    def failed(self, exc: Exception) -> str:
        message = str(exc) if isinstance(exc, SpeculumError) else f"{exc.__class__.__name__}: {exc}"
        code = "worker_lost" if isinstance(exc, WorkerUnreachable) else "server_error"
        failure = {"code": code, "message": f"The answer failed midway: {message}"}
        return self.event("response.failed", response=self.answer.response(status=Status.FAILED, failure=failure))

    # -- items --

    def _text(self, text: str, force: bool = False) -> list[str]:
        if not text and not force:
            return []
        events = []
        if self.message is None:
            events += self._close()
            self.message = message_item("", status=Status.IN_PROGRESS)
            events.append(self._added(self.message))
            events.append(self.event("response.content_part.added", item_id=self.message["id"],
                                     output_index=len(self.answer.output) - 1, content_index=0,
                                     part=_text_part("")))
            self.message["content"] = [_text_part("")]
        part = self.message["content"][0]
        part["text"] += text
        if text:
            events.append(self.event("response.output_text.delta", item_id=self.message["id"],
                                     output_index=len(self.answer.output) - 1, content_index=0, delta=text,
                                     logprobs=[]))
        return events

    def _call(self, delta: dict) -> list[str]:
        """One of CallStream's chat-shaped call deltas: a call begun (its id and name), or arguments."""
        events = []
        function = delta.get("function") or {}
        if "id" in delta:
            events += self._close()
            self.call = call_item(delta["id"], function.get("name", ""), "", status=Status.IN_PROGRESS)
            events.append(self._added(self.call))
        fragment = function.get("arguments") or ""
        if fragment and self.call is not None:
            self.call["arguments"] += fragment
            events.append(self.event("response.function_call_arguments.delta", item_id=self.call["id"],
                                     output_index=len(self.answer.output) - 1, delta=fragment))
        return events

    def _added(self, item: dict) -> str:
        self.answer.output.append(item)
        return self.event("response.output_item.added", output_index=len(self.answer.output) - 1,
                          item=dict(item, content=[]) if item["type"] == ItemType.MESSAGE else dict(item))

    def _close(self) -> list[str]:
        """The item being written, done."""
        index = len(self.answer.output) - 1
        events = []
        if self.message is not None:
            item, self.message = self.message, None
            part = item["content"][0]
            events.append(self.event("response.output_text.done", item_id=item["id"], output_index=index,
                                     content_index=0, text=part["text"], logprobs=[]))
            events.append(self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                     content_index=0, part=part))
            item["status"] = Status.COMPLETED
            events.append(self.event("response.output_item.done", output_index=index, item=item))
        if self.call is not None:
            item, self.call = self.call, None
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                     output_index=index, name=item["name"], arguments=item["arguments"]))
            item["status"] = Status.COMPLETED
            events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events
