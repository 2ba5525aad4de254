"""llama.cpp's RPC backend: a target's layers on other machines' devices.

Workers run ``ggml_backend_rpc_start_server`` (``speculum rpc-worker``); the client
registers each with ``ggml_backend_rpc_add_server`` + ``ggml_backend_register`` and gives
the target model their devices. The draft never gets them: it stays on this machine.

ggml never connects to a worker itself: it connects to a relay of ours on 127.0.0.1
(``clientlink.ClientLink``), which pairs with a secure worker over TLS (certificate pinned,
token presented) or passes bytes to a plain one, and ends a connection whose worker falls
silent past the read timeout.

llama.cpp's RPC client has no timeouts and no error path: a worker it cannot connect
to, a handshake it does not like, or a worker that drops mid-generation each end in
``GGML_ABORT``, which aborts the whole process. So, before llama.cpp ever connects,
``check_worker`` does the same handshake here with a timeout and names what is wrong;
and ``register_workers`` installs an abort hook that turns llama.cpp's RPC aborts into
one plain sentence (``on_worker_lost``), naming the worker its relay saw fail.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import threading
from typing import Callable, Sequence

from ...errors import SpeculumError
from .address import DEFAULT_PORT, parse_worker, parse_workers, shown
from .clientlink import DEFAULT_READ_TIMEOUT_S, ClientLink, speaks_tls

# RPC_PROTO_*_VERSION in ggml/include/ggml-rpc.h of the vendored llama.cpp (llama-cpp-python
# 0.3.36). The client accepts a worker of the same major and a minor no newer than its own.
PROTOCOL = (7, 0, 0)
_CMD_HELLO = 14  # RPC_CMD_HELLO, fixed across versions so that mismatches can be told apart
_CONN_CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE: transport capabilities in the hello (all zero: TCP)
_HELLO_RSP_SIZE = 4 + _CONN_CAPS_SIZE  # major, minor, patch, padding, caps

CONNECT_TIMEOUT_S = 5.0
DEVICE_TYPE_CPU, DEVICE_TYPE_GPU = 0, 1  # enum ggml_backend_dev_type

_SYMBOLS = ("ggml_backend_rpc_start_server", "ggml_backend_rpc_add_server")


class RpcUnavailable(SpeculumError):
    """This llama.cpp was built without its RPC backend."""


# --- the libraries ---------------------------------------------------------------------

_libs: tuple[ctypes.CDLL, ctypes.CDLL] | None = None


def libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """(ggml-rpc, ggml) with the signatures of ggml-rpc.h and ggml-backend.h; RpcUnavailable when absent."""
    global _libs
    if _libs is not None:
        return _libs
    from ..llama.native import shipped_library  # (llama.cpp initialised and its log captured first)

    try:
        rpc = shipped_library("ggml-rpc")
        missing = [name for name in _SYMBOLS if not hasattr(rpc, name)]  # library: the symbols this build exports
    except OSError as exc:
        raise RpcUnavailable(
            f"This llama.cpp has no RPC backend ({exc}); reinstall it with scripts/setup-env.sh, "
            "which builds it with GGML_RPC=on.") from None
    if missing:
        raise RpcUnavailable(f"This llama.cpp's RPC library lacks {', '.join(missing)}; reinstall it with "
                             "scripts/setup-env.sh, which builds it with GGML_RPC=on.")
    c_size_p = ctypes.POINTER(ctypes.c_size_t)
    # void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir,
    #                                    size_t n_threads, size_t n_devices, ggml_backend_dev_t * devices)
    rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                                  ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
    rpc.ggml_backend_rpc_start_server.restype = None
    # ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint)
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p

    ggml = shipped_library("ggml")
    for name, args, res in (
        ("ggml_backend_register", [ctypes.c_void_p], None),
        ("ggml_backend_reg_dev_count", [ctypes.c_void_p], ctypes.c_size_t),
        ("ggml_backend_reg_dev_get", [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_void_p),
        ("ggml_backend_dev_by_type", [ctypes.c_int], ctypes.c_void_p),
        ("ggml_backend_dev_name", [ctypes.c_void_p], ctypes.c_char_p),
        ("ggml_backend_dev_description", [ctypes.c_void_p], ctypes.c_char_p),
        ("ggml_backend_dev_memory", [ctypes.c_void_p, c_size_p, c_size_p], None),
        ("ggml_backend_dev_buffer_type", [ctypes.c_void_p], ctypes.c_void_p),
        ("ggml_set_abort_callback", [ctypes.c_void_p], ctypes.c_void_p),
    ):
        fn = getattr(ggml, name)  # library: a ggml function by its C name
        fn.argtypes, fn.restype = args, res
    _libs = (rpc, ggml)
    return _libs


def availability() -> str | None:
    """None when RPC works here, else why not (for `speculum doctor`)."""
    try:
        libraries()
    except RpcUnavailable as exc:
        return str(exc)
    return None


# --- addresses -------------------------------------------------------------------------

def parse_endpoints(text: str | Sequence[str]) -> tuple[str, ...]:
    """'A,B,...' (or a list of them) as the workers' addresses as written (``rpcaddress``), checked
    and normalised; SpeculumError, one sentence, when one is malformed."""
    return tuple(w.text() for w in parse_workers(text))


def names(endpoints: Sequence[str]) -> str:
    """The workers as shown to the user: HOST:PORT each, never a token."""
    return ",".join(parse_worker(e).name for e in endpoints)


# --- the links: every worker is reached through a relay of ours (clientlink) ---------------

_links: dict[str, ClientLink] = {}  # worker name -> its relay, for the life of the process
_read_timeout_s = DEFAULT_READ_TIMEOUT_S


def set_read_timeout(seconds: float | str) -> float:
    """How long a worker may stay silent while it owes an answer (default 30 s)."""
    global _read_timeout_s
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = float("nan")
    if not 1 <= value <= 86400:  # (also refuses nan)
        raise SpeculumError(f"The RPC read timeout must be a number of seconds from 1 to 86400, not "
                            f"'{shown(str(seconds))}'.")
    _read_timeout_s = value
    for link in _links.values():
        link.read_timeout = value
    return value


def _link(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> ClientLink:
    worker = parse_worker(endpoint)
    link = _links.get(worker.name)
    if link is None or (link.worker != worker and not _in_use.get(worker.name)):
        if link is not None:
            link.close()  # the same address with another pairing
        link = _links[worker.name] = ClientLink(worker, _read_timeout_s, timeout)
    link.connect_timeout = timeout
    return link


# --- the handshake, with a timeout ----------------------------------------------------

def check_worker(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> tuple[int, int, int]:
    """Connect, pair when the address is a pairing string, and say hello as llama.cpp's client
    would, within ``timeout`` seconds (each step).

    Returns the worker's protocol version; SpeculumError, in words, when nothing listens,
    nothing answers, the pairing fails, the answer is not llama.cpp's RPC, or the versions
    cannot talk.
    """
    link = _link(endpoint, timeout)
    name = link.worker.name
    request = bytes([_CMD_HELLO]) + struct.pack("<Q", _CONN_CAPS_SIZE) + bytes(_CONN_CAPS_SIZE)
    try:
        answer = link.exchange(request, _hello_complete, timeout)
    except TimeoutError:
        raise SpeculumError(f"The RPC worker at {name} accepted the connection but did not answer within "
                            f"{timeout:g} s: it may be serving another client (a worker serves one at a time).") \
            from None
    if not answer and not link.worker.secure and speaks_tls(link.worker.host, link.worker.port, timeout):
        raise SpeculumError(f"The RPC worker at {name} serves the secure link: pass the pairing string it printed "
                            f"({name}/FINGERPRINT/TOKEN) as --rpc, not {name} alone.")
    if not answer:
        raise SpeculumError(f"The RPC worker at {name} closed the connection at the handshake: it runs a "
                            f"different llama.cpp RPC protocol than this Speculum ({_version(PROTOCOL)}), or it "
                            "needs its pairing string (a secure worker prints one). Use the same Speculum "
                            "version on both machines.")
    (size,) = struct.unpack("<Q", answer[:8].ljust(8, b"\0"))
    if len(answer) < 8 + _HELLO_RSP_SIZE or size != _HELLO_RSP_SIZE:
        raise SpeculumError(f"{name} answered, but not as a llama.cpp RPC worker of protocol "
                            f"{_version(PROTOCOL)}: is something else listening on that port?")
    version = (answer[8], answer[9], answer[10])
    if version[0] != PROTOCOL[0] or version[1] > PROTOCOL[1]:
        raise SpeculumError(f"The RPC worker at {name} speaks llama.cpp RPC protocol {_version(version)}, this "
                            f"Speculum speaks {_version(PROTOCOL)}: use the same Speculum version on both machines.")
    return version


def _hello_complete(answer: bytes) -> bool:
    """A whole hello answer, or enough of one to see it is not one."""
    return len(answer) >= 8 and (struct.unpack_from("<Q", answer)[0] != _HELLO_RSP_SIZE
                                 or len(answer) >= 8 + _HELLO_RSP_SIZE)


def _version(v: Sequence[int]) -> str:
    return ".".join(str(x) for x in v)


# --- llama.cpp's aborts, in words -----------------------------------------------------

def _default_worker_lost(message: str) -> None:
    try:
        sys.stdout.flush()  # what was generated so far stays on the screen
    except Exception:
        pass
    sys.stderr.write(f"speculum: {message}\n")
    sys.stderr.flush()
    os._exit(2)


# How a lost worker's sentence ends for a command (a server says what it does instead).
CANNOT_CONTINUE = "llama.cpp cannot continue without it; start the worker again and rerun."
_on_lost: Callable[[str], None] = _default_worker_lost
_abort_hook = None  # the ctypes callback, kept alive while llama.cpp holds it


def on_worker_lost(handler: Callable[[str], None]) -> None:
    """Who hears that a worker was lost, in words. It runs on llama.cpp's RPC thread while
    the process is about to abort, so it should report and end the process itself (the
    default writes one stderr line and exits with status 2) or never return (a server parks
    the thread and serves on); if it returns, llama.cpp aborts."""
    global _on_lost
    _on_lost = handler


def _words_for_abort(text: str) -> str | None:
    """llama.cpp's RPC abort message as a sentence for the user; None for other aborts."""
    if "ggml-rpc" not in text:
        return None
    links = [_links[name] for name in _registered if name in _links] or list(_links.values())
    if "Failed to connect" in text or "handshake failed" in text:
        local = text.rsplit(" ", 1)[-1].strip()
        link = next((l for l in links if l.local_endpoint == local), None)
        if link is not None and link.failure and link.failure[1]:
            return f"{link.failure[1]} The model is not loaded."
        who = link.worker.name if link is not None else local
        return (f"llama.cpp could not connect to {who} (it stopped, or another client took it between the "
                "check and the load); the model is not loaded.")
    # The relay that saw the worker fall silent or go away kept why: llama.cpp does not say which.
    for kind in ("timeout", "closed"):
        failed = [l for l in links if l.failure and l.failure[0] == kind]
        if failed and kind == "timeout":
            return f"{failed[0].failure[1]} {CANNOT_CONTINUE}"
        if failed:
            who = f"the RPC worker at {', '.join(l.worker.name for l in failed)}"
            break
    else:
        names = [l.worker.name for l in links]
        who = f"an RPC worker ({', '.join(names)})" if names else "an RPC worker"
    return (f"Lost the connection to {who}: it stopped, or the network dropped. "
            f"{CANNOT_CONTINUE}")


