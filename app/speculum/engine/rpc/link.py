"""The link between llama.cpp's RPC client and a worker, which llama.cpp's protocol lacks:
authentication, encryption and a read timeout.

Worker side (``FrontEnd``): ggml's RPC server listens on loopback only; this TLS server takes
the connections from the network, checks the client's token before it opens a connection to
ggml, then relays. Its certificate is self-signed, made on first start and kept in the data
folder with the token (``worker_identity``); the client pins the certificate's fingerprint,
so no certificate authority is involved. From worker to client the stream is framed, with a
heartbeat every second, so that a client can tell a frozen worker (no heartbeat) from one
busy with a long pass (heartbeats, no data).

Client side (``ClientLink``): a relay on 127.0.0.1 that ggml connects to. For a secure
worker it checks the certificate, then presents the token, and only then passes ggml's
bytes. For a plain worker (``HOST:PORT``, no pairing) it passes bytes through and counts
the requests that await an answer. Either way, a worker silent past the read timeout (no
heartbeat; or, plain, an unanswered request) has its connection closed and the reason kept
for ``rpc``'s abort hook, which names the worker.

Each connection is relayed by one thread of its own (``_shuttle``), with non-blocking sockets:
every byte costs a C-level receive and send, not a pass through asyncio's streams and TLS
layer, which cost the link a few milliseconds a token; and a TLS socket is only ever used by
the thread that owns it.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import os
import secrets
import selectors
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...errors import SpeculumError
from .address import TOKEN_CHARS, WorkerAddress

MAGIC = b"speculum-rpc-link/1\n"  # then the token and a newline; the worker answers one JSON line
HEARTBEAT_S = 1.0
DEFAULT_READ_TIMEOUT_S = 30.0
HANDSHAKE_TIMEOUT_S = 10.0
_BEAT, _DATA = 0, 1
_FRAME = struct.Struct("<BI")  # kind, length
_CHUNK = 1 << 20
_MAX_REPLY = 4096


def fingerprint_of(der: bytes) -> str:
    """A certificate's SHA-256 as the pairing string writes it (unpadded base64url, 43 characters)."""
    return base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode()


# A machine that vanishes (power, cable, Wi-Fi) sends no FIN: without keepalive a connection to
# it waits for the kernel's retransmission limit (~15 minutes). Probes are answered by the
# peer's kernel even while its device computes, so a slow pass is never taken for a loss.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 5, 2, 5  # a lost machine is noticed in ~15 s


