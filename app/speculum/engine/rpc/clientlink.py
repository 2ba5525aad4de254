"""The link between llama.cpp's RPC client and a worker, which llama.cpp's protocol lacks:
authentication, encryption and a read timeout.

The link in rooms: the worker's TLS front end (``frontend.py``, its certificate and token in
``identity.py``), the frames and llama.cpp's messages on the wire (``wire.py``), the relay
threads both ends run (``shuttle.py``), and here the client's side.

``ClientLink``: a relay on 127.0.0.1 that ggml connects to. For a secure
worker it checks the certificate, then presents the token, and only then passes ggml's
bytes. For a plain worker (``HOST:PORT``, no pairing) it passes bytes through and counts
the requests that await an answer. Either way, a worker silent past the read timeout (no
heartbeat; or, plain, an unanswered request) has its connection closed and the reason kept
for ``rpc``'s abort hook, which names the worker.
"""

from __future__ import annotations

import hmac
import json
import os
import socket
import ssl
import time
from pathlib import Path
from typing import Callable

from ...errors import SpeculumError
from .address import WorkerAddress
from .identity import fingerprint_of
from .shuttle import CHUNK, Way, accept_each, close_all, listen, nodelay_keepalive, read_line, shuttle
from .wire import MAGIC, Gathered, Requests, Unframer

DEFAULT_READ_TIMEOUT_S = 30.0
GATHER_S = 0.002  # a graph computation, held for the request that follows it, at most this
_MAX_REPLY = 4096


