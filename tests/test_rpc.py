"""The target across machines: real `speculum rpc-worker` processes on 127.0.0.1, real models.

llama.cpp's RPC client aborts the process on any failure, so every fault that must end in
a message (not an abort) is checked before llama.cpp connects, and the abort that cannot
be avoided (a worker lost mid-generation) is checked in a `speculum generate` subprocess.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

import speculum
from speculum.engine import rpc
from speculum.engine.llama import LlamaModel, gpu_backend
from speculum.engine.loading import LoadOptions, load_decoder
from speculum.errors import SpeculumError
from speculum.rpc_worker import exposure_warning
from test_backend import QWEN_MAX_NOISE
from test_engine_real import first_difference, generate, tokens_of, top2_gap

ENV = {**os.environ, "PYTHONPATH": str(Path(speculum.__file__).parents[1]), "PYTHONIOENCODING": "utf-8"}
FAULT_TIMEOUT_S = 15  # every fault below ends in its message within this (the check's own timeout is 5 s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """One `speculum rpc-worker` process on 127.0.0.1, its stdout lines read on a thread."""

    def __init__(self, threads: int = 1):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "speculum.cli", "rpc-worker", "--port", str(self.port), "--threads", str(threads)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for("listening on", 60)

    def _read(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.process.poll() is None, f"worker ended: {self.process.stderr.read()}"
                continue
            if text in line:
                return line
        raise AssertionError(f"worker never printed {text!r}: {''.join(self.output)}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)


@pytest.fixture(scope="module")
def workers():
    pair = [Worker(), Worker()]
    yield pair
    for w in pair:
        w.stop()


def keepalive_peers() -> list[int]:
    """Ports of this process's TCP connections that have SO_KEEPALIVE on."""
    ports = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE):
                ports.append(sock.getpeername()[1])
        except OSError:
            pass
        finally:
            sock.close()
    return ports


