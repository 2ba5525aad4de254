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

All sockets live on one asyncio loop on a daemon thread (``_loop``).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import hmac
import json
import os
import secrets
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import SpeculumError
from .rpcaddress import TOKEN_CHARS, WorkerAddress

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


# --- one event loop for every link in the process ---------------------------------------

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            loop.set_exception_handler(lambda *_: None)  # a stranger's failed TLS handshake is not our error
            threading.Thread(target=loop.run_forever, name="speculum-rpc-link", daemon=True).start()
            _loop = loop
        return _loop


def _run(coro, timeout: float | None = None):
    return asyncio.run_coroutine_threadsafe(coro, _event_loop()).result(timeout)


async def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is None:
        return
    try:
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    except (OSError, asyncio.TimeoutError, ssl.SSLError):
        pass


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                seen: Callable[[bytes], None] | None = None) -> None:
    """Copy until the reader ends; ``seen`` hears each chunk first."""
    while True:
        data = await reader.read(_CHUNK)
        if not data:
            return
        if seen:
            seen(data)
        writer.write(data)
        await writer.drain()


# --- the worker's TLS front end ------------------------------------------------------------

class FrontEnd:
    """TLS on ``host:port`` in front of ggml's RPC server on 127.0.0.1:``ggml_port``."""

    def __init__(self, host: str, port: int, ggml_port: int, identity: Identity, device: dict,
                 log: Callable[[str], None]):
        self.host, self.port, self.ggml_port = host, port, ggml_port
        self.identity, self.device, self.log = identity, device, log
        self.bytes_to_ggml = 0  # every byte any client passed to ggml's parser, all connections together
        self._server: asyncio.AbstractServer | None = None

    def start(self) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(self.identity.cert_file, self.identity.key_file)
        try:
            self._server = _run(asyncio.start_server(self._serve, self.host, self.port, ssl=context,
                                                     ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S, reuse_address=True))
        except OSError as exc:
            raise SpeculumError(f"Cannot listen on {self.host}:{self.port}: {exc.strerror or exc}.") from None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        who = f"{peer[0]}:{peer[1]}"
        ggml_writer = None
        passed = 0
        try:
            try:
                hello = await asyncio.wait_for(reader.readexactly(len(MAGIC) + TOKEN_CHARS + 1), HANDSHAKE_TIMEOUT_S)
            except (asyncio.IncompleteReadError, asyncio.TimeoutError, OSError, ssl.SSLError):
                self.log(f"refused {who}: it sent no token (a client pinning another certificate, or not Speculum)")
                return
            token = hello[len(MAGIC):-1]
            if not (hello.startswith(MAGIC) and hmac.compare_digest(token, self.identity.token.encode())):
                writer.write(b'{"ok": false, "error": "wrong token"}\n')
                await writer.drain()
                self.log(f"refused {who}: wrong token")
                return
            try:
                ggml_reader, ggml_writer = await asyncio.open_connection("127.0.0.1", self.ggml_port)
            except OSError as exc:
                writer.write(json.dumps({"ok": False, "error": f"llama.cpp's server: {exc}"}).encode() + b"\n")
                return
            _nodelay_keepalive(ggml_writer.get_extra_info("socket"), keepalive=False)
            _nodelay_keepalive(writer.get_extra_info("socket"))
            writer.write(json.dumps({"ok": True, "device": self.device}).encode() + b"\n")
            self.log(f"paired with {who}")

            def count(data: bytes) -> None:
                nonlocal passed
                passed += len(data)
                self.bytes_to_ggml += len(data)

            await _first_done(_pump(reader, ggml_writer, count), self._frames(ggml_reader, writer),
                              self._heartbeat(writer))
        finally:
            await _close(ggml_writer)
            await _close(writer)
            self.log(f"{who} disconnected: {passed} bytes passed to llama.cpp ({self.bytes_to_ggml} in all)")

    @staticmethod
    async def _frames(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(_CHUNK)
            if not data:
                return
            writer.write(_FRAME.pack(_DATA, len(data)) + data)
            await writer.drain()

    @staticmethod
    async def _heartbeat(writer: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            writer.write(_FRAME.pack(_BEAT, 0))
            await writer.drain()


async def _first_done(*coros) -> None:
    """Run the coroutines until one ends (a side closed, or an error); cancel the others."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


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


class _Requests:
    """Counts ggml's requests that await an answer, reading only the messages' headers:
    a request is | command (1) | size (8) | body |, an answer | size (8) | body |."""

    def __init__(self) -> None:
        self.waiting = 0
        self._out = self._headers(9, self._sent)
        self._in = self._headers(8, self._answered)
        next(self._out), next(self._in)

    def sent(self, data: bytes) -> None:
        self._out.send(data)

    def received(self, data: bytes) -> None:
        self._in.send(data)

    def _sent(self, head: bytes) -> int:
        if head[0] in _ANSWERED:
            self.waiting += 1
        return struct.unpack_from("<Q", head, 1)[0]

    def _answered(self, head: bytes) -> int:
        self.waiting = max(0, self.waiting - 1)
        return struct.unpack_from("<Q", head)[0]

    @staticmethod
    def _headers(size: int, on_head: Callable[[bytes], int]):
        head, skip = b"", 0
        while True:
            data = yield
            while data:
                if skip:
                    step = min(skip, len(data))
                    skip, data = skip - step, data[step:]
                    continue
                take = size - len(head)
                head, data = head + data[:take], data[take:]
                if len(head) == size:
                    skip, head = on_head(head), b""


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
        self._server = _run(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.local_endpoint = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def _fail(self, kind: str, words: str) -> None:
        self.failure = (kind, words)

    async def _serve(self, ggml_reader: asyncio.StreamReader, ggml_writer: asyncio.StreamWriter) -> None:
        if not _from_this_process(ggml_writer.get_extra_info("peername")):
            await _close(ggml_writer)  # another program on this machine: the relay holds our token, not theirs
            return
        self.failure = None
        _nodelay_keepalive(ggml_writer.get_extra_info("socket"), keepalive=False)
        writer = None
        try:
            opened = await self._open()
            if opened is None:
                return
            reader, writer = opened
            sock = writer.get_extra_info("socket")
            self.upstreams.append(sock)
            try:
                await self._relay(ggml_reader, ggml_writer, reader, writer)
            finally:
                self.upstreams.remove(sock)
        finally:
            await _close(writer)
            await _close(ggml_writer)

    async def _open(self):
        """The connection to the worker, checked and paired; None (and ``failure`` said) when not."""
        w = self.worker
        context = None
        if w.secure:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.minimum_version = ssl.TLSVersion.TLSv1_3
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # pinned below instead
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(w.host, w.port, ssl=context, server_hostname="" if context else None),
                self.connect_timeout)
        except asyncio.TimeoutError:
            self._fail("connect", f"The RPC worker at {w.name} did not accept a connection within "
                                  f"{self.connect_timeout:g} s (a firewall, or the machine is off?).")
            return None
        except ssl.SSLError as exc:
            self._fail("connect", f"The RPC worker at {w.name} did not complete a TLS handshake ({exc.reason}): "
                                  "is it a `speculum rpc-worker` started without --insecure?")
            return None
        except OSError as exc:
            why = "nothing is listening there" if isinstance(exc, ConnectionRefusedError) else (exc.strerror or str(exc))
            self._fail("connect", f"Cannot reach the RPC worker at {w.name}: {why}. "
                                  "Start it there with `speculum rpc-worker`.")
            return None
        _nodelay_keepalive(writer.get_extra_info("socket"))
        if not w.secure:
            return reader, writer
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True) or b""
        if not hmac.compare_digest(fingerprint_of(der), w.fingerprint):
            await _close(writer)  # before the token: an impostor learns nothing
            self._fail("pairing", f"The RPC worker at {w.name} presented a different certificate than its pairing "
                                  "string names: another machine answers at that address, or the worker made a new "
                                  "one (--new-pairing). Nothing was sent; copy the pairing string it prints now.")
            return None
        try:
            writer.write(MAGIC + w.token.encode() + b"\n")
            line = await asyncio.wait_for(reader.readline(), self.connect_timeout)
            reply = json.loads(line[:_MAX_REPLY]) if line.endswith(b"\n") else None
        except (asyncio.TimeoutError, OSError, ssl.SSLError, ValueError, asyncio.LimitOverrunError):
            reply = None
        if not isinstance(reply, dict) or reply.get("ok") is not True:
            await _close(writer)
            refused = isinstance(reply, dict) and reply.get("error") == "wrong token"
            self._fail("pairing", f"The RPC worker at {w.name} refused the token: copy the pairing string it prints "
                                  "again." if refused else f"The RPC worker at {w.name} did not accept the pairing "
                                  "(no answer, or not a Speculum worker of this version).")
            return None
        device = reply.get("device")
        self.device = device if isinstance(device, dict) else {}
        return reader, writer

    async def _relay(self, ggml_reader, ggml_writer, reader, writer) -> None:
        """Both directions until one side closes; a silent worker ends it after ``read_timeout``."""
        heard = [time.monotonic()]  # last sign of life from the worker
        requests = None if self.worker.secure else _Requests()

        def sent(data: bytes) -> None:
            if requests.waiting == 0:
                heard[0] = time.monotonic()  # the wait for an answer starts now
            requests.sent(data)

        def received(data: bytes) -> None:
            heard[0] = time.monotonic()
            requests.received(data)

        async def from_worker() -> None:
            if requests is not None:
                await _pump(reader, ggml_writer, received)
            else:
                await self._unframe(reader, ggml_writer, heard)
            if not ggml_writer.is_closing():
                self._fail("closed", "")  # the worker ended the connection: the abort hook words it

        async def watchdog() -> None:
            while True:
                await asyncio.sleep(min(1.0, self.read_timeout / 4))
                quiet = time.monotonic() - heard[0]
                if quiet > self.read_timeout and (requests is None or requests.waiting):
                    self._fail("timeout", f"The RPC worker at {self.worker.name} did not answer for "
                                          f"{self.read_timeout:g} s: it is frozen, asleep or cut off (a pass that "
                                          "really takes longer needs a larger --rpc-timeout).")
                    return

        await _first_done(_pump(ggml_reader, writer, sent if requests else None), from_worker(), watchdog())

    @staticmethod
    async def _unframe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, heard: list[float]) -> None:
        while True:
            try:
                kind, size = _FRAME.unpack(await reader.readexactly(_FRAME.size))
                if size > _CHUNK:  # the front end never frames more: not a worker of ours
                    return
                data = await reader.readexactly(size) if size else b""
            except (asyncio.IncompleteReadError, ssl.SSLError, OSError):
                return
            heard[0] = time.monotonic()
            if kind == _DATA:
                writer.write(data)
                await writer.drain()

    def exchange(self, request: bytes, enough: Callable[[bytes], bool], timeout: float) -> bytes:
        """Open a connection to the worker as ggml's would, send ``request``, and return the
        answer once ``enough`` says it is complete, the worker closes, or ``timeout`` passes with
        part of it. SpeculumError when the connection or the pairing fails; TimeoutError when
        nothing at all came back."""
        try:
            return _run(self._exchange(request, enough, timeout))
        except asyncio.TimeoutError:
            raise TimeoutError from None

    async def _exchange(self, request: bytes, enough: Callable[[bytes], bool], timeout: float) -> bytes:
        self.failure = None
        opened = await self._open()
        if opened is None:
            raise SpeculumError(self.failure[1])
        reader, writer = opened
        answer = bytearray()

        class Sink:  # what _unframe writes the worker's data to
            def write(self, data: bytes) -> None:
                answer.extend(data)

            async def drain(self) -> None:
                if enough(bytes(answer)):
                    raise EOFError

        async def collect() -> None:
            if self.worker.secure:
                await self._unframe(reader, Sink(), [0.0])
                return
            while not enough(bytes(answer)):
                data = await reader.read(_CHUNK)
                if not data:
                    return
                answer.extend(data)

        try:
            writer.write(request)
            await asyncio.wait_for(collect(), timeout)
        except asyncio.TimeoutError:  # (an OSError too, since Python 3.11: say it as itself)
            if not answer:
                raise
        except (EOFError, OSError, ssl.SSLError):
            pass  # the answer is complete, or the worker closed: the caller judges what came
        finally:
            await _close(writer)
        return bytes(answer)

    def close(self) -> None:
        self._server.close()
