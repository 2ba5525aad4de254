"""What crosses the link: the secure link's hello and frames (worker to client: data, and a
heartbeat every second, so that a client can tell a frozen worker from one busy with a long
pass), and where llama.cpp's own RPC messages end, read from their headers alone.
"""

from __future__ import annotations

import struct
from typing import Callable

from .shuttle import CHUNK

MAGIC = b"speculum-rpc-link/1\n"  # then the token and a newline; the worker answers one JSON line
BEAT, DATA = 0, 1
FRAME = struct.Struct("<BI")  # kind, length
BEAT_FRAME = FRAME.pack(BEAT, 0)


class Unframer:
    """The front end's frames back into llama.cpp's bytes, across reads that split them anywhere.
    A data frame is given out whole: llama.cpp reads a message to its end before it acts, so
    passing one on in pieces would only wake it more often."""

    def __init__(self) -> None:
        self._head = bytearray()
        self._data = bytearray()
        self.left = 0  # bytes of the current data frame still to come

    def feed(self, data) -> tuple[bytearray, int]:
        """(the data of the frames completed by ``data``, how many frames began in it, heartbeats
        included); ValueError on a frame the front end never sends."""
        frames, view = 0, memoryview(data)
        while view:
            if self.left:
                take = min(self.left, len(view))
                self._data += view[:take]
                view, self.left = view[take:], self.left - take
                continue
            need = FRAME.size - len(self._head)
            self._head += view[:need]
            view = view[need:]
            if len(self._head) < FRAME.size:
                break
            kind, size = FRAME.unpack(self._head)
            self._head.clear()
            if kind not in (BEAT, DATA) or size > CHUNK or (kind == BEAT and size):
                raise ValueError("not a frame of ours")
            frames, self.left = frames + 1, size
        if self.left or not self._data:
            return bytearray(), frames
        out, self._data = self._data, bytearray()
        return out, frames


# RPC commands that the server answers (rpc_serve_client in ggml-rpc.cpp): the plain link
# times out only while one of these waits, since a worker owes no bytes otherwise.
# ALLOC_BUFFER, GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR,
# GET_DEVICE_MEMORY, GET_ALLOC_SIZE, HELLO, DEVICE_COUNT (enum rpc_cmd).
ANSWERED = {0, 1, 2, 3, 7, 8, 9, 11, 13, 14, 15}


class Messages:
    """Where llama.cpp's RPC messages end in one direction of a connection, from their headers
    alone: a request is | command (1) | size (8) | body |, an answer | size (8) | body |.
    ``on_end(head, tail)``, when given, hears each message's end with its body's last ``tail`` bytes."""

    def __init__(self, head_size: int, on_head: Callable[[bytes], None] | None = None,
                 on_end: Callable[[bytes, bytes], None] | None = None, tail: int = 0):
        self._size, self._on_head, self._on_end, self._tail_size = head_size, on_head, on_end, tail
        self._head, self._skip = bytearray(), 0
        self._last_head, self._tail = b"", bytearray()

    def missing(self) -> int:
        """Bytes still to come before the current header or body is whole."""
        return self._skip or self._size - len(self._head)

    @property
    def midway(self) -> bool:
        """Whether a message has begun and not ended."""
        return bool(self._skip or self._head)

    def feed(self, data) -> bool:
        """Take the next bytes; whether they end where a message ends."""
        view = memoryview(data)
        while view:
            if self._skip:
                step = min(self._skip, len(view))
                if self._tail_size and step > self._skip - self._tail_size:  # (the body's last bytes)
                    self._tail += view[max(0, self._skip - self._tail_size):step]
                self._skip, view = self._skip - step, view[step:]
                if not self._skip:
                    self._ended()
                continue
            take = self._size - len(self._head)
            self._head += view[:take]
            view = view[take:]
            if len(self._head) == self._size:
                self._skip = struct.unpack_from("<Q", self._head, self._size - 8)[0]
                self._last_head = bytes(self._head)
                self._tail.clear()
                if self._on_head:
                    self._on_head(self._last_head)
                self._head.clear()
                if not self._skip:
                    self._ended()
        return not self._skip and not self._head

    def _ended(self) -> None:
        if self._on_end:
            self._on_end(self._last_head, bytes(self._tail[-self._tail_size:]) if self._tail_size else b"")


GET_TENSOR = 8  # its request's body ends with the bytes asked for (rpc_msg_get_tensor_req.size)
COMPUTE = {10, 16}  # GRAPH_COMPUTE, GRAPH_RECOMPUTE (the graph the worker kept, run again)


class Answers:
    """A worker's answers on their way to the client: where each ends, and how long the next
    will be before it begins where its request said so. ggml's server sends an answer's size and
    body in two sends; knowing a GET_TENSOR's length (a token's hidden state) from its request,
    the front end wakes once for both, not once for the size and again for the body."""

    def __init__(self) -> None:
        self.expected: list[int] = []  # per request awaiting its answer: the answer's length, 0 if not known
        self.requests = Messages(9, on_end=self._asked, tail=8)
        self.answers = Messages(8, self._began)
        self.asked, self.feed = self.requests.feed, self.answers.feed

    def _asked(self, head: bytes, tail: bytes) -> None:
        if head[0] in ANSWERED:
            known = head[0] == GET_TENSOR and len(tail) == 8
            self.expected.append(8 + struct.unpack("<Q", tail)[0] if known else 0)

    def _began(self, head: bytes) -> None:
        if self.expected:
            self.expected.pop(0)

    def missing(self) -> int:
        if not self.answers.midway and self.expected and self.expected[0]:
            return self.expected[0]
        return self.answers.missing()


class Gathered:
    """ggml's requests to a secure worker, each passed on once whole, except a graph computation,
    which waits for the request behind it. ggml sends a token's inputs (SET_TENSOR) as it makes
    them, then its graph (GRAPH_COMPUTE or GRAPH_RECOMPUTE) and at once the request for the
    result (GET_TENSOR), on which it waits. The inputs go on as they come, so the worker's server
    takes them while ggml makes the rest (holding them for the answered request, as stop 40 did,
    cost 3-8% of SmolLM2's tok/s); the graph and its result's request cross as one TLS record,
    waking the front end once on the token's critical path. ``GATHER_S`` bounds the hold,
    should ggml ever send a graph and then wait on nothing."""

    def __init__(self) -> None:
        self.command = -1
        self.messages = Messages(9, self._head)
        self.missing = self.messages.missing

    def _head(self, head: bytes) -> None:
        self.command = head[0]

    def feed(self, data) -> bool:
        return self.messages.feed(data) and self.command not in COMPUTE


class Requests:
    """Counts ggml's requests that await an answer, from the messages' headers."""

    def __init__(self) -> None:
        self.waiting = 0
        self.requests, self.answers = Messages(9, self._sent), Messages(8, self._answered)
        self.sent, self.received = self.requests.feed, self.answers.feed

    def _sent(self, head: bytes) -> None:
        if head[0] in ANSWERED:
            self.waiting += 1

    def _answered(self, head: bytes) -> None:
        self.waiting = max(0, self.waiting - 1)

    @property
    def awaiting(self) -> bool:
        """Whether ggml waits on the worker: a request unanswered, or an answer begun and not
        whole (a worker frozen while it sends a token's logits leaves ggml reading forever)."""
        return self.waiting > 0 or self.answers.midway