def _install_abort_hook() -> None:
    global _abort_hook
    if _abort_hook is not None:
        return
    _, ggml = libraries()

    @ctypes.CFUNCTYPE(None, ctypes.c_char_p)
    def hook(message: bytes) -> None:
        text = (message or b"").decode("utf-8", errors="replace")
        words = _words_for_abort(text)
        if words is None:  # not ours: what llama.cpp does without a hook (message, backtrace), then its abort
            sys.stderr.write(f"{text}\n")
            sys.stderr.flush()
            if hasattr(ggml, "ggml_print_backtrace"):  # library: not exported by every build
                ggml.ggml_print_backtrace()
            return
        _on_lost(words)

    _abort_hook = hook
    ggml.ggml_set_abort_callback(ctypes.cast(hook, ctypes.c_void_p))


# --- the client: workers' devices for the target ------------------------------------

_registered: dict[str, list[int]] = {}  # worker name -> its device handles, once registered
_in_use: dict[str, int] = {}  # worker name -> loaded models on it (llama.cpp holds one connection for them all)
_register_lock = threading.Lock()


def register_workers(endpoints: Sequence[str], timeout: float = CONNECT_TIMEOUT_S) -> list[int]:
    """Check each worker answers (paired, for a pairing string), register it with ggml once per
    process, through its relay, and return the devices it offers, in the order given (llama.cpp
    splits layers in device order)."""
    rpc, ggml = libraries()
    workers = [parse_worker(e) for e in endpoints]
    with _register_lock:
        for worker in workers:
            # A worker serves one client at a time: while a model of ours holds it, a second hello
            # would wait forever, and llama.cpp reuses that connection. Otherwise check (again:
            # after the last model closes, llama.cpp reconnects).
            if not _in_use.get(worker.name):
                check_worker(worker.text(), timeout)
        _check_exact(workers)
        _install_abort_hook()
        devices: list[int] = []
        for worker in workers:
            if worker.name not in _registered:
                reg = rpc.ggml_backend_rpc_add_server(_links[worker.name].local_endpoint.encode())
                if not reg:
                    raise SpeculumError(f"The RPC worker at {worker.name} offers no device.")
                ggml.ggml_backend_register(reg)
                _registered[worker.name] = [ggml.ggml_backend_reg_dev_get(reg, i)
                                            for i in range(ggml.ggml_backend_reg_dev_count(reg))]
            devices += _registered[worker.name]
        return devices