def _nodelay_keepalive(sock: socket.socket | None, keepalive: bool = True) -> None:
    """Small requests go out at once; a machine that vanishes is noticed (loopback needs no keepalive)."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not keepalive:
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        idle = getattr(socket, "TCP_KEEPIDLE", getattr(socket, "TCP_KEEPALIVE", None))  # macOS: KEEPALIVE
        for option, value in ((idle, KEEPALIVE_IDLE_S), (getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL_S),
                              (getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_PROBES)):
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # data sent but never acknowledged: the same bound
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                            1000 * (KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES))
    except OSError:
        pass


# --- the worker's identity: certificate, key, token --------------------------------------

@dataclass(frozen=True)
class Identity:
    cert_file: Path
    key_file: Path
    fingerprint: str
    token: str


def worker_identity(folder: Path, renew: bool = False) -> tuple[Identity, bool]:
    """The worker's certificate and token from ``folder``, made there when absent, unreadable or
    ``renew``; returns (identity, whether it was made now)."""
    cert_file, key_file, token_file = folder / "cert.pem", folder / "key.pem", folder / "token"
    if not renew:
        try:
            token = token_file.read_text(encoding="ascii").strip()
            der = ssl.PEM_cert_to_DER_cert(cert_file.read_text(encoding="ascii"))
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)
            if len(token) == TOKEN_CHARS:
                return Identity(cert_file, key_file, fingerprint_of(der), token), False
        except (OSError, ValueError, ssl.SSLError):
            pass  # made anew below: the old pairing strings stop working, which the worker says
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpeculumError(f"Cannot create {folder} for the worker's certificate: {exc.strerror or exc}.") from None
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "speculum rpc-worker")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650)).sign(key, hashes.SHA256()))
    token = base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    try:
        for path, data in ((key_file, key_pem), (token_file, token.encode()),
                           (cert_file, cert.public_bytes(serialization.Encoding.PEM))):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the key and token are secrets
            if hasattr(os, "fchmod"):
                os.fchmod(fd, 0o600)  # (a file that was there keeps its mode through O_CREAT)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except OSError as exc:
        raise SpeculumError(f"Cannot write the worker's certificate to {folder}: {exc.strerror or exc}.") from None
    der = cert.public_bytes(serialization.Encoding.DER)
    return Identity(cert_file, key_file, fingerprint_of(der), token), True


# --- moving bytes: one thread per connection -----------------------------------------------

_HOLD_S = 0.05  # a message held back longer than this goes on in part (it never should)
_GATHER_S = 0.002  # a graph computation, held for the request that follows it, at most this
_LOW_WATER_CAP = 16384  # (well under any socket's receive buffer, or select would never wake)


class _Way:
    """One direction of a relay: what is read from ``src`` goes, passed through ``shape``, to
    ``dst``. ``shape``, when given, gets the buffer up to what was read (``head`` bytes reserved in front,
    for a frame header) and returns what to send. ``whole``, when given, sees each new piece
    and says whether the bytes so far end where one of llama.cpp's messages ends; until then
    they are held back: llama.cpp writes a message's command, size and body in separate
    sends, and each piece passed on alone would cost a TLS record and a wake-up on each hop."""

    def __init__(self, src: socket.socket, dst: socket.socket, shape: Callable[[memoryview], object] | None = None,
                 head: int = 0, whole: Callable[[memoryview], bool] | None = None,
                 missing: Callable[[], int] | None = None, hold_s: float = _HOLD_S):
        self.src, self.dst, self.shape, self.head, self.whole = src, dst, shape, head, whole
        self.hold_s = hold_s  # the longest bytes are held back before they go on as they are
        # How many bytes the message being read still lacks: a plain ``src`` wakes select only
        # once they are all there (SO_RCVLOWAT), not once per piece that llama.cpp sends.
        self.missing = missing if hasattr(socket, "SO_RCVLOWAT") and not isinstance(src, ssl.SSLSocket) else None
        self.low_water = 1
        self.buffer = memoryview(bytearray(head + _CHUNK))
        self.out = memoryview(b"")  # shaped, not yet taken by dst
        self.held = 0  # bytes read and held back, after ``head``
        self.held_since = 0.0
        self.moved = 0.0  # when ``dst`` last took bytes of ``out`` (or ``out`` filled)
        self.ended = False  # src closed

    def read(self) -> None:
        """Read what ``src`` holds now: a TLS socket gives one record per call, so take every
        record there is; one write then carries them all."""
        start = n = self.head + self.held
        tls = isinstance(self.src, ssl.SSLSocket)
        while n < len(self.buffer):
            try:
                got = self.src.recv_into(self.buffer[n:])
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                break
            if not got:
                self.ended = True
                break
            n += got
            if not tls:
                break  # one call takes all that a plain socket holds
        if n == start:
            return
        whole = self.whole is None or self.whole(self.buffer[start:n])
        if self.missing is not None and not self.ended:
            self.wake_at(self.missing())
        if not whole and n < len(self.buffer) and not self.ended:
            if not self.held:
                self.held_since = time.monotonic()
            self.held = n - self.head
            return
        self.release(n)

    def wake_at(self, size: int) -> None:
        size = max(1, min(size, _LOW_WATER_CAP))
        if size != self.low_water:
            try:
                self.src.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, size)
                self.low_water = size
            except OSError:
                self.missing = None  # (not honoured here: every piece wakes select, as without it)

    def release(self, n: int | None = None) -> None:
        """Shape what was read (and held) for sending."""
        n = self.head + self.held if n is None else n
        self.held = 0
        self.out = memoryview(self.shape(self.buffer[:n]) if self.shape else self.buffer[:n])
        self.moved = time.monotonic()

    def write(self) -> None:
        """Send as much of what waits as ``dst`` takes now."""
        while self.out:
            try:
                sent = self.dst.send(self.out)  # (TLS: all or nothing; a retry sends the same bytes, as it must)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                return
            if sent:
                self.moved = time.monotonic()
            self.out = self.out[sent:]

    def stuck_for(self, now: float) -> float:
        """How long bytes have waited for ``dst`` to take any of them (0 when none wait)."""
        return now - self.moved if self.out else 0.0


def _shuttle(ways: list[_Way], tick_s: float, tick: Callable[[], bool]) -> socket.socket | None:
    """Move bytes along ``ways`` in this thread until a side closes or fails (returns that
    socket) or ``tick``, called on each wake and at least every ``tick_s``, says stop (None).
    Sockets are non-blocking: a receiver that stops reading holds back its own way only,
    never the other way or the tick (the worker's heartbeat, the client's watchdog)."""
    selector = selectors.DefaultSelector()
    interest: dict[socket.socket, int] = {}
    for w in ways:
        w.src.setblocking(False)
        w.dst.setblocking(False)
    try:
        while True:
            wanted = dict.fromkeys(interest, 0)
            for w in ways:
                if w.out:
                    wanted[w.dst] = wanted.get(w.dst, 0) | selectors.EVENT_WRITE
                elif not w.ended:
                    wanted[w.src] = wanted.get(w.src, 0) | selectors.EVENT_READ
            for sock, events in wanted.items():
                if events != interest.get(sock, 0):
                    if not events:
                        selector.unregister(sock)
                    elif sock in interest and interest[sock]:
                        selector.modify(sock, events)
                    else:
                        selector.register(sock, events)
                    interest[sock] = events
            # A record already inside the TLS object is invisible to select.
            buffered = {w.src for w in ways if not w.out and isinstance(w.src, ssl.SSLSocket) and w.src.pending()}
            holding = [w.hold_s for w in ways if w.held]
            wait = 0 if buffered else min(holding) if holding else tick_s
            events = selector.select(wait)
            ready = {key.fileobj for key, mask in events if mask & selectors.EVENT_READ} | buffered
            if not events:  # a quiet spell: wake for any byte again, in case a message's end was misread
                for w in ways:
                    if w.missing is not None:
                        w.wake_at(1)
            for w in ways:
                if w.held and not w.out and time.monotonic() - w.held_since > w.hold_s:
                    w.release()
                if not w.out and not w.ended and w.src in ready:
                    try:
                        w.read()
                    except (OSError, ValueError):  # (ssl.SSLError is an OSError; ValueError: not our frames)
                        return w.src
                try:
                    w.write()  # at once: what was just read almost always fits
                except OSError:
                    return w.dst
                if w.ended and not w.out:
                    return w.src
            if not tick():
                return None
    finally:
        selector.close()


def _read_line(sock: socket.socket, limit: int, deadline: float) -> tuple[bytes, bytes]:
    """(a line read from ``sock`` by ``deadline``, what came after it); the line is empty when
    none came whole within ``limit`` bytes."""
    got = b""
    while b"\n" not in got and len(got) < limit:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        data = sock.recv(limit)
        if not data:
            return b"", b""
        got += data
    line, newline, rest = got.partition(b"\n")
    return (line + newline, rest) if newline else (b"", b"")


def _read_exactly(sock: socket.socket, size: int, deadline: float) -> bytes | None:
    got = b""
    while len(got) < size:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        data = sock.recv(size - len(got))
        if not data:
            return None
        got += data
    return got


def _listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on ``host:port``, one per address family it names (IPv6 ones IPv6-only)."""
    sockets = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(
                socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)):
            s = socket.socket(family, kind, proto)
            sockets.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(address)
            s.listen(100)
    except OSError:
        for s in sockets:
            s.close()
        raise
    return sockets