def speaks_tls(host: str, port: int, timeout: float) -> bool:
    """Whether ``host:port`` completes a TLS handshake: a secure worker, reached without its pairing."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, context.wrap_socket(raw):
            return True
    except (OSError, ssl.SSLError):
        return False


def from_this_process(peer) -> bool:
    """Whether a connection to a relay comes from this process (ggml), not from another program
    on this machine, which would otherwise borrow the pairing. Linux answers from /proc: the
    socket whose local end is the peer's port must be one of this process's descriptors.
    Where /proc is not there, every local connection is taken (a local user then could too)."""
    tables = [Path("/proc/self/net/tcp"), Path("/proc/self/net/tcp6")]
    if not tables[0].exists() or not peer:
        return True
    port = f":{peer[1]:04X}"
    inodes = set()
    for table in tables:
        try:
            lines = table.read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        inodes |= {f"socket:[{f[9]}]" for f in (line.split() for line in lines) if len(f) > 9 and f[1].endswith(port)}
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


class ClientLink:
    """127.0.0.1:<port>, which ggml connects to as if it were the worker."""

    def __init__(self, worker: WorkerAddress, read_timeout: float, connect_timeout: float):
        self.worker = worker
        self.read_timeout = read_timeout
        self.connect_timeout = connect_timeout
        self.failure: tuple[str, str] | None = None  # (kind, sentence) of the last connection's end, if it failed
        self.device: dict | None = None  # what a secure worker says it serves ({"kind": "CPU", ...})
        self.upstreams: list[socket.socket] = []
        (self._listener,) = listen("127.0.0.1", 0)
        self.local_endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        accept_each(self._listener, self._serve, "speculum-rpc-relay")

    def _fail(self, kind: str, words: str) -> None:
        self.failure = (kind, words)

    def _serve(self, ggml: socket.socket, peer: tuple) -> None:
        if not from_this_process(peer):
            close_all(ggml)  # another program on this machine: the relay holds our token, not theirs
            return
        self.failure = None
        nodelay_keepalive(ggml, keepalive=False)
        opened = self._open()
        if opened is None:
            close_all(ggml)
            return
        upstream, early = opened
        self.upstreams.append(upstream)
        try:
            self._relay(ggml, upstream, early)
        finally:
            self.upstreams.remove(upstream)
            close_all(upstream, ggml)

    def _open(self) -> tuple[socket.socket, bytes] | None:
        """The connection to the worker, checked and paired, and what the worker already sent
        after its answer; None (and ``failure`` said) when not."""
        w = self.worker
        try:
            sock = socket.create_connection((w.host, w.port), timeout=self.connect_timeout)
        except TimeoutError:
            return self._no_connection()
        except OSError as exc:
            why = "nothing is listening there" if isinstance(exc, ConnectionRefusedError) else (exc.strerror or str(exc))
            self._fail("connect", f"Cannot reach the RPC worker at {w.name}: {why}. "
                                  "Start it there with `speculum rpc-worker`.")
            return None
        nodelay_keepalive(sock)
        if not w.secure:
            return sock, b""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # pinned below instead
        try:
            sock = context.wrap_socket(sock)
        except TimeoutError:
            close_all(sock)
            return self._no_connection()
        except ssl.SSLError as exc:
            close_all(sock)
            self._fail("connect", f"The RPC worker at {w.name} did not complete a TLS handshake ({exc.reason}): "
                                  "is it a `speculum rpc-worker` started without --insecure?")
            return None
        except OSError as exc:
            close_all(sock)
            self._fail("connect", f"Cannot reach the RPC worker at {w.name}: {exc.strerror or exc}. "
                                  "Start it there with `speculum rpc-worker`.")
            return None
        if not hmac.compare_digest(fingerprint_of(sock.getpeercert(binary_form=True) or b""), w.fingerprint):
            close_all(sock)  # before the token: an impostor learns nothing
            self._fail("pairing", f"The RPC worker at {w.name} presented a different certificate than its pairing "
                                  "string names: another machine answers at that address, or the worker made a new "
                                  "one (--new-pairing). Nothing was sent; copy the pairing string it prints now.")
            return None
        try:
            sock.sendall(MAGIC + w.token.encode() + b"\n")
            line, early = read_line(sock, _MAX_REPLY, time.monotonic() + self.connect_timeout)
            reply = json.loads(line) if line else None
        except (OSError, ValueError):
            reply, early = None, b""
        if not isinstance(reply, dict) or reply.get("ok") is not True:
            close_all(sock)
            refused = isinstance(reply, dict) and reply.get("error") == "wrong token"
            self._fail("pairing", f"The RPC worker at {w.name} refused the token: copy the pairing string it prints "
                                  "again." if refused else f"The RPC worker at {w.name} did not accept the pairing "
                                  "(no answer, or not a Speculum worker of this version).")
            return None
        device = reply.get("device")
        self.device = device if isinstance(device, dict) else {}
        return sock, early

    def _no_connection(self) -> None:
        self._fail("connect", f"The RPC worker at {self.worker.name} did not accept a connection within "
                              f"{self.connect_timeout:g} s (a firewall, or the machine is off?).")

    def _relay(self, ggml: socket.socket, upstream: socket.socket, early: bytes) -> None:
        """Both directions until one side closes; a silent worker ends it after ``read_timeout``."""
        heard = time.monotonic()  # last sign of life from the worker
        requests = None if self.worker.secure else Requests()
        unframer = Unframer() if self.worker.secure else None

        def sent(data: memoryview) -> bool:
            nonlocal heard
            if not requests.awaiting:
                heard = time.monotonic()  # the wait for an answer starts now
            return requests.sent(data)

        def received(data: memoryview) -> bool:
            nonlocal heard
            heard = time.monotonic()
            return requests.received(data)

        def unframed(data: memoryview) -> bytearray:
            nonlocal heard
            data, frames = unframer.feed(data)
            if frames:
                heard = time.monotonic()
            return data

        def watchdog() -> bool:
            # Silent while a request awaits its answer (or the rest of it), or not reading what ggml sends (a large
            # SET_TENSOR awaits none: a restored prompt's state would otherwise wait forever).
            now = time.monotonic()
            if (now - heard > self.read_timeout and (requests is None or requests.awaiting)
                    or up.stuck_for(now) > self.read_timeout):
                self._fail("timeout", f"The RPC worker at {self.worker.name} did not answer for "
                                      f"{self.read_timeout:g} s: it is frozen, asleep or cut off (a pass that "
                                      "really takes longer needs a larger --rpc-timeout).")
                return False
            return True

        if unframer is None:
            up = Way(ggml, upstream, whole=sent, missing=requests.requests.missing)
            down = Way(upstream, ggml, whole=received, missing=requests.answers.missing)
        else:
            gathered = Gathered()
            up = Way(ggml, upstream, whole=gathered.feed, missing=gathered.missing, hold_s=GATHER_S)
            down = Way(upstream, ggml, unframed)
            try:
                down.out = memoryview(unframed(early))
            except ValueError:
                self._fail("closed", "")
                return
        ended = shuttle([up, down], min(1.0, self.read_timeout / 4), watchdog)
        if ended is upstream:
            self._fail("closed", "")  # the worker ended the connection: the abort hook words it

    def exchange(self, request: bytes, enough: Callable[[bytes], bool], timeout: float) -> bytes:
        """Open a connection to the worker as ggml's would, send ``request``, and return the
        answer once ``enough`` says it is complete, the worker closes, or ``timeout`` passes with
        part of it. SpeculumError when the connection or the pairing fails; TimeoutError when
        nothing at all came back."""
        self.failure = None
        opened = self._open()
        if opened is None:
            raise SpeculumError(self.failure[1])
        sock, early = opened
        unframer = Unframer() if self.worker.secure else None
        answer = bytearray()
        deadline = time.monotonic() + timeout
        try:
            sock.settimeout(timeout)
            sock.sendall(request)
            data = early
            while True:
                answer += unframer.feed(data)[0] if unframer else data
                if enough(bytes(answer)):
                    break
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                data = sock.recv(CHUNK)
                if not data:
                    break
        except TimeoutError:
            if not answer:
                raise
        except (OSError, ValueError):
            pass  # the worker closed, or sent what no worker of ours sends: the caller judges what came
        finally:
            close_all(sock)
        return bytes(answer)

    def drop_connections(self) -> None:
        """End the connections to the worker; each relay then closes ggml's side."""
        for sock in list(self.upstreams):
            try:  # the bare socket's shutdown: SSLSocket's would pull the TLS state from under the relay
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._listener.close()