def _check_exact(workers) -> None:
    """Where this process decodes exactly (--exact), so must each worker of its target: one without
    the switch computes a row differently by its pass's size, and a speculative answer would part
    from plain decoding's. A secure worker says whether it does; a plain link cannot tell."""
    from ..llama import cpu_settings

    if not cpu_settings.rows_invariant_asked(cpu_settings.in_effect()):
        return
    for worker in workers:
        device = _links[worker.name].device if worker.name in _links else None
        if device and device.get("exact") is not True:
            raise SpeculumError(f"The RPC worker at {worker.name} does not compute exactly, and this machine "
                                "decodes with --exact: start it with `speculum rpc-worker --exact` (or load "
                                "without --exact).")


def keep_alive(endpoints: Sequence[str]) -> int:
    """How many of this process's connections to ``endpoints`` are open. The relays switch on
    TCP keepalive as they connect: a worker whose machine vanishes (power, cable, Wi-Fi) sends no
    FIN, and would otherwise be waited on for the kernel's retransmission limit."""
    return sum(len(_links[n].upstreams) for n in {parse_worker(e).name for e in endpoints} if n in _links)


def computes_on_cpu(endpoints: Sequence[str]) -> bool:
    """Whether every worker in ``endpoints`` computes on a CPU: a secure worker says which device it
    serves; a plain one is taken to be of this machine's kind (the caller asks only where this
    machine has no GPU): on loopback it is this machine."""
    kinds = [(_links[n].device or {}).get("kind") if n in _links else None
             for n in (parse_worker(e).name for e in endpoints)]
    return all(kind in (None, "CPU") for kind in kinds)