def _accept_each(listener: socket.socket, serve: Callable[[socket.socket, tuple], None], name: str) -> None:
    """Serve each connection to ``listener`` on a thread of its own, until the listener is closed."""
    def accept() -> None:
        listener.settimeout(1.0)  # wakes now and then to see whether the listener was closed
        while listener.fileno() != -1:
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=serve, args=(conn, peer), name=name, daemon=True).start()

    threading.Thread(target=accept, name=name, daemon=True).start()


def _close(*socks: socket.socket | None) -> None:
    for sock in socks:
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


# --- the worker's TLS front end ------------------------------------------------------------

_BEAT_FRAME = _FRAME.pack(_BEAT, 0)


class FrontEnd:
    """TLS on ``host:port`` in front of ggml's RPC server on 127.0.0.1:``ggml_port``."""

    def __init__(self, host: str, port: int, ggml_port: int, identity: Identity, device: dict,
                 log: Callable[[str], None]):
        self.host, self.port, self.ggml_port = host, port, ggml_port
        self.identity, self.device, self.log = identity, device, log
        self.bytes_to_ggml = 0  # every byte any client passed to ggml's parser, all connections together
        self._context: ssl.SSLContext | None = None

    def start(self) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(self.identity.cert_file, self.identity.key_file)
        self._context = context
        try:
            listeners = _listen(self.host, self.port)
        except OSError as exc:
            raise SpeculumError(f"Cannot listen on {self.host}:{self.port}: {exc.strerror or exc}.") from None
        for listener in listeners:
            _accept_each(listener, self._serve, "speculum-rpc-front-end")

    def _serve(self, conn: socket.socket, peer: tuple) -> None:
        who = f"{peer[0]}:{peer[1]}"
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            tls = self._context.wrap_socket(conn, server_side=True)
        except OSError:
            _close(conn)  # a stranger's failed TLS handshake: nothing reached us
            return
        ggml = None
        passed = 0
        try:
            try:
                hello = _read_exactly(tls, len(MAGIC) + TOKEN_CHARS + 1, deadline)
            except OSError:
                hello = None
            if hello is None:
                self.log(f"refused {who}: it sent no token (a client pinning another certificate, or not Speculum)")
                return
            token = hello[len(MAGIC):-1]
            if not (hello.startswith(MAGIC) and hmac.compare_digest(token, self.identity.token.encode())):
                tls.sendall(b'{"ok": false, "error": "wrong token"}\n')
                self.log(f"refused {who}: wrong token")
                return
            try:
                ggml = socket.create_connection(("127.0.0.1", self.ggml_port), timeout=HANDSHAKE_TIMEOUT_S)
            except OSError as exc:
                tls.sendall(json.dumps({"ok": False, "error": f"llama.cpp's server: {exc}"}).encode() + b"\n")
                return
            _nodelay_keepalive(ggml, keepalive=False)
            _nodelay_keepalive(tls)
            tls.sendall(json.dumps({"ok": True, "device": self.device}).encode() + b"\n")
            self.log(f"paired with {who}")

            answers = _Answers()

            def count(data: memoryview) -> memoryview:
                nonlocal passed
                passed += len(data)
                self.bytes_to_ggml += len(data)
                answers.asked(data)
                return data

            def framed(data: memoryview) -> memoryview:  # (the header's room was kept in front)
                _FRAME.pack_into(data, 0, _DATA, len(data) - _FRAME.size)
                return data

            to_client = _Way(ggml, tls, framed, head=_FRAME.size, whole=answers.feed, missing=answers.missing)
            next_beat = time.monotonic() + HEARTBEAT_S

            def beat() -> bool:
                nonlocal next_beat
                if time.monotonic() >= next_beat and not to_client.out:  # (never inside a frame)
                    to_client.out = memoryview(_BEAT_FRAME)
                    next_beat = time.monotonic() + HEARTBEAT_S
                return True

            _shuttle([_Way(tls, ggml, count), to_client], HEARTBEAT_S / 4, beat)
        except OSError:
            pass  # the client went away mid-handshake
        finally:
            _close(ggml, tls)
            self.log(f"{who} disconnected: {passed} bytes passed to llama.cpp ({self.bytes_to_ggml} in all)")