def run_cli(*args, timeout=120, env_extra=None):
    return subprocess.run([sys.executable, "-m", "speculum.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**ENV, **(env_extra or {})})


# --- addresses, versions, the worker itself -------------------------------------------

def test_worker_addresses_are_checked_in_words():
    assert rpc.parse_endpoints("127.0.0.1:50052, 10.0.0.2:7000") == ("127.0.0.1:50052", "10.0.0.2:7000")
    for bad in ("127.0.0.1", "127.0.0.1:http", ":50052", "127.0.0.1:0", "127.0.0.1:70000", ""):
        with pytest.raises(SpeculumError, match="HOST:PORT|not a worker address"):
            rpc.parse_endpoints(bad)
    with pytest.raises(SpeculumError, match="listed twice"):
        rpc.parse_endpoints("127.0.0.1:1,127.0.0.1:1")


def test_the_protocol_we_check_is_the_one_llama_cpp_was_built_with():
    header = (Path(sysconfig.get_paths()["purelib"]) / "include" / "ggml-rpc.h").read_text()
    built = tuple(int(line.split()[-1]) for line in header.splitlines()
                  if line.startswith("#define RPC_PROTO_") and "_VERSION" in line)
    assert built == rpc.PROTOCOL


def test_rpc_is_available_in_this_build_and_doctor_says_so():
    assert rpc.availability() is None
    out = run_cli("doctor").stdout
    assert "RPC (across machines)" in out and "available (llama.cpp RPC protocol 7." in out


def test_a_worker_beyond_loopback_warns_that_anyone_can_use_it():
    assert exposure_warning("127.0.0.1", "127.0.0.1:50052", "CPU") is None
    warning = exposure_warning("192.168.1.20", "192.168.1.20:50052", "CPU")
    assert "no authentication" in warning and "anyone who can reach 192.168.1.20:50052" in warning
    assert "read what it holds" in warning


def test_worker_says_where_and_what_it_offers_and_ends_cleanly_on_sigterm():
    w = Worker()
    text = "".join(w.output)
    assert f"listening on {w.endpoint}" in text
    w.wait_for("MiB free of", 10)
    assert rpc.check_worker(w.endpoint) == rpc.PROTOCOL  # it answers llama.cpp's hello
    assert w.stop() == 0
    assert "RPC worker stopped" in "".join(w.output)
    assert "warning" not in w.process.stderr.read()  # loopback: nothing to warn about


def test_worker_on_a_port_in_use_is_one_message():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = run_cli("rpc-worker", "--port", port, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"speculum: Cannot listen on 127.0.0.1:{port}: Address already in use."]


# --- the same tokens across two workers ------------------------------------------------

COPY_TEXT = ("alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike "
             "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu")


def test_smollm_across_two_workers_gives_the_local_tokens(smollm_path, workers):
    # One attention kernel on both sides: with flash attention SmolLM2 Q4_1's logits do not
    # depend on batch shape (without it, the CPU default for a local target, they may).
    local = load_decoder(smollm_path, smollm_path, LoadOptions(n_ctx=1024, n_threads=1, flash_attn=True))  # 1: a shared machine
    prompt = tokens_of(local, f"Repeat exactly, word for word: {COPY_TEXT}")
    expected = {mode: generate(local, prompt, max_tokens=40, policy=mode, k=4)[0]
                for mode in ("off", "lookup", "draft")}
    local.target.close()
    local.draft.close()

    remote = load_decoder(smollm_path, smollm_path,
                          LoadOptions(n_ctx=1024, n_threads=1, flash_attn=True, rpc=tuple(w.endpoint for w in workers)))
    try:
        assert remote.target.facts.backend == f"RPC {workers[0].endpoint},{workers[1].endpoint}"
        assert remote.draft.facts.backend == "CPU"  # the draft stays on this machine
        assert gpu_backend() != "RPC"  # workers' devices say they are GPUs; they are not this machine's
        # llama.cpp's connections to the workers got keepalive: a vanished machine is noticed, not waited on
        assert sorted(keepalive_peers()) == sorted(w.port for w in workers)
        for mode, tokens in expected.items():
            got, cycles = generate(remote, prompt, max_tokens=40, policy=mode, k=4)
            assert got == tokens, mode  # SmolLM2 Q4_1 logits do not depend on batch shape
            if mode != "off":
                assert any(c.n_accepted for c in cycles), mode
        # A second model on the same workers shares llama.cpp's connection (a worker serves one
        # client at a time, so a fresh handshake now would wait for ever).
        with LlamaModel(smollm_path, n_ctx=256, n_threads=1, rpc=tuple(w.endpoint for w in workers)) as second:
            assert second.decode(second.tokenize("Hello")).shape == (1, second.n_vocab)
    finally:
        remote.target.close()
        remote.draft.close()
    # Both workers held layers: each served a client (the check's hello, then llama.cpp's).
    for w in workers:
        assert sum("Accepted client connection" in line for line in w.output) >= 2


def test_tensor_split_gives_each_worker_its_share_of_layers(smollm_path, workers):
    r = run_cli("generate", "--target", smollm_path, "--rpc", ",".join(w.endpoint for w in workers),
                "--tensor-split", "1,3", "--threads", 1, "--max-tokens", 1, "--mode", "off", "hi",
                env_extra={"SPECULUM_LLAMA_LOG": "1"})
    assert r.returncode == 0, r.stderr
    per_device = [r.stdout.count(f"assigned to device RPC{i},") for i in (0, 1)]
    assert per_device[0] > 0 and 2 * per_device[0] < per_device[1], per_device  # about 1:3 of 30 layers


def test_malformed_rpc_options_are_one_message_before_loading(smollm_path, capsys):
    from speculum.cli import main

    assert main(["generate", "--target", str(smollm_path), "--rpc", "127.0.0.1", "hi"]) == 2
    assert main(["generate", "--target", str(smollm_path), "--rpc", "127.0.0.1:1",
                 "--tensor-split", "3,x", "hi"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "speculum: '127.0.0.1' is not a worker address: write HOST:PORT, e.g. 127.0.0.1:50052.",
        "speculum: --tensor-split takes numbers separated by commas, e.g. 3,1: '3,x'."]


@pytest.mark.qwen
@pytest.mark.slow
def test_qwen_target_across_two_workers_draft_local_gives_the_local_tokens(
        qwen_target_path, qwen_draft_path, qwen_pair, workers):
    user = "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."
    prompt = tokens_of(qwen_pair, user)
    remote = load_decoder(qwen_target_path, qwen_draft_path,
                          LoadOptions(n_ctx=1024, n_threads=1, flash_attn=True, rpc=tuple(w.endpoint for w in workers)))
    try:
        assert remote.target.facts.backend.startswith("RPC ") and remote.draft.facts.backend == "CPU"
        for mode in ("off", "draft"):
            want, _ = generate(qwen_pair, prompt, max_tokens=32, policy=mode, k=4)
            got, cycles = generate(remote, prompt, max_tokens=32, policy=mode, k=4)
            i = first_difference(want, got)
            if i is not None:  # Q4_K_M rows may differ by kernel: allowed only at a numerical tie
                gap = top2_gap(qwen_pair.target, prompt + want[:i])
                assert gap < QWEN_MAX_NOISE, (mode, i, gap)
            if mode == "draft":
                assert any(c.n_accepted for c in cycles)
    finally:
        remote.target.close()
        remote.draft.close()


# --- faults: each one message, within a stated time -------------------------------------

class FakeWorker:
    """A TCP server on 127.0.0.1 that answers every connection with ``reply(conn)``."""

    def __init__(self, reply):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.reply = reply
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.held.append(conn)
            try:
                self.reply(conn)
            except OSError:
                pass

    def close(self):
        self.server.close()
        for c in self.held:
            c.close()


def hello_of_version(major, minor, patch):
    def reply(conn):
        conn.recv(1 + 8 + 24)
        conn.sendall(struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24))
    return reply


def load_fails(smollm_path, endpoint) -> tuple[str, float]:
    t = time.monotonic()
    with pytest.raises(SpeculumError) as error:
        load_decoder(smollm_path, None, LoadOptions(n_ctx=512, rpc=(endpoint,)))
    return str(error.value), time.monotonic() - t


@pytest.mark.parametrize("reply, words", [
    (hello_of_version(6, 0, 0), "speaks llama.cpp RPC protocol 6.0.0, this Speculum speaks 7.0.0"),
    (hello_of_version(7, 1, 0), "speaks llama.cpp RPC protocol 7.1.0"),
    (lambda conn: conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"), "not as a llama.cpp RPC worker"),
    (lambda conn: conn.close(), "closed the connection at the handshake"),  # an older worker does this
    (lambda conn: None, "did not answer within 5 s"),  # accepts, never answers (or busy with a client)
], ids=["older-protocol", "newer-minor", "garbage", "closes", "silent"])
def test_a_worker_that_cannot_serve_is_one_message_before_loading(smollm_path, reply, words):
    fake = FakeWorker(reply)
    try:
        message, seconds = load_fails(smollm_path, fake.endpoint)
    finally:
        fake.close()
    assert fake.endpoint in message and words in message, message
    assert seconds < FAULT_TIMEOUT_S
    # Still responsive: this process loads and decodes a model after it.
    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=256))
    assert len(generate(decoder, decoder.target.tokenize("Hello"), max_tokens=2)[0]) == 2
    decoder.target.close()


def test_nothing_listening_is_one_message_on_the_command_line(smollm_path):
    port = free_port()
    t = time.monotonic()
    r = run_cli("generate", "--target", smollm_path, "--rpc", f"127.0.0.1:{port}", "--max-tokens", 4, "hi",
                timeout=FAULT_TIMEOUT_S + 30)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"speculum: Cannot reach the RPC worker at 127.0.0.1:{port}: nothing is listening there. "
        "Start it there with `speculum rpc-worker`."]
    assert time.monotonic() - t < FAULT_TIMEOUT_S + 30  # most of it is Python and llama.cpp starting


