"""`speculum serve` listens before it loads: /health says loading (and requests get 503
model_loading) until the models are in; a load that fails is said on /health, and the process
exits non-zero. Real `serve --rpc` and `rpc-worker` processes: a worker frozen with SIGSTOP
holds the load at its handshake for as long as the test needs."""

from __future__ import annotations

import signal
import time

from rpc_workers import Worker
from test_server_rpc import Server


def answered_health(s: Server, timeout: float = 60):
    """The first /health answer (the server needs a moment to start listening)."""
    deadline = time.monotonic() + timeout
    while (health := s.health()).status_code == 0:
        assert s.process.poll() is None and time.monotonic() < deadline, s.output()
        time.sleep(0.05)
    return health


def assert_loading(s: Server) -> None:
    health = answered_health(s)
    assert health.status_code == 503 and health.headers["retry-after"]
    assert health.json()["status"] == "loading" and health.json()["message"].startswith("Loading")
    refused = s.chat()
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "model_loading"


def test_serve_says_loading_until_the_models_are_in_then_serves(smollm_path):
    w = Worker(insecure=True)
    w.process.send_signal(signal.SIGSTOP)  # the load waits at the worker's handshake (up to 5 s)
    s = Server(smollm_path, [w], ready=False)
    try:
        assert_loading(s)
        w.process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 120
        while (health := s.health()).status_code != 200:
            assert health.json()["status"] == "loading" and time.monotonic() < deadline, s.output()
            time.sleep(0.1)
        assert health.json()["status"] == "ready"
        answer = s.chat()
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
    finally:
        s.stop()
        w.stop()


def test_a_load_that_fails_is_said_on_health_and_the_server_exits_non_zero(smollm_path):
    w = Worker(insecure=True)
    w.process.send_signal(signal.SIGSTOP)  # frozen for good: the handshake times out, the load fails
    s = Server(smollm_path, [w], ready=False)
    try:
        assert_loading(s)
        deadline = time.monotonic() + 60
        while (health := s.health()).status_code and health.json()["status"] == "loading":
            assert time.monotonic() < deadline, s.output()
            time.sleep(0.05)
        assert health.status_code == 503, s.output()  # said before the server goes
        assert health.json()["status"] == "load_failed" and w.name in health.json()["message"]
        refused = s.chat()
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "load_failed"
        assert s.process.wait(30) == 1  # no server left running without its models
        assert f"speculum: The RPC worker at {w.name}" in s.output()
    finally:
        s.stop()
        w.stop()