def workers_in_use() -> dict[str, str]:
    """Each worker a loaded model uses, with the device it computes on as it said (secure link)."""
    described = {}
    for name, count in _in_use.items():
        device = (_links[name].device or {}) if count and name in _links else None
        if device is not None:
            described[name] = (f"{device.get('kind', '?')} ({device.get('name', '?')})" if device
                               else "not said (plain link): taken to be this machine's kind")
    return described


def hold(endpoints: Sequence[str], loaded: bool) -> None:
    """Count a model loaded on (``loaded``) or closed from ``endpoints``."""
    with _register_lock:
        for name in {parse_worker(e).name for e in endpoints}:
            _in_use[name] = max(0, _in_use.get(name, 0) + (1 if loaded else -1))


def forget_lost(endpoints: Sequence[str]) -> None:
    """After a worker was lost: the models loaded on ``endpoints`` are given up (a thread of llama.cpp's
    stays parked inside them), and llama.cpp keeps its dead connection cached by the relay's address.
    So each worker gets a new relay, at a new address, registered anew by the next load; the old relays
    drop their workers' connections, so a surviving worker (it serves one client) is free again."""
    with _register_lock:
        for name in {parse_worker(e).name for e in endpoints}:
            link = _links.pop(name, None)
            if link is not None:
                link.close()
                link.drop_connections()
            _registered.pop(name, None)
            _in_use.pop(name, None)


def any_registered() -> bool:
    """Once a worker is registered, llama.cpp's default device list includes it for every
    model: the draft must then be given its (local) devices explicitly."""
    return bool(_registered)


class _TensorPlacement(ctypes.Structure):
    """llama.h's ``llama_model_tensor_buft_override``: tensors whose name matches go to ``buft``."""
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