def test_a_worker_killed_mid_generation_ends_the_command_with_one_message(smollm_path, workers):
    doomed = Worker()
    cli = subprocess.Popen(
        [sys.executable, "-m", "speculum.cli", "generate", "--target", str(smollm_path), "--mode", "off",
         "--rpc", f"{workers[0].endpoint},{doomed.endpoint}", "--max-tokens", "2000", "--json",
         "Write a very long story about a lighthouse keeper."],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        first = cli.stdout.readline()  # a cycle came back across both workers
        assert '"type": "cycle"' in first, cli.stderr.read()
        doomed.process.kill()
        t = time.monotonic()
        rest, err = cli.communicate(timeout=FAULT_TIMEOUT_S)
        seconds = time.monotonic() - t
    finally:
        if cli.poll() is None:
            cli.kill()
        doomed.stop()
    # llama.cpp aborts the process (GGML_ABORT in its RPC thread); the abort hook says why and exits 2.
    assert cli.returncode == 2, err
    assert err.strip().splitlines() == [
        f"speculum: Lost the connection to the RPC worker at {doomed.endpoint}: it stopped, "
        "or the network dropped. llama.cpp cannot continue without it; start the worker again and rerun."]
    assert '"type": "summary"' not in rest
    assert seconds < FAULT_TIMEOUT_S
    # The surviving worker serves the next client.
    assert rpc.check_worker(workers[0].endpoint) == rpc.PROTOCOL
