"""The secure link's byte handling, on real sockets without a model: llama.cpp's messages are
passed on whole whatever pieces they arrive in, and a piece that never becomes a whole
message still goes on (the link never sits on bytes)."""

from __future__ import annotations

import random
import socket
import struct
import threading

from speculum.engine.rpc import clientlink, shuttle, wire


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
        parser, seen = wire.Messages(9), 0
        for piece in pieces(stream, rng):
            seen += len(piece)
            assert parser.feed(piece) == (seen in ends)

    frames = [wire.FRAME.pack(wire.DATA, len(m)) + m for m in messages]
    framed = wire.BEAT_FRAME + frames[0] + wire.BEAT_FRAME + b"".join(frames[1:])
    for _ in range(50):
        unframer, out, count = wire.Unframer(), [], 0
        for piece in pieces(framed, rng):
            data, frames_begun = unframer.feed(piece)
            count += frames_begun
            if data:
                out.append(bytes(data))
        assert b"".join(out) == stream and count == len(messages) + 2
        given = [sum(map(len, out[:i + 1])) for i in range(len(out))]
        assert set(given) <= ends  # whole messages only


def test_a_tokens_inputs_go_on_whole_and_its_graph_waits_for_the_request_for_its_result():
    # What the client's relay releases to a secure worker: each input (SET_TENSOR) once whole, so
    # the worker takes it while ggml makes the next; a graph (GRAPH_COMPUTE, GRAPH_RECOMPUTE) only
    # with the request that follows it (GET_TENSOR, which ggml waits on).
    rng = random.Random(5)
    token = [request(6, bytes(300)), request(6, bytes(1800)), request(16, bytes(4)),
             request(8, bytes(40) + struct.pack("<QQ", 0, 2312)), request(10, bytes(900)), request(6, bytes(20))]
    released_after = {0, 1, 3, 5}  # the messages whose end lets what is held go (a graph's does not)
    ends = {sum(map(len, token[:i + 1])): i for i in range(len(token))}
    stream = b"".join(token)
    for _ in range(50):
        gathered, seen = wire.Gathered(), 0
        for piece in pieces(stream, rng):
            seen += len(piece)
            assert gathered.feed(piece) == (ends.get(seen) in released_after), (seen, ends.get(seen))


def test_a_message_that_never_completes_still_goes_on():
    ggml, relay_in = socket.socketpair()
    relay_out, worker = socket.socketpair()
    way = shuttle.Way(relay_in, relay_out, whole=wire.Messages(9).feed)
    stop = threading.Event()
    threading.Thread(target=shuttle.shuttle, args=([way], 0.05, lambda: not stop.is_set()), daemon=True).start()
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
    from speculum.engine.rpc.address import parse_worker

    listener = socket.create_server(("127.0.0.1", 0))
    timeout_s = 1
    link = clientlink.ClientLink(parse_worker(f"127.0.0.1:{listener.getsockname()[1]}"), read_timeout=timeout_s,
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


def test_an_answers_length_is_known_from_its_get_tensor_request_whatever_the_pieces():
    rng = random.Random(11)
    asked = 2312  # SmolLM2's hidden state, a token's answer through a worker
    get_tensor = request(8, bytes(range(40)) + struct.pack("<QQ", 0, asked))
    stream = request(6, bytes(300)) + request(10, b"") + get_tensor + request(14, bytes(24)) + request(4, bytes(8))
    for _ in range(50):
        answers = wire.Answers()
        for piece in pieces(stream, rng):
            answers.asked(piece)
        assert answers.expected == [8 + asked, 0]  # the hello's length is not named: its header says it
        assert answers.missing() == 8 + asked
        answer = struct.pack("<Q", asked) + bytes(asked)
        for piece in pieces(answer, rng):
            assert not answers.feed(piece) or piece == answer[-len(piece):]
            if answers.answers.midway:
                assert answers.missing() < 8 + asked  # (the rest of this one, as its header says)
        assert answers.expected == [0] and answers.missing() == 8  # the hello's answer: its header first


def test_the_worker_front_end_wakes_once_for_an_answer_sent_in_two_pieces():
    """ggml's server sends an answer's size, then its body: knowing the length from the request,
    the way from ggml reads the two as one (one wake, one TLS record), where it read them apart."""
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    ggml_side = socket.create_connection(listener.getsockname())
    src, _ = listener.accept()
    sink_a, sink_b = socket.socketpair()
    answers = wire.Answers()
    answers.asked(request(8, bytes(40) + struct.pack("<QQ", 0, 2312)))
    way = shuttle.Way(src, sink_a, whole=answers.feed, missing=answers.missing)
    reads = []
    original = way.read
    way.read = lambda: (reads.append(time.monotonic()), original())[1]
    way.wake_at(answers.missing())
    stop = threading.Event()
    threading.Thread(target=shuttle.shuttle, args=([way], 0.5, lambda: not stop.is_set()), daemon=True).start()
    try:
        ggml_side.sendall(struct.pack("<Q", 2312))
        time.sleep(0.1)  # the body lags, as after the worker's pass
        ggml_side.sendall(bytes(2312))
        sink_b.settimeout(5)
        got = b""
        while len(got) < 8 + 2312:
            got += sink_b.recv(65536)
        assert got == struct.pack("<Q", 2312) + bytes(2312)
        assert len(reads) == 1, reads
    finally:
        stop.set()
        for s in (listener, ggml_side, src, sink_a, sink_b):
            s.close()
