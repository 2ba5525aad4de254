"""The target across machines: real `speculum rpc-worker` processes on 127.0.0.1, real models.

llama.cpp's RPC client aborts the process on any failure, so every fault that must end in
a message (not an abort) is checked before llama.cpp connects, and the abort that cannot
be avoided (a worker lost mid-generation) is checked in a `speculum generate` subprocess.
"""

from __future__ import annotations

import os
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

from speculum.engine.rpc import client as rpc
from speculum.engine.llama.model import LlamaModel
from speculum.engine.llama.native import gpu_backend
from speculum.engine.loading import load_decoder
from speculum.engine.settings import LoadOptions
from speculum.engine.vocabulary import Device
from speculum.engine.rpc.address import WorkerAddress, parse_worker
from speculum.errors import SpeculumError
from speculum.rpc_worker import exposure_warning
from test_engine_real import first_difference, generate, tokens_of
from rpc_workers import ENV, Worker, free_port

FAULT_TIMEOUT_S = 15  # every fault below ends in its message within this (the check's own timeout is 5 s)


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

FP, TOKEN = "A" * 43, "b-_" * 7 + "c"  # the shapes of a fingerprint and a token


def test_worker_addresses_are_checked_in_words():
    assert rpc.parse_endpoints("127.0.0.1:50052, 10.0.0.2:7000") == ("127.0.0.1:50052", "10.0.0.2:7000")
    assert rpc.parse_endpoints("[::1]:7000,Worker-1.example.org.:9") == ("[::1]:7000", "worker-1.example.org:9")
    assert rpc.parse_endpoints(f"[::1]:7000/{FP}/{TOKEN}") == (f"[::1]:7000/{FP}/{TOKEN}",)
    assert rpc.names([f"10.0.0.2:7000/{FP}/{TOKEN}", "[::1]:1"]) == "10.0.0.2:7000,[::1]:1"  # never the token
    for bad in ("127.0.0.1", "127.0.0.1:http", ":50052", "127.0.0.1:0", "127.0.0.1:70000", ""):
        with pytest.raises(SpeculumError, match="HOST:PORT|not a worker address|not a port|names no host"):
            rpc.parse_endpoints(bad)
    with pytest.raises(SpeculumError, match="listed twice"):
        rpc.parse_endpoints("127.0.0.1:1,127.0.0.1:1")


# Each a mistake a user makes or a hostile value: (what --rpc gets, what the one line says)
BAD_RPC = [
    ("127.0.0.1", "is not a worker address"),
    ("a" * 10_000 + ":50052", "is 10000 characters long; a DNS name has at most 253"),
    ("x" * 64 + ".example.org:50052", "has a part of 64 characters; each part between dots has at most 63"),
    ("127.0.0.1:\u0665\u0660\u0660\u0665\u0662", "is written in non-ASCII digits: use 0-9"),
    ("127.0.0.1:\uff15\uff10\uff10\uff15\uff12", "is written in non-ASCII digits: use 0-9"),
    ("127.0.0.1:50_052", "is not a port"),
    ("127.0.0.1:0", "is not a port"),
    ("127.0.0.1:65536", "is not a port"),
    ("127.0.0.1:" + "9" * 5000, "is not a port"),
    ("::1:50052", "write an IPv6 address in brackets"),
    ("[::1:50052", "write [IPv6]:PORT"),
    ("[::g]:50052", "in brackets is not an IPv6 address"),
    ("999.1.1.1:50052", "is not an IPv4 address"),
    ("bad_host!:50052", "is not a host name"),
    ("h\u00f6st:50052", "non-ASCII characters"),
    ("evil\x1b[31m:50052", "is not a host name"),
    (f"127.0.0.1:50052/{FP}", "is not a pairing string"),
    (f"127.0.0.1:50052/{FP[:-1]}/{TOKEN}", "certificate fingerprint in the pairing string for 127.0.0.1:50052 is damaged"),
    (f"127.0.0.1:50052/{FP}/{TOKEN}!", "token in the pairing string for 127.0.0.1:50052 is damaged"),
]


