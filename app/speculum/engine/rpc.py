"""llama.cpp's RPC backend: a target's layers on other machines' devices.

Workers run ``ggml_backend_rpc_start_server`` (``speculum rpc-worker``); the client
registers each with ``ggml_backend_rpc_add_server`` + ``ggml_backend_register`` and gives
the target model their devices. The draft never gets them: it stays on this machine.

llama.cpp's RPC client has no timeouts and no error path: a worker it cannot connect
to, a handshake it does not like, or a worker that drops mid-generation each end in
``GGML_ABORT``, which aborts the whole process. So, before llama.cpp ever connects,
``check_worker`` does the same handshake here with a timeout and names what is wrong;
and ``register_workers`` installs an abort hook that turns llama.cpp's RPC aborts into
one plain sentence (``on_worker_lost``) instead of a core dump.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
import threading
import time
from typing import Callable, Sequence

from ..errors import SpeculumError

# RPC_PROTO_*_VERSION in ggml/include/ggml-rpc.h of the vendored llama.cpp (llama-cpp-python
# 0.3.36). The client accepts a worker of the same major and a minor no newer than its own.
PROTOCOL = (7, 0, 0)
_CMD_HELLO = 14  # RPC_CMD_HELLO, fixed across versions so that mismatches can be told apart
_CONN_CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE: transport capabilities in the hello (all zero: TCP)
_HELLO_RSP_SIZE = 4 + _CONN_CAPS_SIZE  # major, minor, patch, padding, caps

DEFAULT_PORT = 50052
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
    from .native import shipped_library  # (llama.cpp initialised and its log captured first)

    try:
        rpc = shipped_library("ggml-rpc")
        missing = [name for name in _SYMBOLS if not hasattr(rpc, name)]
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
        ("ggml_set_abort_callback", [ctypes.c_void_p], ctypes.c_void_p),
    ):
        fn = getattr(ggml, name)
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
    """'host:port,host:port' (or a list of them) as endpoints; SpeculumError when one is malformed."""
    items = text.split(",") if isinstance(text, str) else list(text)
    endpoints: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SpeculumError(f"'{item}' is not a worker address: write HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}.")
        if item in endpoints:
            raise SpeculumError(f"The worker {item} is listed twice.")
        endpoints.append(item)
    if not endpoints:
        raise SpeculumError("No RPC worker given: write HOST:PORT[,HOST:PORT...].")
    return tuple(endpoints)


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


# --- the handshake, with a timeout ----------------------------------------------------

def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def check_worker(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> tuple[int, int, int]:
    """Connect and say hello as llama.cpp's client would, within ``timeout`` seconds.

    Returns the worker's protocol version; SpeculumError, in words, when nothing listens,
    nothing answers, the answer is not llama.cpp's RPC, or the versions cannot talk.
    """
    host, port = _split(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.timeout:
        raise SpeculumError(f"The RPC worker at {endpoint} did not accept a connection within {timeout:g} s "
                            "(a firewall, or the machine is off?).") from None
    except OSError as exc:
        why = "nothing is listening there" if isinstance(exc, ConnectionRefusedError) else (exc.strerror or str(exc))
        raise SpeculumError(f"Cannot reach the RPC worker at {endpoint}: {why}. "
                            "Start it there with `speculum rpc-worker`.") from None
    closed = SpeculumError(f"The RPC worker at {endpoint} closed the connection at the handshake: it runs a "
                           f"different llama.cpp RPC protocol than this Speculum ({_version(PROTOCOL)}). "
                           "Use the same Speculum version on both machines.")
    try:
        sock.settimeout(timeout)
        request = bytes([_CMD_HELLO]) + struct.pack("<Q", _CONN_CAPS_SIZE) + bytes(_CONN_CAPS_SIZE)
        try:
            sock.sendall(request)
            head = _recv_exactly(sock, 8)
        except (ConnectionResetError, BrokenPipeError):
            head = b""  # closed before reading our hello: the kernel answers with a reset, not an end
        if not head:
            raise closed
        (size,) = struct.unpack("<Q", head.ljust(8, b"\0"))
        body = _recv_exactly(sock, _HELLO_RSP_SIZE) if size == _HELLO_RSP_SIZE else b""
        if len(head) < 8 or len(body) < _HELLO_RSP_SIZE:
            raise SpeculumError(f"{endpoint} answered, but not as a llama.cpp RPC worker of protocol "
                                f"{_version(PROTOCOL)}: is something else listening on that port?")
    except socket.timeout:
        raise SpeculumError(f"The RPC worker at {endpoint} accepted the connection but did not answer within "
                            f"{timeout:g} s: it may be serving another client (a worker serves one at a time).") \
            from None
    except OSError as exc:
        raise SpeculumError(f"The RPC worker at {endpoint} dropped the connection at the handshake "
                            f"({exc.strerror or exc}).") from None
    finally:
        sock.close()
    version = (body[0], body[1], body[2])
    if version[0] != PROTOCOL[0] or version[1] > PROTOCOL[1]:
        raise SpeculumError(f"The RPC worker at {endpoint} speaks llama.cpp RPC protocol {_version(version)}, this "
                            f"Speculum speaks {_version(PROTOCOL)}: use the same Speculum version on both machines.")
    return version


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


_on_lost: Callable[[str], None] = _default_worker_lost
_abort_hook = None  # the ctypes callback, kept alive while llama.cpp holds it


def on_worker_lost(handler: Callable[[str], None]) -> None:
    """Who hears that a worker was lost, in words. It runs on llama.cpp's RPC thread while
    the process is about to abort, so it should report and end the process itself (the
    default writes one stderr line and exits with status 2); if it returns, llama.cpp aborts."""
    global _on_lost
    _on_lost = handler


def _words_for_abort(text: str) -> str | None:
    """llama.cpp's RPC abort message as a sentence for the user; None for other aborts."""
    if "ggml-rpc" not in text:
        return None
    if "Failed to connect" in text or "handshake failed" in text:
        return (f"llama.cpp could not connect to {text.rsplit(' ', 1)[-1].strip()} (it stopped, or another client "
                "took it between the check and the load); the model is not loaded.")
    # llama.cpp does not say which worker: the one that refuses a connection now is the one gone.
    # A worker killed a moment ago may still be closing its listening socket: look twice.
    gone = [e for e in _registered if not _accepts_connections(e)]
    if not gone:
        time.sleep(0.3)
        gone = [e for e in _registered if not _accepts_connections(e)]
    who = (f"the RPC worker at {', '.join(gone)}" if gone
           else f"an RPC worker ({', '.join(_registered)})" if _registered else "an RPC worker")
    return (f"Lost the connection to {who}: it stopped, or the network dropped. "
            "llama.cpp cannot continue without it; start the worker again and rerun.")


