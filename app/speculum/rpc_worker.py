"""`speculum rpc-worker`: lend this machine's device to another machine's target model.

By default llama.cpp's RPC server listens on 127.0.0.1 only, on a port of its own, and the
address the user chose is served by the secure link's TLS front end (engine/rpc/frontend.py),
which lets a client's bytes reach llama.cpp only after its token checks out. The worker
prints the pairing string the client passes as `--rpc`. With ``--insecure`` llama.cpp's
server listens on the chosen address itself, as llama.cpp's own `rpc-server` does.

llama.cpp's server loop never returns, so it runs on a thread of its own while the main
thread waits for Ctrl-C or SIGTERM and then ends the process.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import struct
import sys
import threading
import time

from .errors import SpeculumError



def exposure_warning(host: str, endpoint: str, device_name: str) -> str | None:
    """The warning a plain (--insecure) worker listening beyond this machine prints; None on loopback."""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    return (f"warning: --insecure: llama.cpp's RPC protocol has no authentication: anyone who can reach {endpoint} "
            f"can run code on this machine's {device_name} device and read what it holds. Use it only inside a "
            "tunnel of your own (SSH, WireGuard); without --insecure the worker pairs clients over TLS.")


def _bind_address(host: str, insecure: bool) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise SpeculumError(f"--host takes an IP address, e.g. 127.0.0.1, 0.0.0.0 or ::, not a name: "
                            f"'{_shown(host)}'.") from None
    if insecure and address.version == 6:
        raise SpeculumError("llama.cpp's own RPC server listens on IPv4 only: with --insecure, --host takes "
                            "an IPv4 address (without --insecure, IPv6 works).")
    return address


def _shown(text: str) -> str:
    from .engine.rpc.address import shown

    return shown(text)


def _check_can_listen(host: str, port: int) -> None:
    """Fail in words before llama.cpp tries (it only prints 'Failed to create server socket')."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as llama.cpp's own socket does
    try:
        probe.bind((host, port))
    except OSError as exc:
        raise SpeculumError(f"Cannot listen on {_endpoint(host, port)}: {exc.strerror or exc}.") from None
    finally:
        probe.close()


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def interface_addresses(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[tuple[str, str]]:
    """(interface, address) another machine may use to reach a worker bound to ``address``: that
    address itself, or, for 0.0.0.0 / ::, each interface's of the same family (loopback last)."""
    if not address.is_unspecified:
        return [("", str(address))]
    found: list[tuple[str, str]] = []
    try:
        if address.version == 4:
            import fcntl

            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                for _, name in socket.if_nameindex():
                    try:
                        raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
                    except OSError:
                        continue  # down, or no IPv4 address
                    found.append((name, socket.inet_ntoa(raw[20:24])))
        else:
            with open("/proc/net/if_inet6", encoding="ascii") as f:
                for line in f:
                    hexaddr, *_, name = line.split()
                    ip = ipaddress.IPv6Address(bytes.fromhex(hexaddr))
                    if not ip.is_link_local:  # would need a zone (%eth0) that the other machine names its own way
                        found.append((name, str(ip)))
    except (ImportError, OSError, ValueError, AttributeError):  # not Linux: what the host name resolves to
        try:
            family = socket.AF_INET if address.version == 4 else socket.AF_INET6
            found = [("", info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None, family)]
        except OSError:
            found = []
    unique = list(dict.fromkeys(found))
    return sorted(unique, key=lambda f: ipaddress.ip_address(f[1]).is_loopback) or [("", str(address))]


def run(host: str, port: int, threads: int | None, cache_dir: str | None, insecure: bool = False,
        new_pairing: bool = False, exact: bool | None = None) -> int:
    from . import paths
    from .engine.llama import cpu_settings

    if exact is not None:  # first: ggml reads its switch once, when llama.cpp loads
        cpu_settings.choose_exact(exact)
    from .engine.llama import model as llama
    from .engine.rpc import client as rpc
    from .engine.rpc.frontend import FrontEnd
    from .engine.rpc.identity import worker_identity

    rpc.libraries()  # RpcUnavailable, in words, before anything else
    address = _bind_address(host, insecure)
    host = str(address)
    _check_can_listen(host, port)
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
    device, device_name, free, total, kind = rpc.worker_device()
    n_threads = threads or llama.default_threads()
    endpoint = _endpoint(host, port)
    identity = made = None
    if not insecure:
        identity, made = worker_identity(paths.data_dir() / "rpc-worker", renew=new_pairing)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    warning = exposure_warning(host, endpoint, device_name.split(" ")[0]) if insecure else None
    if warning:
        print(f"speculum: {warning}", file=sys.stderr, flush=True)
    rpc.c_stdout_line_buffered()
    ggml_host, ggml_port = (host, port) if insecure else ("127.0.0.1", _free_loopback_port())
    server = threading.Thread(target=rpc.serve, args=(f"{ggml_host}:{ggml_port}", device, n_threads, cache_dir),
                              name="speculum-rpc-server", daemon=True)
    server.start()
    _wait_listening("127.0.0.1" if address.is_unspecified else ggml_host, ggml_port, server)
    # Whether this worker's rows are pass-size invariant: a client decoding exactly needs its workers to.
    rows_exact = (kind == "CPU" and cpu_settings.build_has_row_switch()
                  and cpu_settings.rows_invariant_asked(cpu_settings.in_effect()))
    if identity is not None:
        FrontEnd(host, port, ggml_port, identity, {"kind": kind, "name": device_name, "exact": rows_exact},
                         lambda line: _say(f"link: {line}")).start()
    link = ("plain link (--insecure: no authentication, no encryption)" if insecure else
            "secure link (TLS with a pinned certificate, paired clients only)")
    _say(f"RPC worker listening on {endpoint}: {link}; llama.cpp RPC protocol "
         f"{'.'.join(map(str, rpc.PROTOCOL))}, {n_threads} threads, "
         f"{'exact rows (--exact)' if rows_exact else 'rows as llama.cpp computes them (no --exact)'}")
    _say(f"offering {device_name}: {free // 2**20} MiB free of {total // 2**20} MiB")
    if made:
        _say(f"made a certificate and token in {identity.cert_file.parent}, kept for later starts "
             "(pairing strings printed before this no longer work)")
    for line in _hints(address, port, identity):
        _say(line)
    while not stop.wait(0.5):
        if not server.is_alive():
            raise SpeculumError(f"llama.cpp's RPC server on {endpoint} stopped.")
    _say("RPC worker stopped")
    sys.stdout.flush()
    sys.stderr.flush()
    # The server thread is inside llama.cpp's accept loop, which has no way out: end here.
    os._exit(0)


def _say(line: str) -> None:
    """One line of ours, written at once: llama.cpp's server prints its own lines to the same
    stdout from its thread, and a line written in parts could be split by one of them."""
    sys.stdout.write(f"speculum: {line}\n")
    sys.stdout.flush()


def _hints(address, port: int, identity) -> list[str]:
    """What to pass on the other machine, one line per address this worker can be reached at."""
    from .engine.rpc.address import WorkerAddress

    lines = ["on the other machine, pass the pairing string (it holds this worker's secret token: share it "
             "as you would a password):" if identity else "on the other machine:"]
    for interface, ip in interface_addresses(address):
        worker = WorkerAddress(ip, port, identity.fingerprint, identity.token) if identity else WorkerAddress(ip, port)
        where = ", ".join(filter(None, (interface, "this machine only" if ipaddress.ip_address(ip).is_loopback
                                        else "")))
        lines.append(f"  speculum generate --rpc {worker.text()} ...{f'   ({where})' if where else ''}")
    return lines