@pytest.mark.parametrize("value, words", BAD_RPC, ids=[f"bad{i}" for i in range(len(BAD_RPC))])
def test_each_bad_rpc_value_is_exit_2_and_one_line(smollm_path, capsys, value, words):
    from speculum.cli import main

    assert main(["generate", "--target", str(smollm_path), "--rpc", value, "hi"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("speculum: ") and words in err, err
    assert "\x1b" not in err and len(err) < 300  # what the user wrote is shown short, control characters escaped


def test_bad_worker_ports_and_hosts_are_exit_2_and_one_line():
    for args, words in ((["--port", "\u0665\u0660"], "non-ASCII digits"), (["--port", "0"], "not a port"),
                        (["--port", "1" * 3000], "not a port"), (["--host", "my.laptop"], "takes an IP address"),
                        (["--host", "::1", "--insecure"], "IPv4 only")):
        r = run_cli("rpc-worker", *args, timeout=60)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and words in r.stderr, (args, r.stderr)


def test_a_bad_read_timeout_is_one_message(smollm_path, capsys):
    from speculum.cli import main

    assert main(["generate", "--target", str(smollm_path), "--rpc", "127.0.0.1:1", "--rpc-timeout", "nan", "hi"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "speculum: The RPC read timeout must be a number of seconds from 1 to 86400, not 'nan'."]


def test_the_protocol_we_check_is_the_one_llama_cpp_was_built_with():
    header = (Path(sysconfig.get_paths()["purelib"]) / "include" / "ggml-rpc.h").read_text()
    built = tuple(int(line.split()[-1]) for line in header.splitlines()
                  if line.startswith("#define RPC_PROTO_") and "_VERSION" in line)
    assert built == rpc.PROTOCOL


def test_rpc_is_available_in_this_build_and_doctor_says_so():
    assert rpc.availability() is None
    out = run_cli("doctor").stdout
    assert "RPC (across machines)" in out and "available (llama.cpp RPC protocol 7." in out
    assert "a target on RPC workers as on their device: off on CPU workers" in out


def test_json_reports_flash_attention_per_model_and_the_device_each_worker_computes_on(smollm_path, workers):
    import json

    r = run_cli("generate", "--target", smollm_path, "--draft", smollm_path, "--rpc", workers[0].endpoint,
                "--threads", 1, "--max-tokens", 2, "--json", "hi")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.splitlines()[-1])
    target, draft = summary["attention"]
    assert target["model"] == "target" and target["devices"] == f"RPC {workers[0].name}"
    assert target["flash_attn"] == "off"  # as a local target on this CPU
    assert target["workers"][workers[0].name].startswith("CPU (")
    assert target["output_layer"] == "this machine"  # only hidden states cross the network
    assert draft == {"model": "draft", "devices": "CPU", "flash_attn": "llama.cpp's choice"}


@pytest.mark.skipif(sys.platform == "win32", reason="C stdio is reached through CDLL(None), which Windows lacks")
def test_llama_cpps_lines_reach_the_workers_stdout_whole_even_when_python_runs_unbuffered():
    # llama.cpp's server thread prints through C stdio, the worker's own lines go straight to the
    # same pipe: a half-written C line would be split by one of ours.
    script = """if True:
        import ctypes, os, sys
        from speculum.engine.rpc import client as rpc
        rpc.c_stdout_line_buffered()
        libc = ctypes.CDLL(None)
        stdout = ctypes.c_void_p.in_dll(libc, "__stdoutp" if sys.platform == "darwin" else "stdout")
        libc.fputs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        libc.fputs(b"Accepted client", stdout)
        os.write(1, b"speculum: ours\\n")
        libc.fputs(b" connection\\n", stdout)
        os._exit(0)  # (no exit-time flush: what is written is what the pipe got)
    """
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**ENV, "PYTHONUNBUFFERED": "1"})
    assert out.stdout == "speculum: ours\nAccepted client connection\n", out.stdout + out.stderr


def test_an_insecure_worker_beyond_loopback_warns_that_anyone_can_use_it():
    assert exposure_warning("127.0.0.1", "127.0.0.1:50052", "CPU") is None
    warning = exposure_warning("192.168.1.20", "192.168.1.20:50052", "CPU")
    assert "--insecure" in warning and "no authentication" in warning
    assert "anyone who can reach 192.168.1.20:50052" in warning and "read what it holds" in warning


def test_worker_says_where_and_what_it_offers_and_ends_cleanly_on_sigterm():
    w = Worker()
    try:
        text = "".join(w.output)
        assert f"listening on {w.name}: secure link" in text and "MiB free of" in text
        # llama.cpp's own server listens on loopback only, on a port of its own, behind the front end
        ggml_endpoint = next(line.split(":", 1)[1].strip() for line in w.output if line.strip().startswith("endpoint"))
        assert ggml_endpoint.startswith("127.0.0.1:") and ggml_endpoint != w.name
        # One pairing string, on a line of its own: address, port, certificate fingerprint, token.
        assert rpc.parse_endpoints(w.endpoint)[0].startswith(f"{w.name}/") and w.count(w.endpoint) == 1
        assert rpc.check_worker(w.endpoint) == rpc.PROTOCOL  # it answers llama.cpp's hello, through the link
    finally:
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


