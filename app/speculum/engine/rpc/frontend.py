"""The worker's side of the secure link: ggml's RPC server listens on loopback only; this TLS
server (``FrontEnd``) takes the connections from the network, checks the client's token before
it opens a connection to ggml, then relays, framed, with a heartbeat.
"""

from __future__ import annotations

import hmac
import json
import socket
import ssl
import time
from typing import Callable

from ...errors import SpeculumError
from .address import TOKEN_CHARS
from .identity import Identity
from .shuttle import Way, accept_each, close_all, listen, nodelay_keepalive, read_exactly, shuttle
from .wire import BEAT_FRAME, DATA, FRAME, MAGIC, Answers

HEARTBEAT_S = 1.0
HANDSHAKE_TIMEOUT_S = 10.0


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
            listeners = listen(self.host, self.port)
        except OSError as exc:
            raise SpeculumError(f"Cannot listen on {self.host}:{self.port}: {exc.strerror or exc}.") from None
        for listener in listeners:
            accept_each(listener, self._serve, "speculum-rpc-front-end")

    def _serve(self, conn: socket.socket, peer: tuple) -> None:
        who = f"{peer[0]}:{peer[1]}"
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            tls = self._context.wrap_socket(conn, server_side=True)
        except OSError:
            close_all(conn)  # a stranger's failed TLS handshake: nothing reached us
            return
        ggml = None
        passed = 0
        try:
            try:
                hello = read_exactly(tls, len(MAGIC) + TOKEN_CHARS + 1, deadline)
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
            nodelay_keepalive(ggml, keepalive=False)
            nodelay_keepalive(tls)
            tls.sendall(json.dumps({"ok": True, "device": self.device}).encode() + b"\n")
            self.log(f"paired with {who}")

            answers = Answers()

            def count(data: memoryview) -> memoryview:
                nonlocal passed
                passed += len(data)
                self.bytes_to_ggml += len(data)
                answers.asked(data)
                return data

            def framed(data: memoryview) -> memoryview:  # (the header's room was kept in front)
                FRAME.pack_into(data, 0, DATA, len(data) - FRAME.size)
                return data

            to_client = Way(ggml, tls, framed, head=FRAME.size, whole=answers.feed, missing=answers.missing)
            next_beat = time.monotonic() + HEARTBEAT_S

            def beat() -> bool:
                nonlocal next_beat
                if time.monotonic() >= next_beat and not to_client.out:  # (never inside a frame)
                    to_client.out = memoryview(BEAT_FRAME)
                    next_beat = time.monotonic() + HEARTBEAT_S
                return True

            shuttle([Way(tls, ggml, count), to_client], HEARTBEAT_S / 4, beat)
        except OSError:
            pass  # the client went away mid-handshake
        finally:
            close_all(ggml, tls)
            self.log(f"{who} disconnected: {passed} bytes passed to llama.cpp ({self.bytes_to_ggml} in all)")