def _accepts_connections(endpoint: str, timeout: float = 0.5) -> bool:
    try:
        socket.create_connection(_split(endpoint), timeout=timeout).close()
        return True
    except OSError:
        return False


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
            if hasattr(ggml, "ggml_print_backtrace"):
                ggml.ggml_print_backtrace()
            return
        _on_lost(words)

    _abort_hook = hook
    ggml.ggml_set_abort_callback(ctypes.cast(hook, ctypes.c_void_p))


# --- the client: workers' devices for the target ------------------------------------

_registered: dict[str, list[int]] = {}  # endpoint -> its device handles, once registered
_in_use: dict[str, int] = {}  # endpoint -> loaded models on it (llama.cpp holds one connection for them all)
_register_lock = threading.Lock()


def register_workers(endpoints: Sequence[str], timeout: float = CONNECT_TIMEOUT_S) -> list[int]:
    """Check each worker answers, register it with ggml once per process, and return the
    devices it offers, in the order given (llama.cpp splits layers in device order)."""
    rpc, ggml = libraries()
    with _register_lock:
        for endpoint in endpoints:
            # A worker serves one client at a time: while a model of ours holds it, a second hello
            # would wait forever, and llama.cpp reuses that connection. Otherwise check (again:
            # after the last model closes, llama.cpp reconnects).
            if not _in_use.get(endpoint):
                check_worker(endpoint, timeout)
        _install_abort_hook()
        devices: list[int] = []
        for endpoint in endpoints:
            if endpoint not in _registered:
                reg = rpc.ggml_backend_rpc_add_server(endpoint.encode())
                if not reg:
                    raise SpeculumError(f"The RPC worker at {endpoint} offers no device.")
                ggml.ggml_backend_register(reg)
                _registered[endpoint] = [ggml.ggml_backend_reg_dev_get(reg, i)
                                         for i in range(ggml.ggml_backend_reg_dev_count(reg))]
            devices += _registered[endpoint]
        return devices


