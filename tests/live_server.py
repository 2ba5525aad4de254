"""A real `speculum serve` app on 127.0.0.1 over the real SmolLM2 model: ``LiveServer``, and the
``decoder`` and ``server`` fixtures the server tests share (registered in conftest.py)."""

from __future__ import annotations

import socket
import threading
import time

import openai
import pytest
import uvicorn

from speculum.engine.loading import load_decoder
from speculum.engine.settings import LoadOptions
from speculum.server import listen
from speculum.server.app import create_app
from speculum.server.service import ServedModel

MODEL = "smol"
MESSAGES = [{"role": "user", "content": "Copy this exactly: The quick brown fox jumps over the lazy dog."}]


class LiveServer:
    def __init__(self, served: ServedModel, api_key: str | None = None, cors_origins: list[str] | None = None,
                 **listening):
        self.served = served
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        app = create_app(served, api_key=api_key, cors_origins=cors_origins, bind_host="127.0.0.1")
        self.server = uvicorn.Server(listen.config(app, "127.0.0.1", self.port, **listening))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=300)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def decoder(smollm_path):
    # With flash attention SmolLM2 Q4_1's logits are bit-identical whatever the batch (without
    # it, the default on the CPU, answers may part at numerical ties): compared token for token.
    # No n-gram memory: these tests count what each request drafts, and repeated requests would
    # draft from the earlier ones (test_ngram_memory.py, test_prompt_cache.py serve with it).
    d = load_decoder(smollm_path, None, LoadOptions(n_ctx=1024, flash_attn=True, ngram_memory=False))
    yield d
    d.target.close()


@pytest.fixture
def server(decoder):
    servers = []

    def start(api_key=None, mode="lookup", max_waiting=8, **listening):
        s = LiveServer(ServedModel(decoder, MODEL, mode=mode, max_waiting=max_waiting), api_key, **listening)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()
