"""`speculum rpc-worker`: lend this machine's device to another machine's target model.

llama.cpp's server loop never returns, so it runs on a thread of its own while the main
thread waits for Ctrl-C or SIGTERM and then ends the process.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
import threading
import time

from .errors import SpeculumError



def exposure_warning(host: str, endpoint: str, device_name: str) -> str | None:
    """The warning a worker listening beyond this machine prints; None on loopback."""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    return (f"warning: llama.cpp's RPC protocol has no authentication: anyone who can reach {endpoint} can run "
            f"code on this machine's {device_name} device and read what it holds. Listen only on a network "
            "you trust, or keep the default 127.0.0.1 and reach it through an SSH tunnel.")


def _check_can_listen(host: str, port: int) -> None:
    """Fail in words before llama.cpp tries (it only prints 'Failed to create server socket')."""
    try:
        socket.inet_aton(host)
    except OSError:
        raise SpeculumError(f"--host takes an IPv4 address (llama.cpp's RPC server binds no names): '{host}'.") \
            from None
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as llama.cpp's own socket does
    try:
        probe.bind((host, port))
    except OSError as exc:
        raise SpeculumError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
    finally:
        probe.close()


def _wait_listening(host: str, port: int, server: threading.Thread, timeout: float = 30.0) -> None:
    """Return once the server accepts connections (a connect that is closed at once is harmless:
    the worker goes back to waiting for its next client)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.is_alive():
            raise SpeculumError(f"llama.cpp's RPC server could not start on {host}:{port}.")
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SpeculumError(f"llama.cpp's RPC server did not start listening on {host}:{port} within {timeout:g} s.")


def run(host: str, port: int, threads: int | None, cache_dir: str | None) -> int:
    from .engine import llama, rpc

    rpc.libraries()  # RpcUnavailable, in words, before anything else
    if not 0 < port < 65536:
        raise SpeculumError(f"--port must be between 1 and 65535, not {port}.")
    _check_can_listen(host, port)
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
    device, device_name, free, total = rpc.worker_device()
    n_threads = threads or llama.default_threads()
    endpoint = f"{host}:{port}"

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    warning = exposure_warning(host, endpoint, device_name.split(" ")[0])
    if warning:
        print(f"speculum: {warning}", file=sys.stderr, flush=True)
    rpc.c_stdout_line_buffered()
    server = threading.Thread(target=rpc.serve, args=(endpoint, device, n_threads, cache_dir),
                              name="speculum-rpc-server", daemon=True)
    server.start()
    _wait_listening(host, port, server)
    print(f"speculum: RPC worker listening on {endpoint} (llama.cpp RPC protocol "
          f"{'.'.join(map(str, rpc.PROTOCOL))}, {n_threads} threads)", flush=True)
    print(f"speculum: offering {device_name}: {free // 2**20} MiB free of {total // 2**20} MiB", flush=True)
    print(f"speculum: on the other machine: speculum generate --rpc {endpoint} ...", flush=True)
    while not stop.wait(0.5):
        if not server.is_alive():
            raise SpeculumError(f"llama.cpp's RPC server on {endpoint} stopped.")
    print("speculum: RPC worker stopped", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # The server thread is inside llama.cpp's accept loop, which has no way out: end here.
    os._exit(0)