# A worker whose machine vanishes (power, cable, Wi-Fi) sends no FIN: llama.cpp would wait on
# it for the kernel's retransmission limit (~15 minutes). Keepalive probes are answered by the
# worker's kernel even while its device computes, so a slow pass is never mistaken for a loss.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 5, 2, 5  # a lost worker is noticed in ~15 s


def keep_alive(endpoints: Sequence[str]) -> int:
    """Switch on TCP keepalive (and, on Linux, a user timeout) on this process's connections
    to ``endpoints``, which llama.cpp opened without either. Returns how many it changed."""
    peers = set()
    for endpoint in endpoints:
        host, port = _split(endpoint)
        try:
            peers |= {(info[4][0], port) for info in socket.getaddrinfo(host, port, socket.AF_INET)}
        except OSError:
            continue
    changed = 0
    fds = [int(n) for n in os.listdir("/proc/self/fd")] if os.path.isdir("/proc/self/fd") else range(3, 1024)
    for fd in fds:
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue  # not a socket, or already closed
        try:
            if sock.type != socket.SOCK_STREAM or sock.getpeername()[:2] not in peers:
                continue
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            idle = getattr(socket, "TCP_KEEPIDLE", getattr(socket, "TCP_KEEPALIVE", None))  # macOS: KEEPALIVE
            for option, value in ((idle, KEEPALIVE_IDLE_S), (getattr(socket, "TCP_KEEPINTVL", None),
                                  KEEPALIVE_INTERVAL_S), (getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_PROBES)):
                if option is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, option, value)
            if hasattr(socket, "TCP_USER_TIMEOUT"):  # data sent but never acknowledged: the same bound
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                                1000 * (KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES))
            changed += 1
        except OSError:
            continue
        finally:
            sock.close()  # the duplicate only: llama.cpp's descriptor stays open
    return changed


def hold(endpoints: Sequence[str], loaded: bool) -> None:
    """Count a model loaded on (``loaded``) or closed from ``endpoints``."""
    with _register_lock:
        for endpoint in endpoints:
            _in_use[endpoint] = max(0, _in_use.get(endpoint, 0) + (1 if loaded else -1))


def any_registered() -> bool:
    """Once a worker is registered, llama.cpp's default device list includes it for every
    model: the draft must then be given its (local) devices explicitly."""
    return bool(_registered)


def device_array(devices: Sequence[int]) -> ctypes.Array:
    """A NULL-terminated ``ggml_backend_dev_t *`` for ``llama_model_params.devices``."""
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


# --- the worker ------------------------------------------------------------------------

def worker_device() -> tuple[int, str, int, int]:
    """The device a worker serves: the GPU when there is one, else the CPU.
    Returns (handle, 'name (description)', free bytes, total bytes)."""
    _, ggml = libraries()
    device = ggml.ggml_backend_dev_by_type(DEVICE_TYPE_GPU) or ggml.ggml_backend_dev_by_type(DEVICE_TYPE_CPU)
    if not device:
        raise SpeculumError("llama.cpp offers no device to serve.")
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
    name = (ggml.ggml_backend_dev_name(device) or b"?").decode()
    description = (ggml.ggml_backend_dev_description(device) or b"").decode(errors="replace").strip()
    return device, f"{name} ({description})" if description else name, free.value, total.value


def serve(endpoint: str, device: int, n_threads: int, cache_dir: str | None = None) -> None:
    """Serve ``device`` at ``endpoint`` until the process ends (llama.cpp's loop never returns
    unless it cannot listen). One client at a time, no authentication."""
    rpc, _ = libraries()
    devices = (ctypes.c_void_p * 1)(device)
    rpc.ggml_backend_rpc_start_server(endpoint.encode(), cache_dir.encode() if cache_dir else None,
                                      n_threads, 1, devices)


def c_stdout_line_buffered() -> None:
    """llama.cpp's server prints its own lines through C stdio: flush them per line, so they
    interleave with ours when stdout is a pipe or a log file. Best effort."""
    try:
        libc = ctypes.CDLL(None)
        stream = ctypes.c_void_p.in_dll(libc, "__stdoutp" if sys.platform == "darwin" else "stdout")
        libc.setvbuf.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t]
        libc.setvbuf(stream, None, 1, 0)  # _IOLBF
    except (OSError, ValueError, AttributeError):
        pass


__all__ = ["PROTOCOL", "DEFAULT_PORT", "RpcUnavailable", "libraries", "availability", "parse_endpoints",
           "check_worker", "register_workers", "keep_alive", "any_registered", "device_array", "on_worker_lost",
           "worker_device", "serve", "c_stdout_line_buffered"]
