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