# The output layer's matrix: its own, or the token embedding where the model ties the two.
OUTPUT_MATRIX = rb"^(output|token_embd)\.weight$"


def output_layer_here() -> ctypes.Array | None:
    """A NULL-terminated ``tensor_buft_overrides`` list that keeps the output layer's matrix in
    this machine's CPU memory, so that its product is computed here (the RPC device offloads no
    op) while the layers run on workers: each row's hidden state then crosses the network
    (n_embd floats) instead of its logits (n_vocab floats: 608 KB a row for Qwen2.5), which
    ruled the link's time and cipher cost, and grew with every drafted row verified. llama.cpp
    puts the output layer on the last device whatever n_gpu_layers says, hence a placement.
    None where this llama.cpp names no CPU device."""
    _, ggml = libraries()
    cpu = ggml.ggml_backend_dev_by_type(DEVICE_TYPE_CPU)
    if not cpu:
        return None
    return (_TensorPlacement * 2)(_TensorPlacement(OUTPUT_MATRIX, ggml.ggml_backend_dev_buffer_type(cpu)))


def device_array(devices: Sequence[int]) -> ctypes.Array:
    """A NULL-terminated ``ggml_backend_dev_t *`` for ``llama_model_params.devices``."""
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


# --- the worker ------------------------------------------------------------------------

def worker_device() -> tuple[int, str, int, int, str]:
    """The device a worker serves: the GPU when there is one, else the CPU.
    Returns (handle, 'name (description)', free bytes, total bytes, 'GPU' or 'CPU')."""
    _, ggml = libraries()
    gpu = ggml.ggml_backend_dev_by_type(DEVICE_TYPE_GPU)
    device = gpu or ggml.ggml_backend_dev_by_type(DEVICE_TYPE_CPU)
    if not device:
        raise SpeculumError("llama.cpp offers no device to serve.")
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
    name = (ggml.ggml_backend_dev_name(device) or b"?").decode()
    description = (ggml.ggml_backend_dev_description(device) or b"").decode(errors="replace").strip()
    return (device, f"{name} ({description})" if description else name, free.value, total.value,
            "GPU" if gpu else "CPU")


def serve(endpoint: str, device: int, n_threads: int, cache_dir: str | None = None) -> None:
    """Serve ``device`` at ``endpoint`` (IPv4 only) until the process ends (llama.cpp's loop never
    returns unless it cannot listen). One client at a time, no authentication: beyond loopback
    only behind ``frontend.FrontEnd``, or with the user's own tunnel."""
    rpc, _ = libraries()
    devices = (ctypes.c_void_p * 1)(device)
    rpc.ggml_backend_rpc_start_server(endpoint.encode(), cache_dir.encode() if cache_dir else None,
                                      n_threads, 1, devices)


_C_STDOUT_BUFFER: list = []  # the buffer C stdio writes into from now on: kept alive with the process


def c_stdout_line_buffered() -> None:
    """llama.cpp's server prints its own lines through C stdio: flush them per line, so they
    interleave with ours when stdout is a pipe or a log file. Best effort.

    With a buffer of our own: Python started unbuffered (PYTHONUNBUFFERED, -u) leaves C stdout a
    one-byte buffer, which glibc keeps when asked for line buffering without one, and a line then
    goes out in pieces ("A", "ccepted client connection") that a line of ours can split."""
    try:
        libc = ctypes.CDLL(None)
        stream = ctypes.c_void_p.in_dll(libc, "__stdoutp" if sys.platform == "darwin" else "stdout")
        libc.setvbuf.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t]
        buffer = ctypes.create_string_buffer(1 << 16)
        if libc.setvbuf(stream, buffer, 1, len(buffer)) == 0:  # _IOLBF
            _C_STDOUT_BUFFER.append(buffer)
    except (OSError, ValueError, AttributeError, TypeError):  # (TypeError: Windows has no CDLL(None))
        pass


__all__ = ["PROTOCOL", "DEFAULT_PORT", "RpcUnavailable", "libraries", "availability", "parse_endpoints", "names",
           "set_read_timeout", "check_worker", "register_workers", "keep_alive", "computes_on_cpu", "workers_in_use", "hold",
           "any_registered", "device_array", "on_worker_lost", "forget_lost",
           "worker_device", "serve", "c_stdout_line_buffered"]
