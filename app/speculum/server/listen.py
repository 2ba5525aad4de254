"""Listening for HTTP clients: uvicorn, with bounds on what a connection may hold.

uvicorn keeps a connection whose request headers never finish open for as long as the
client trickles bytes (its keep-alive timer restarts on every byte), so a handful of such
connections would hold the server. Here each connection must finish its request headers
within ``header_timeout`` seconds of opening (or of its previous answer), and no more than
``max_connections`` may be open at once: beyond that a new one is closed at once.
"""

from __future__ import annotations

import threading
import time

HEADER_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64


def _bounded_protocol(base: type, header_timeout: float, max_connections: int) -> type:
    """uvicorn's HTTP protocol class with a header deadline and a connection cap."""

    class Bounded(base):
        def connection_made(self, transport) -> None:
            self._header_deadline = None  # (armed below, unless this connection is one too many)
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()
                return
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_deadline()

        def connection_lost(self, exc) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            self._header_deadline = self.loop.call_later(header_timeout, self._headers_too_slow, self.cycle)

        def _headers_too_slow(self, cycle_when_armed) -> None:
            """Close the connection unless a request's headers arrived since the deadline was set."""
            in_progress = self.cycle is not None and not self.cycle.response_complete
            if self.cycle is cycle_when_armed and not in_progress and not self.transport.is_closing():
                self.transport.close()

    Bounded.__name__ = Bounded.__qualname__ = f"Bounded{base.__name__}"
    return Bounded


def config(app, host: str, port: int, header_timeout: float = HEADER_TIMEOUT_S,
           max_connections: int = MAX_CONNECTIONS, **options):
    """A uvicorn Config for the API: bounded connections, no access log."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    options.setdefault("log_level", "warning")
    return uvicorn.Config(app, host=host, port=port, access_log=False,
                          http=_bounded_protocol(AutoHTTPProtocol, header_timeout, max_connections), **options)


class Serving:
    """A server on a thread of its own (the window's engine process serves while it chats)."""

    def __init__(self, app, host: str, port: int, **options):
        import uvicorn

        self.server = uvicorn.Server(config(app, host, port, **options))
        self.thread = threading.Thread(target=self.server.run, name="speculum-serve", daemon=True)
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/v1"

    def start(self, timeout: float = 20.0) -> None:
        """Start listening; SpeculumError in plain words when the port cannot be had."""
        from ..errors import SpeculumError

        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SpeculumError(f"Could not serve on {self.url}: the port is in use or not allowed.")
            time.sleep(0.02)

    def run(self) -> None:
        """Serve on the caller's thread until told to stop (Ctrl-C on the main thread, or ``stop``)."""
        self.server.run()

    @property
    def stopping(self) -> bool:
        return self.server.should_exit

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():  # (not when it runs on the caller's thread)
            self.thread.join(10)

