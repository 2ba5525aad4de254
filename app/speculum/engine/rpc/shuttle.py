"""Moving bytes between two sockets, one thread per connection (``shuttle``), with
non-blocking sockets: every byte costs a C-level receive and send, not a pass through
asyncio's streams and TLS layer, which cost the link a few milliseconds a token; and a TLS
socket is only ever used by the thread that owns it. Also the small socket chores both ends of
the link share: listening, accepting, reading a line, closing.
"""

from __future__ import annotations

import selectors
import socket
import ssl
import threading
import time
from typing import Callable

CHUNK = 1 << 20


# A machine that vanishes (power, cable, Wi-Fi) sends no FIN: without keepalive a connection to
# it waits for the kernel's retransmission limit (~15 minutes). Probes are answered by the
# peer's kernel even while its device computes, so a slow pass is never taken for a loss.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 5, 2, 5  # a lost machine is noticed in ~15 s


def nodelay_keepalive(sock: socket.socket | None, keepalive: bool = True) -> None:
    """Small requests go out at once; a machine that vanishes is noticed (loopback needs no keepalive)."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not keepalive:
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        idle = getattr(socket, "TCP_KEEPIDLE", getattr(socket, "TCP_KEEPALIVE", None))  # platform: macOS: KEEPALIVE
        interval = getattr(socket, "TCP_KEEPINTVL", None)  # platform: each option where the system has it
        probes = getattr(socket, "TCP_KEEPCNT", None)  # platform:
        for option, value in ((idle, KEEPALIVE_IDLE_S), (interval, KEEPALIVE_INTERVAL_S), (probes, KEEPALIVE_PROBES)):
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # platform: (Linux) data sent but never acknowledged: the same bound
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                            1000 * (KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES))
    except OSError:
        pass


HOLD_S = 0.05  # a message held back longer than this goes on in part (it never should)
LOW_WATER_CAP = 16384  # (well under any socket's receive buffer, or select would never wake)


class Way:
    """One direction of a relay: what is read from ``src`` goes, passed through ``shape``, to
    ``dst``. ``shape``, when given, gets the buffer up to what was read (``head`` bytes reserved in front,
    for a frame header) and returns what to send. ``whole``, when given, sees each new piece
    and says whether the bytes so far end where one of llama.cpp's messages ends; until then
    they are held back: llama.cpp writes a message's command, size and body in separate
    sends, and each piece passed on alone would cost a TLS record and a wake-up on each hop."""

    def __init__(self, src: socket.socket, dst: socket.socket, shape: Callable[[memoryview], object] | None = None,
                 head: int = 0, whole: Callable[[memoryview], bool] | None = None,
                 missing: Callable[[], int] | None = None, hold_s: float = HOLD_S):
        self.src, self.dst, self.shape, self.head, self.whole = src, dst, shape, head, whole
        self.hold_s = hold_s  # the longest bytes are held back before they go on as they are
        # How many bytes the message being read still lacks: a plain ``src`` wakes select only
        # once they are all there (SO_RCVLOWAT), not once per piece that llama.cpp sends.
        self.missing = missing if hasattr(socket, "SO_RCVLOWAT") and not isinstance(src, ssl.SSLSocket) else None  # platform:
        self.low_water = 1
        self.buffer = memoryview(bytearray(head + CHUNK))
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
        size = max(1, min(size, LOW_WATER_CAP))
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


def shuttle(ways: list[Way], tick_s: float, tick: Callable[[], bool]) -> socket.socket | None:
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


def read_line(sock: socket.socket, limit: int, deadline: float) -> tuple[bytes, bytes]:
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


def read_exactly(sock: socket.socket, size: int, deadline: float) -> bytes | None:
    got = b""
    while len(got) < size:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        data = sock.recv(size - len(got))
        if not data:
            return None
        got += data
    return got


def listen(host: str, port: int) -> list[socket.socket]:
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


def accept_each(listener: socket.socket, serve: Callable[[socket.socket, tuple], None], name: str) -> None:
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


def close_all(*socks: socket.socket | None) -> None:
    for sock in socks:
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