def test_smollm_greedy_tokens_are_the_local_ones_on_one_and_two_workers(smollm_path, workers):
    # Default settings: the RPC target takes the local target's attention path (flash attention
    # off for a target computing on CPUs), so the tokens are the same, not merely close.
    options = {"n_ctx": 1024, "n_threads": 1}  # 1 thread: a shared machine
    local = load_decoder(smollm_path, smollm_path, LoadOptions(**options))
    prompt = tokens_of(local, f"Repeat exactly, word for word: {COPY_TEXT}")
    expected = {mode: generate(local, prompt, max_tokens=40, policy=mode, k=4)[0]
                for mode in ("off", "lookup", "draft")}
    assert local.target.flash_attn is False  # the CPU default for a target
    local.target.close()
    local.draft.close()

    for on in (workers[:1], workers):
        remote = load_decoder(smollm_path, smollm_path, LoadOptions(**options, rpc=tuple(w.endpoint for w in on)))
        try:
            assert remote.target.flash_attn is False, on  # the workers said they compute on a CPU
            assert remote.target.facts.backend == f"RPC {','.join(w.name for w in on)}"  # no token shown
            assert remote.draft.facts.backend == "CPU"  # the draft stays on this machine
            assert remote.target.facts.device == Device.RPC and remote.draft.facts.device == Device.CPU
            for mode, tokens in expected.items():
                got, cycles = generate(remote, prompt, max_tokens=40, policy=mode, k=4)
                assert got == tokens, (len(on), mode)
                if mode != "off":
                    assert any(c.n_accepted for c in cycles), mode
            if len(on) < 2:
                continue
            assert gpu_backend() != "RPC"  # workers' devices say they are GPUs; they are not this machine's
            # the relays' connections to the workers have keepalive: a vanished machine is noticed, not waited on
            assert sorted(keepalive_peers()) == sorted(w.port for w in workers)
            # A second model on the same workers shares llama.cpp's connection (a worker serves one
            # client at a time, so a fresh handshake now would wait for ever).
            with LlamaModel(smollm_path, LoadOptions(n_ctx=256, n_threads=1, rpc=tuple(w.endpoint for w in on))) as second:
                assert second.decode(second.tokenize("Hello")).shape == (1, second.n_vocab)
        finally:
            remote.target.close()
            remote.draft.close()
    # Both workers held layers: each served a client (the check's hello, then llama.cpp's).
    for w in workers:
        assert w.count("Accepted client connection") >= 2


