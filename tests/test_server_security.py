"""`speculum serve` against what a web page, a slow client or a careless one can send: a real
server on 127.0.0.1 over SmolLM2, raw HTTP and raw sockets."""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest

from live_server import MESSAGES, MODEL
from speculum.protocol import Started, CycleEvent

CHAT = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}


def count_requests(s) -> list:
    """Every request that reached the engine."""
    started = []
    s.served.on_event = lambda event: started.append(event.prompt_tokens) if isinstance(event, Started) else None
    return started


def post(s, body, **headers):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(s.url + CHAT, content=data, headers={"Content-Type": "application/json", **headers},
                      timeout=120)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "10.0.0.1",
                                  "localhost.evil.example", "[::2]:80"])
def test_a_foreign_host_name_is_refused_before_any_work(server, host):
    s = server()
    started = count_requests(s)
    for response in (httpx.get(s.url + "/v1/models", headers={"Host": host}, timeout=30),
                     post(s, BODY, Host=host)):
        assert response.status_code == 403, response.text
        error = response.json()["error"]
        assert error["code"] == "forbidden_host" and "localhost" in error["message"]
    assert started == []


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1234", "api.localhost", "127.0.0.1", "127.9.8.7:80",
                                  "[::1]", "[::1]:8080"])
def test_loopback_host_names_are_served(server, host):
    s = server()
    assert httpx.get(s.url + "/v1/models", headers={"Host": host}, timeout=30).status_code == 200


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_a_post_that_is_not_json_is_refused_before_any_work(server, content_type):
    s = server()
    started = count_requests(s)
    headers = {"Content-Type": content_type} if content_type else {}
    response = httpx.post(s.url + CHAT, content=json.dumps(BODY), headers=headers, timeout=30)
    assert response.status_code == 415
    assert "application/json" in response.json()["error"]["message"]
    assert started == []
    # With its charset, JSON is JSON.
    assert post(s, BODY, **{"Content-Type": "application/json; charset=utf-8"}).status_code == 200


def test_a_foreign_origin_is_refused_before_any_generation(server):
    s = server()
    started = count_requests(s)
    # The cross-site "simple request" a page sends without asking: refused on the media type.
    plain = httpx.post(s.url + CHAT, content=json.dumps(BODY), timeout=30,
                       headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert plain.status_code == 403 and plain.json()["error"]["code"] == "forbidden_origin"
    as_json = post(s, BODY, Origin="http://evil.example")
    assert as_json.status_code == 403 and "--cors-origin" in as_json.json()["error"]["message"]
    hidden = httpx.get(s.url + "/v1/models", headers={"Sec-Fetch-Site": "cross-site"}, timeout=30)
    assert hidden.status_code == 403
    preflight = httpx.options(s.url + CHAT, timeout=30, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers
    other_port = post(s, BODY, Origin="http://localhost:1")  # another program's page on this machine
    assert other_port.status_code == 403
    assert started == []  # not one request reached the model
    # The server's own origin, under any loopback name, is its own.
    assert post(s, BODY, Origin=s.url).status_code == 200 and len(started) == 1
    assert post(s, BODY, Origin=f"http://localhost:{s.port}").status_code == 200 and len(started) == 2


def test_an_allowed_origin_passes_preflight_and_gets_cors_headers(server):
    s = server(cors_origins=["https://app.example"])
    preflight = httpx.options(s.url + CHAT, timeout=30, headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "content-type" in preflight.headers["access-control-allow-headers"]
    response = post(s, BODY, Origin="https://app.example")
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == "https://app.example"
    assert post(s, BODY, Origin="https://other.example").status_code == 403


def test_a_connection_that_never_finishes_its_headers_is_closed(server):
    s = server(header_timeout=1.0)
    with socket.create_connection(("127.0.0.1", s.port), timeout=60) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < 50:  # a byte now and then: uvicorn's own keep-alive restarts on each
            try:
                sock.sendall(b"X")
                time.sleep(0.2)
                closed = sock.recv(1, socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                continue
            except OSError:
                closed = True
            if closed:
                break
        assert closed, "the server kept a connection whose headers never ended"
    # A connection with nothing sent at all is closed too; an honest one is served.
    with socket.create_connection(("127.0.0.1", s.port), timeout=60) as idle:
        assert idle.recv(1) == b""
    assert httpx.get(s.url + "/v1/models", timeout=30).status_code == 200


def test_connections_beyond_the_cap_are_closed_at_once(server):
    s = server(max_connections=3)
    held = [socket.create_connection(("127.0.0.1", s.port), timeout=30) for _ in range(3)]
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=30) as extra:
            assert extra.recv(1) == b""  # closed without an answer
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 30
    while True:  # once they are gone the server takes connections again
        try:
            if httpx.get(s.url + "/v1/models", timeout=30).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _deep(n: int) -> bytes:
    return b'{"model": "smol", "messages": ' + b"[" * n + b"]" * n + b"}"


@pytest.mark.parametrize("body, words, param", [
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi \ud800 there"}]}),
     "surrogate", "messages[0].content"),
    (json.dumps({"model": MODEL, "messages": MESSAGES, "stop": ["\udfff"]}), "surrogate", "stop[0]"),
    (json.dumps({"model": MODEL, "messages": MESSAGES, "prediction": {"type": "content", "content": "\ud83d"}}),
     "surrogate", "prediction.content"),
    (json.dumps({"model": MODEL, "prompt": "x\udc00"}), "surrogate", "prompt"),
    (_deep(100_000), "nested", None),
    (_deep(200), "nested", None),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "word " * 4_000_000}]}), "MB", None),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "word " * 1_000_000}]}),
     "context", "messages"),
])
def test_client_mistakes_are_400_with_a_message_never_500(server, body, words, param):
    s = server()
    started = count_requests(s)
    path = "/v1/completions" if '"prompt"' in str(body[:40]) else CHAT
    response = httpx.post(s.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=120)
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert words in error["message"] and error["param"] == param
    assert started == []
    assert post(s, BODY).status_code == 200  # and the server serves on


def test_a_non_streamed_client_that_leaves_logs_no_error(server, caplog):
    s = server(mode="off")
    errors = []

    class Collect(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.ERROR:
                errors.append(record.getMessage())

    handler = Collect()
    logging.getLogger("uvicorn.error").addHandler(handler)
    seen = []
    s.served.on_event = lambda event: seen.append(event.cycle) if isinstance(event, CycleEvent) else None
    try:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up mid-answer and closes
            post_long = {"model": MODEL, "messages": [{"role": "user", "content": "Write a very long story."}],
                         "max_tokens": 600}
            httpx.post(s.url + CHAT, json=post_long, timeout=httpx.Timeout(30, read=0.5))
        deadline = time.monotonic() + 60
        while not (seen and seen[-1].finish):
            assert time.monotonic() < deadline, "the generation did not stop after the client left"
            time.sleep(0.05)
        assert seen[-1].finish == "stopped"
        assert post(s, BODY).status_code == 200
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert errors == [] and not [r for r in caplog.records if r.levelno >= logging.ERROR]
