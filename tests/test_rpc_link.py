"""The secure link's byte handling, on real sockets without a model: llama.cpp's messages are
passed on whole whatever pieces they arrive in, and a piece that never becomes a whole
message still goes on (the link never sits on bytes)."""

from __future__ import annotations

import random
import socket
import struct
import threading

from speculum.engine import rpclink


def request(command: int, body: bytes) -> bytes:
    return bytes([command]) + struct.pack("<Q", len(body)) + body


def pieces(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, 40)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def test_message_ends_and_frames_are_found_whatever_the_pieces():
    rng = random.Random(7)
    messages = [request(6, bytes(range(200))), request(10, b""), request(8, b"x" * 40), request(14, bytes(24))]
    stream = b"".join(messages)
    ends = {sum(map(len, messages[:i + 1])) for i in range(len(messages))}
    for _ in range(50):
        parser, seen = rpclink._Messages(9), 0
        for piece in pieces(stream, rng):
            seen += len(piece)
            assert parser.feed(piece) == (seen in ends)

    frames = [rpclink._FRAME.pack(rpclink._DATA, len(m)) + m for m in messages]
    framed = rpclink._BEAT_FRAME + frames[0] + rpclink._BEAT_FRAME + b"".join(frames[1:])
    for _ in range(50):
        unframer, out, count = rpclink._Unframer(), [], 0
        for piece in pieces(framed, rng):
            data, frames_begun = unframer.feed(piece)
            count += frames_begun
            if data:
                out.append(bytes(data))
        assert b"".join(out) == stream and count == len(messages) + 2
        given = [sum(map(len, out[:i + 1])) for i in range(len(out))]
        assert set(given) <= ends  # whole messages only


def test_a_message_that_never_completes_still_goes_on():
    ggml, relay_in = socket.socketpair()
    relay_out, worker = socket.socketpair()
    way = rpclink._Way(relay_in, relay_out, whole=rpclink._Messages(9).feed)
    stop = threading.Event()
    threading.Thread(target=rpclink._shuttle, args=([way], 0.05, lambda: not stop.is_set()), daemon=True).start()
    try:
        ggml.sendall(request(6, b"")[:5])  # a header cut short: no message end ever comes
        worker.settimeout(5)  # (held 0.05 s, then passed on)
        assert worker.recv(100) == request(6, b"")[:5]
    finally:
        stop.set()
        for s in (ggml, relay_in, relay_out, worker):
            s.close()


def test_a_worker_that_stops_halfway_through_an_answer_ends_the_connection_within_the_timeout():
    """ggml reads an answer (a token's logits) to its end: a worker frozen after sending its
    header and part of its body is as silent as one that never answered, and the relay's
    watchdog ends the connection (the answer's header alone once counted as the answer)."""
    from speculum.engine.rpcaddress import parse_worker

    listener = socket.create_server(("127.0.0.1", 0))
    timeout_s = 1
    link = rpclink.ClientLink(parse_worker(f"127.0.0.1:{listener.getsockname()[1]}"), read_timeout=timeout_s,
                              connect_timeout=5)
    host, port = link.local_endpoint.rsplit(":", 1)
    ggml = socket.create_connection((host, int(port)))
    worker = None
    try:
        worker, _ = listener.accept()
        ggml.sendall(request(8, bytes(40)))  # GET_TENSOR: awaits an answer
        worker.settimeout(5)
        got = b""
        while len(got) < 49:
            got += worker.recv(100)
        worker.sendall(struct.pack("<Q", 1000) + bytes(10))  # its header and 10 of its 1000 bytes, then nothing
        ggml.settimeout(timeout_s + 5)
        received = b""
        while chunk := ggml.recv(4096):  # the relay closes ggml's side: recv ends with b""
            received += chunk
        assert received == struct.pack("<Q", 1000) + bytes(10)
        assert link.failure is not None and link.failure[0] == "timeout", link.failure
    finally:
        for s in (ggml, worker, listener):
            if s is not None:
                s.close()
        link.close()
