"""`speculum serve --rpc` when a worker is lost: real `speculum rpc-worker` processes on 127.0.0.1,
a real server process, SmolLM2. A lost or frozen worker ends the request, never the server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import pytest

from rpc_workers import ENV, Worker, free_port

PROMPT = [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}]


class Server:
    """`speculum serve --rpc WORKER[,WORKER]` on 127.0.0.1 (no --rpc without workers), its stderr
    kept in a file; a fresh data folder unless one is given."""

    def __init__(self, model, workers: list[Worker], *extra: str, ready: bool = True, mode: str = "off",
                 data_dir: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile(mode="w+")
        rpc = ["--rpc", ",".join(w.endpoint for w in workers)] if workers else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "speculum.cli", "serve", "--target", str(model), "--mode", mode, "--threads", "1",
             *rpc, "--port", str(self.port), "--model-id", "m", *extra],
            stdout=self.log, stderr=self.log, text=True,
            env={**ENV, "SPECULUM_DATA_DIR": data_dir or tempfile.mkdtemp(prefix="speculum-serve-")})
        deadline = time.monotonic() + 120
        while ready and self.health().status_code != 200:
            assert self.process.poll() is None and time.monotonic() < deadline, self.output()
            time.sleep(0.2)

    def health(self) -> httpx.Response:
        try:
            return httpx.get(self.url + "/health", timeout=30)
        except httpx.TransportError:
            return httpx.Response(0)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def chat(self, max_tokens: int = 8, timeout: float = 120) -> httpx.Response:
        return httpx.post(self.url + "/v1/chat/completions", timeout=timeout,
                          json={"model": "m", "messages": PROMPT, "max_tokens": max_tokens})

    def stream_until_fault(self, fault, read_timeout: float) -> list[str]:
        """A long streamed answer; ``fault()`` once its first text arrives; every data line, to the end."""
        lines, faulted = [], False
        with httpx.stream("POST", self.url + "/v1/chat/completions", json={
                "model": "m", "messages": PROMPT, "max_tokens": 4000, "stream": True},
                timeout=httpx.Timeout(30, read=read_timeout)) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                lines.append(line[6:])
                if not faulted and '"content": "' in line:
                    fault()
                    faulted = True
        assert faulted
        return lines

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _error_of(lines: list[str]) -> dict:
    assert lines[-1] == "[DONE]", lines[-3:]
    return json.loads(lines[-2])["error"]


@pytest.fixture
def served(smollm_path):
    made: list = []

    def start(workers: list[Worker], *extra: str) -> Server:
        made.append(Server(smollm_path, workers, *extra))
        return made[-1]

    yield start
    for s in made:
        s.stop()


@pytest.mark.parametrize("others", [0, 1], ids=["one worker", "and a survivor"])
def test_a_killed_worker_ends_the_stream_with_an_error_and_the_server_serves_again_once_it_is_back(served, others):
    survivors = [Worker(insecure=True) for _ in range(others)]  # it serves one client: the reload must free it
    w = Worker(insecure=True)
    try:
        s = served(survivors + [w])
        queued: dict = {}
        waiter = threading.Thread(target=lambda: queued.update(answer=s.chat()))

        def kill_with_one_waiting() -> None:
            waiter.start()
            while s.health().json()["waiting"] < 1:  # the next request waits its turn
                time.sleep(0.05)
            w.process.kill()

        lines = s.stream_until_fault(kill_with_one_waiting, read_timeout=30)
        w.process.wait(10)
        error = _error_of(lines)
        assert error["code"] == "worker_lost" and w.name in error["message"]
        waiter.join(60)  # it never runs on the given-up models: a 503 that says why
        assert queued["answer"].status_code == 503 and queued["answer"].json()["error"]["code"] == "worker_lost"
        health = s.health()
        assert health.status_code == 503
        assert health.json()["status"] == "worker_lost" and w.name in health.json()["message"]
        refused = s.chat()  # meanwhile: a 503 in OpenAI's shape that says why, at once
        assert refused.status_code == 503 and w.name in refused.json()["error"]["message"]
        assert s.process.poll() is None  # the server runs on

        w = Worker(insecure=True, port=w.port)  # the same worker, started again
        answer = s.chat()  # the models load again, and this request is answered
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        assert s.health().json()["status"] == "ready"
    finally:
        for worker in survivors + [w]:
            worker.stop()


def test_a_frozen_worker_ends_the_stream_with_an_error_naming_it_within_the_timeout(served):
    w = Worker(insecure=True)
    timeout_s = 3
    try:
        s = served([w], "--rpc-timeout", str(timeout_s))
        # The read timeout is the promised bound: the error event comes within it, or the stream fails.
        lines = s.stream_until_fault(lambda: w.process.send_signal(signal.SIGSTOP), read_timeout=timeout_s + 5)
        error = _error_of(lines)
        assert error["code"] == "worker_lost"
        assert f"The RPC worker at {w.name} did not answer for {timeout_s} s" in error["message"]
        health = s.health()
        assert health.json()["status"] == "worker_lost" and w.name in health.json()["message"]
        assert s.process.poll() is None

        w.process.send_signal(signal.SIGCONT)  # the laptop wakes up
        assert s.chat().status_code == 200  # the models load again, and this request is answered
        w.process.send_signal(signal.SIGSTOP)
        refused = s.chat(timeout=timeout_s + 5)  # not streamed: a 503 in OpenAI's shape, within the bound
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "worker_lost" and w.name in refused.json()["error"]["message"]
        assert s.process.poll() is None
    finally:
        w.stop()


def test_loading_again_after_a_lost_worker_frees_the_given_up_draft_and_saved_prompts(smollm_path):
    """In-process: the state a lost worker leaves (its thread parked in the target's pass), then the
    reload. The given-up target stays (its buffers live on the dead worker); what runs here is freed."""
    import asyncio

    from speculum.engine.loading import load_decoder
    from speculum.engine.settings import LoadOptions
    from speculum.server.service import ServedModel, ServerState

    def load():
        return load_decoder(smollm_path, smollm_path, LoadOptions(n_ctx=1024))

    old = load()
    for text in ("the lighthouse keeper's log, " * 12, "a different prompt about ships, " * 12):
        list(old.generate(old.target.tokenize(text), max_tokens=2, policy="draft"))
    assert len(old.prompt_cache) > 0
    served = ServedModel(old, "m", mode="draft", reload=load)
    served.state = ServerState.WORKER_LOST
    asyncio.run(served.recover())
    assert served.state == ServerState.READY and served.decoder is not old
    assert old.draft._model is None and len(old.prompt_cache) == 0  # freed
    assert old.target._model is not None  # kept: freeing it would call the lost worker
    assert list(served.decoder.generate(served.decoder.target.tokenize("Hi"), max_tokens=2))
    served.decoder.target.close()
    served.decoder.draft.close()