class CountingRelay:
    """127.0.0.1:port -> a worker, counting the bytes that come back from it."""

    def __init__(self, port: int):
        self.from_worker = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, args=(port,), daemon=True).start()

    def _accept(self, port: int) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            worker = socket.create_connection(("127.0.0.1", port))
            threading.Thread(target=self._pump, args=(client, worker, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(worker, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, back: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if back:
                    self.from_worker += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):  # shutdown: a close alone would not wake the other direction's recv
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


def test_the_output_layer_stays_here_so_only_hidden_states_cross_the_network(smollm_path):
    # All the repeating layers go to the worker, the output layer stays: a token's answer from the
    # worker is its hidden state (576 floats for SmolLM2), not its logits (49,152 floats).
    worker = Worker(insecure=True)
    relay = CountingRelay(worker.port)
    try:
        with LlamaModel(smollm_path, LoadOptions(n_ctx=256, n_threads=1, rpc=(relay.endpoint,))) as model:
            assert model.facts.backend == f"RPC {relay.endpoint}" and model.facts.device == Device.RPC
            logits = model.decode(model.tokenize("The capital of France is"))
            before, steps = relay.from_worker, 8
            for _ in range(steps):
                logits = model.decode([int(logits[0].argmax())])
            per_token = (relay.from_worker - before) / steps
            assert per_token < model.n_vocab * 4 / 10, per_token
    finally:
        relay.server.close()
        worker.stop()


def commands_in(record: bytes) -> list[int]:
    """The llama.cpp RPC requests a record carries, by command; ValueError if one is cut."""
    commands, at = [], 0
    while at < len(record):
        (size,) = struct.unpack_from("<Q", record, at + 1)
        commands.append(record[at])
        at += 9 + size
    if at != len(record):
        raise ValueError(f"a request cut at a record's end: {commands}")
    return commands


def test_a_tokens_graph_crosses_the_secure_link_with_the_request_for_its_result(smollm_path, monkeypatch):
    # A token's graph (GRAPH_RECOMPUTE, 16) is held for the request for its result (GET_TENSOR, 8),
    # on which ggml waits: one record, one wake of the worker's front end on the token's critical
    # path. Every record carries whole requests. (That the inputs before it are not held for it:
    # test_rpc_link's test of Gathered; when they go together here depends on the relay's timing.)
    import ssl

    from speculum.engine.rpc import clientlink, shuttle

    records, write = [], shuttle.Way.write

    def counted(way):
        if way.out and isinstance(way.dst, ssl.SSLSocket):
            records.append(bytes(way.out))
        return write(way)

    monkeypatch.setattr(shuttle.Way, "write", counted)
    # The rule, not the clock: a busy machine could keep ggml from sending the GET_TENSOR within
    # the 2 ms a graph is held at most.
    monkeypatch.setattr(clientlink, "GATHER_S", 0.5)
    worker = Worker()
    try:
        with LlamaModel(smollm_path, LoadOptions(n_ctx=256, n_threads=1, rpc=(worker.endpoint,))) as model:
            logits = model.decode(model.tokenize("The capital of France is"))
            logits = model.decode([int(logits[0].argmax())])  # (a single token's graph, set up once)
            records.clear()
            steps = 8
            for _ in range(steps):
                logits = model.decode([int(logits[0].argmax())])
            carried = [commands_in(r) for r in records]  # (before the model's closing requests)
    finally:
        worker.stop()
    graphs = [c for c in carried if 16 in c or 10 in c]
    assert len(graphs) == steps and all(c[-2:] == [16, 8] and set(c[:-2]) <= {6} for c in graphs), carried
    assert {command for c in carried for command in c} == {6, 16, 8}, carried


def test_tensor_split_gives_each_worker_its_share_of_layers(smollm_path, workers):
    r = run_cli("generate", "--target", smollm_path, "--rpc", ",".join(w.endpoint for w in workers),
                "--tensor-split", "1,3", "--threads", 1, "--max-tokens", 1, "--mode", "off", "hi",
                env_extra={"SPECULUM_LLAMA_LOG": "1"})
    assert r.returncode == 0, r.stderr
    per_device = [r.stdout.count(f"assigned to device RPC{i},") for i in (0, 1)]
    assert per_device[0] > 0 and 2 * per_device[0] < per_device[1], per_device  # about 1:3 of 30 layers


def test_malformed_rpc_options_are_one_message_before_loading(smollm_path, capsys):
    from speculum.cli import main

    assert main(["generate", "--target", str(smollm_path), "--rpc", "127.0.0.1:1",
                 "--tensor-split", "3,x", "hi"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "speculum: --tensor-split takes numbers separated by commas, e.g. 3,1: '3,x'."]


@pytest.mark.qwen
@pytest.mark.slow
def test_qwen_greedy_tokens_are_the_local_ones_on_one_and_two_workers(qwen_target_path, qwen_draft_path, workers):
    user = "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."
    options = {"n_ctx": 1024, "n_threads": 1}
    local = load_decoder(qwen_target_path, qwen_draft_path, LoadOptions(**options))
    prompt = tokens_of(local, user)
    want = {mode: generate(local, prompt, max_tokens=32, policy=mode, k=4)[0] for mode in ("off", "draft")}
    local.target.close()
    local.draft.close()
    for on in (workers[:1], workers):
        remote = load_decoder(qwen_target_path, qwen_draft_path,
                              LoadOptions(**options, rpc=tuple(w.endpoint for w in on)))
        try:
            assert remote.target.facts.backend.startswith("RPC ") and remote.draft.facts.backend == "CPU"
            for mode, tokens in want.items():
                got, cycles = generate(remote, prompt, max_tokens=32, policy=mode, k=4)
                assert got == tokens, (len(on), mode, first_difference(tokens, got))
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
        f"speculum: Lost the connection to the RPC worker at {doomed.name}: it stopped, "
        "or the network dropped. llama.cpp cannot continue without it; start the worker again and rerun."]
    assert '"type": "summary"' not in rest
    assert seconds < FAULT_TIMEOUT_S
    # The surviving worker serves the next client.
    assert rpc.check_worker(workers[0].endpoint) == rpc.PROTOCOL


# --- the secure link ----------------------------------------------------------------------

def test_a_worker_on_all_interfaces_prints_a_usable_pairing_string_for_each_on_its_own_line():
    from ipaddress import ip_address

    from speculum.rpc_worker import _hints, interface_addresses
    from speculum.engine.rpc.identity import Identity

    found = interface_addresses(ip_address("0.0.0.0"))
    assert found and all(not ip_address(ip).is_unspecified for _, ip in found)
    assert ("lo", "127.0.0.1") in found and found[-1][1].startswith("127.")  # loopback last: others first
    identity = Identity(Path("c"), Path("k"), FP, TOKEN)
    lines = _hints(ip_address("0.0.0.0"), 50052, identity)[1:]
    assert len(lines) == len(found) and all("\n" not in line for line in lines)
    for (interface, ip), line in zip(found, lines):
        assert rpc.parse_endpoints(line.split("--rpc ")[1].split()[0]) == (f"{ip}:50052/{FP}/{TOKEN}",)
        assert interface in line
    assert "0.0.0.0" not in "".join(lines)
    assert interface_addresses(ip_address("10.1.2.3")) == [("", "10.1.2.3")]  # one address: that one


def test_the_pairing_string_survives_a_restart_until_new_pairing_is_asked(tmp_path):
    strings = []
    for extra in ((), (), ("--new-pairing",)):
        w = Worker(data_dir=str(tmp_path), extra=extra)
        strings.append(parse_worker(w.endpoint))
        w.stop()
    assert strings[0].fingerprint == strings[1].fingerprint != strings[2].fingerprint
    assert strings[0].token == strings[1].token != strings[2].token
    assert oct((tmp_path / "rpc-worker" / "token").stat().st_mode & 0o777) == "0o600"  # a secret


ENDED = "bytes passed to llama.cpp ("  # the front end's last line for each TLS connection


def _bytes_to_llama_cpp(w: Worker) -> int:
    """What the worker's front end has passed to llama.cpp's parser, all clients together."""
    totals = [int(line.rsplit("(", 1)[1].split()[0]) for line in w.output if line.rstrip().endswith("in all)")]
    return max(totals, default=0)  # (a running total)


def test_the_secure_link_refuses_a_wrong_token_or_certificate_before_llama_cpp_hears_a_byte():
    import ssl

    w = Worker()
    try:
        paired = parse_worker(w.endpoint)
        other = "Z" * 43 if paired.fingerprint != "Z" * 43 else "Y" * 43
        wrong_token = WorkerAddress(paired.host, paired.port, paired.fingerprint, TOKEN).text()
        wrong_certificate = WorkerAddress(paired.host, paired.port, other, paired.token).text()
        # (the worker's own probe that ggml listens: accepted once, and printed on ggml's time)
        heard, accepted = _bytes_to_llama_cpp(w), w.wait_count("Accepted client connection", 1, 10)
        ended = w.count(ENDED)

        with pytest.raises(SpeculumError, match=f"The RPC worker at {w.name} refused the token"):
            rpc.check_worker(wrong_token)
        w.wait_for("wrong token", 10)
        with pytest.raises(SpeculumError, match="presented a different certificate than its pairing string names"):
            rpc.check_worker(wrong_certificate)
        w.wait_for("sent no token", 10)  # this client closed before sending it
        with pytest.raises(SpeculumError, match=f"serves the secure link: pass the pairing string it printed "
                                                f"\\({w.name}/FINGERPRINT/TOKEN\\) as --rpc, not {w.name} alone"):
            rpc.check_worker(w.name)  # llama.cpp's plain hello to the TLS port: no TLS, no byte passes
        # A TLS client that speaks llama.cpp's RPC at once (a hello, then a graph) instead of the token.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with context.wrap_socket(socket.create_connection(("127.0.0.1", w.port), timeout=10)) as s:
            s.sendall(bytes([14]) + struct.pack("<Q", 24) + bytes(24) + bytes([10]) + struct.pack("<Q", 1 << 20) + b"x")
            assert b"wrong token" in s.recv(100)
        w.wait_for("disconnected: 0 bytes passed to llama.cpp", 10)
        # Each of the four TLS connections is logged by its own thread, its end last: once all four
        # ended, none of them can still be refused again or pass a byte to llama.cpp.
        assert w.wait_count(ENDED, ended + 4, 10) == ended + 4, "".join(w.output)
        assert w.count("refused") == 4  # (the third: the check looking for TLS to say what to pass)
        assert w.count("paired with") == 0
        assert _bytes_to_llama_cpp(w) == heard and w.count("Accepted client connection") == accepted

        assert rpc.check_worker(w.endpoint) == rpc.PROTOCOL  # the pairing string it printed: served
        w.wait_for("disconnected: 33 bytes passed to llama.cpp", 10)  # its hello, nothing else
        assert _bytes_to_llama_cpp(w) == heard + 33, "".join(w.output)
        assert w.wait_count("Accepted client connection", accepted + 1, 10) == accepted + 1, "".join(w.output)

        # Another program on this machine finds the relay that holds the token: it is not let through.
        relay = rpc._links[w.name].local_endpoint.split(":")
        probe = ("import socket, struct, sys\ns = socket.create_connection((sys.argv[1], int(sys.argv[2])), 10)\n"
                 "s.sendall(bytes([14]) + struct.pack('<Q', 24) + bytes(24))\ns.settimeout(10)\n"
                 "try:\n    print(s.recv(64))\nexcept ConnectionResetError:\n    print(b'')")
        out = subprocess.run([sys.executable, "-c", probe, *relay], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == "b''", out
        # The next connection's end, awaited: the probe's, had the relay let it through, came first.
        assert rpc.check_worker(w.endpoint) == rpc.PROTOCOL
        assert w.wait_count("disconnected: 33 bytes passed to llama.cpp", 2, 10) == 2, "".join(w.output)
        assert w.count("paired with") == 2 and _bytes_to_llama_cpp(w) == heard + 66, "".join(w.output)
    finally:
        w.stop()


@pytest.mark.parametrize("insecure", [False, True], ids=["secure", "plain"])
def test_a_frozen_worker_ends_generate_with_one_message_naming_it_within_the_timeout(smollm_path, insecure):
    w = Worker(insecure=insecure)
    timeout_s = 3
    cli = subprocess.Popen(
        [sys.executable, "-m", "speculum.cli", "generate", "--target", str(smollm_path), "--mode", "off",
         "--rpc", w.endpoint, "--rpc-timeout", str(timeout_s), "--threads", "1", "--max-tokens", "2000", "--json",
         "Write a very long story about a lighthouse keeper."],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        first = cli.stdout.readline()
        assert '"type": "cycle"' in first, cli.stderr.read()
        w.process.send_signal(signal.SIGSTOP)  # a sleeping laptop: the connection stays, nothing answers
        rest, err = cli.communicate(timeout=timeout_s + 5)  # the bound the user is promised
    finally:
        if cli.poll() is None:
            cli.kill()
        w.stop()
    assert cli.returncode == 2, err
    assert err.strip().splitlines() == [
        f"speculum: The RPC worker at {w.name} did not answer for {timeout_s} s: it is frozen, asleep or cut off "
        "(a pass that really takes longer needs a larger --rpc-timeout). llama.cpp cannot continue without it; "
        "start the worker again and rerun."]
    assert '"type": "summary"' not in rest


def test_a_worker_frozen_while_it_is_sent_a_tensor_ends_the_connection_within_the_timeout():
    """A SET_TENSOR awaits no answer: a worker that stops reading one (a large restored prompt
    state) is only seen by the bytes it leaves untaken, and that too is the timeout."""
    from speculum.engine.rpc.clientlink import ClientLink

    w = Worker(insecure=True)
    timeout_s = 2
    link = ClientLink(parse_worker(w.endpoint), read_timeout=timeout_s, connect_timeout=5)
    w.process.send_signal(signal.SIGSTOP)
    host, port = link.local_endpoint.rsplit(":", 1)
    body = 256 << 20  # far more than the sockets' buffers hold
    ggml = socket.create_connection((host, int(port)))
    t = time.monotonic()
    try:
        ggml.settimeout(timeout_s + 5)
        ggml.sendall(struct.pack("<BQ", 6, body))  # SET_TENSOR, no answer awaited
        with pytest.raises(OSError):  # the relay closes the connection: the send fails
            chunk = bytes(1 << 20)
            for _ in range(body >> 20):
                ggml.sendall(chunk)
        seconds = time.monotonic() - t
    finally:
        ggml.close()
        link.close()
        w.stop()
    assert link.failure is not None and link.failure[0] == "timeout", link.failure
    assert f"The RPC worker at {w.name} did not answer for {timeout_s} s" in link.failure[1]
    assert seconds < timeout_s + 5