class _Unframer:
    """The front end's frames back into llama.cpp's bytes, across reads that split them anywhere.
    A data frame is given out whole: llama.cpp reads a message to its end before it acts, so
    passing one on in pieces would only wake it more often."""

    def __init__(self) -> None:
        self._head = bytearray()
        self._data = bytearray()
        self.left = 0  # bytes of the current data frame still to come

    def feed(self, data) -> tuple[bytearray, int]:
        """(the data of the frames completed by ``data``, how many frames began in it, heartbeats
        included); ValueError on a frame the front end never sends."""
        frames, view = 0, memoryview(data)
        while view:
            if self.left:
                take = min(self.left, len(view))
                self._data += view[:take]
                view, self.left = view[take:], self.left - take
                continue
            need = _FRAME.size - len(self._head)
            self._head += view[:need]
            view = view[need:]
            if len(self._head) < _FRAME.size:
                break
            kind, size = _FRAME.unpack(self._head)
            self._head.clear()
            if kind not in (_BEAT, _DATA) or size > _CHUNK or (kind == _BEAT and size):
                raise ValueError("not a frame of ours")
            frames, self.left = frames + 1, size
        if self.left or not self._data:
            return bytearray(), frames
        out, self._data = self._data, bytearray()
        return out, frames


def speaks_tls(host: str, port: int, timeout: float) -> bool:
    """Whether ``host:port`` completes a TLS handshake: a secure worker, reached without its pairing."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, context.wrap_socket(raw):
            return True
    except (OSError, ssl.SSLError):
        return False


# --- the client's relay ------------------------------------------------------------------

# RPC commands that the server answers (rpc_serve_client in ggml-rpc.cpp): the plain link
# times out only while one of these waits, since a worker owes no bytes otherwise.
# ALLOC_BUFFER, GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR,
# GET_DEVICE_MEMORY, GET_ALLOC_SIZE, HELLO, DEVICE_COUNT (enum rpc_cmd).
_ANSWERED = {0, 1, 2, 3, 7, 8, 9, 11, 13, 14, 15}


class _Messages:
    """Where llama.cpp's RPC messages end in one direction of a connection, from their headers
    alone: a request is | command (1) | size (8) | body |, an answer | size (8) | body |.
    ``on_end(head, tail)``, when given, hears each message's end with its body's last ``tail`` bytes."""

    def __init__(self, head_size: int, on_head: Callable[[bytes], None] | None = None,
                 on_end: Callable[[bytes, bytes], None] | None = None, tail: int = 0):
        self._size, self._on_head, self._on_end, self._tail_size = head_size, on_head, on_end, tail
        self._head, self._skip = bytearray(), 0
        self._last_head, self._tail = b"", bytearray()

    def missing(self) -> int:
        """Bytes still to come before the current header or body is whole."""
        return self._skip or self._size - len(self._head)

    @property
    def midway(self) -> bool:
        """Whether a message has begun and not ended."""
        return bool(self._skip or self._head)

    def feed(self, data) -> bool:
        """Take the next bytes; whether they end where a message ends."""
        view = memoryview(data)
        while view:
            if self._skip:
                step = min(self._skip, len(view))
                if self._tail_size and step > self._skip - self._tail_size:  # (the body's last bytes)
                    self._tail += view[max(0, self._skip - self._tail_size):step]
                self._skip, view = self._skip - step, view[step:]
                if not self._skip:
                    self._ended()
                continue
            take = self._size - len(self._head)
            self._head += view[:take]
            view = view[take:]
            if len(self._head) == self._size:
                self._skip = struct.unpack_from("<Q", self._head, self._size - 8)[0]
                self._last_head = bytes(self._head)
                self._tail.clear()
                if self._on_head:
                    self._on_head(self._last_head)
                self._head.clear()
                if not self._skip:
                    self._ended()
        return not self._skip and not self._head

    def _ended(self) -> None:
        if self._on_end:
            self._on_end(self._last_head, bytes(self._tail[-self._tail_size:]) if self._tail_size else b"")


_GET_TENSOR = 8  # its request's body ends with the bytes asked for (rpc_msg_get_tensor_req.size)
_COMPUTE = {10, 16}  # GRAPH_COMPUTE, GRAPH_RECOMPUTE (the graph the worker kept, run again)


class _Answers:
    """A worker's answers on their way to the client: where each ends, and how long the next
    will be before it begins where its request said so. ggml's server sends an answer's size and
    body in two sends; knowing a GET_TENSOR's length (a token's hidden state) from its request,
    the front end wakes once for both, not once for the size and again for the body."""

    def __init__(self) -> None:
        self.expected: list[int] = []  # per request awaiting its answer: the answer's length, 0 if not known
        self.requests = _Messages(9, on_end=self._asked, tail=8)
        self.answers = _Messages(8, self._began)
        self.asked, self.feed = self.requests.feed, self.answers.feed

    def _asked(self, head: bytes, tail: bytes) -> None:
        if head[0] in _ANSWERED:
            known = head[0] == _GET_TENSOR and len(tail) == 8
            self.expected.append(8 + struct.unpack("<Q", tail)[0] if known else 0)

    def _began(self, head: bytes) -> None:
        if self.expected:
            self.expected.pop(0)

    def missing(self) -> int:
        if not self.answers.midway and self.expected and self.expected[0]:
            return self.expected[0]
        return self.answers.missing()


class _Gathered:
    """ggml's requests to a secure worker, each passed on once whole, except a graph computation,
    which waits for the request behind it. ggml sends a token's inputs (SET_TENSOR) as it makes
    them, then its graph (GRAPH_COMPUTE or GRAPH_RECOMPUTE) and at once the request for the
    result (GET_TENSOR), on which it waits. The inputs go on as they come, so the worker's server
    takes them while ggml makes the rest (holding them for the answered request, as stop 40 did,
    cost 3-8% of SmolLM2's tok/s); the graph and its result's request cross as one TLS record,
    waking the front end once on the token's critical path. ``_GATHER_S`` bounds the hold,
    should ggml ever send a graph and then wait on nothing."""

    def __init__(self) -> None:
        self.command = -1
        self.messages = _Messages(9, self._head)
        self.missing = self.messages.missing

    def _head(self, head: bytes) -> None:
        self.command = head[0]

    def feed(self, data) -> bool:
        return self.messages.feed(data) and self.command not in _COMPUTE


class _Requests:
    """Counts ggml's requests that await an answer, from the messages' headers."""

    def __init__(self) -> None:
        self.waiting = 0
        self.requests, self.answers = _Messages(9, self._sent), _Messages(8, self._answered)
        self.sent, self.received = self.requests.feed, self.answers.feed

    def _sent(self, head: bytes) -> None:
        if head[0] in _ANSWERED:
            self.waiting += 1

    def _answered(self, head: bytes) -> None:
        self.waiting = max(0, self.waiting - 1)

    @property
    def awaiting(self) -> bool:
        """Whether ggml waits on the worker: a request unanswered, or an answer begun and not
        whole (a worker frozen while it sends a token's logits leaves ggml reading forever)."""
        return self.waiting > 0 or self.answers.midway


def _from_this_process(peer) -> bool:
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
        (self._listener,) = _listen("127.0.0.1", 0)
        self.local_endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        _accept_each(self._listener, self._serve, "speculum-rpc-relay")

    def _fail(self, kind: str, words: str) -> None:
        self.failure = (kind, words)

    def _serve(self, ggml: socket.socket, peer: tuple) -> None:
        if not _from_this_process(peer):
            _close(ggml)  # another program on this machine: the relay holds our token, not theirs
            return
        self.failure = None
        _nodelay_keepalive(ggml, keepalive=False)
        opened = self._open()
        if opened is None:
            _close(ggml)
            return
        upstream, early = opened
        self.upstreams.append(upstream)
        try:
            self._relay(ggml, upstream, early)
        finally:
            self.upstreams.remove(upstream)
            _close(upstream, ggml)

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
        _nodelay_keepalive(sock)
        if not w.secure:
            return sock, b""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # pinned below instead
        try:
            sock = context.wrap_socket(sock)
        except TimeoutError:
            _close(sock)
            return self._no_connection()
        except ssl.SSLError as exc:
            _close(sock)
            self._fail("connect", f"The RPC worker at {w.name} did not complete a TLS handshake ({exc.reason}): "
                                  "is it a `speculum rpc-worker` started without --insecure?")
            return None
        except OSError as exc:
            _close(sock)
            self._fail("connect", f"Cannot reach the RPC worker at {w.name}: {exc.strerror or exc}. "
                                  "Start it there with `speculum rpc-worker`.")
            return None
        if not hmac.compare_digest(fingerprint_of(sock.getpeercert(binary_form=True) or b""), w.fingerprint):
            _close(sock)  # before the token: an impostor learns nothing
            self._fail("pairing", f"The RPC worker at {w.name} presented a different certificate than its pairing "
                                  "string names: another machine answers at that address, or the worker made a new "
                                  "one (--new-pairing). Nothing was sent; copy the pairing string it prints now.")
            return None
        try:
            sock.sendall(MAGIC + w.token.encode() + b"\n")
            line, early = _read_line(sock, _MAX_REPLY, time.monotonic() + self.connect_timeout)
            reply = json.loads(line) if line else None
        except (OSError, ValueError):
            reply, early = None, b""
        if not isinstance(reply, dict) or reply.get("ok") is not True:
            _close(sock)
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
        requests = None if self.worker.secure else _Requests()
        unframer = _Unframer() if self.worker.secure else None

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
            up = _Way(ggml, upstream, whole=sent, missing=requests.requests.missing)
            down = _Way(upstream, ggml, whole=received, missing=requests.answers.missing)
        else:
            gathered = _Gathered()
            up = _Way(ggml, upstream, whole=gathered.feed, missing=gathered.missing, hold_s=_GATHER_S)
            down = _Way(upstream, ggml, unframed)
            try:
                down.out = memoryview(unframed(early))
            except ValueError:
                self._fail("closed", "")
                return
        ended = _shuttle([up, down], min(1.0, self.read_timeout / 4), watchdog)
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
        unframer = _Unframer() if self.worker.secure else None
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
                data = sock.recv(_CHUNK)
                if not data:
                    break
        except TimeoutError:
            if not answer:
                raise
        except (OSError, ValueError):
            pass  # the worker closed, or sent what no worker of ours sends: the caller judges what came
        finally:
            _close(sock)
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
