"""Serving the API, set up one way for `speculum serve` and the window's Serve switch.

``serve`` builds the served model and the HTTP server over it; the caller starts it on a
thread of its own (the window's engine process serves while it chats) or runs it on its own
thread until Ctrl-C (`speculum serve`, which listens before its models are loaded).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from ..engine.vocabulary import Mode
from ..protocol import Event, PlainBasis
from . import listen
from .app import create_app
from .service import ServedModel


@dataclass(frozen=True)
class ServeOptions:
    """What is served, where, and to whom."""

    model_id: str
    mode: Mode = Mode.AUTO
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None  # required as "Authorization: Bearer KEY"; None: anyone who reaches the port
    cors_origins: tuple[str, ...] = ()  # web pages allowed to call the API
    max_waiting: int = 8  # requests that may wait for the model (then 429)
    header_timeout: float = listen.HEADER_TIMEOUT_S
    max_connections: int = listen.MAX_CONNECTIONS


@dataclass(frozen=True)
class SharedEngine:
    """The engine the API shares with the window, when it does: its turn lock, what the window
    is told of each request, and the plain decoding rate measured there (the speedup's basis)."""

    turn: threading.Lock
    on_event: Callable[[Event], None]
    plain_rate: Callable[[], PlainBasis | float | None]


class Serving(listen.Serving):
    """The API over ``served``, listening where ``options`` say."""

    def __init__(self, served: ServedModel, options: ServeOptions):
        self.served = served
        app = create_app(served, api_key=options.api_key, cors_origins=list(options.cors_origins),
                         bind_host=options.host)
        super().__init__(app, options.host, options.port, header_timeout=options.header_timeout,
                         max_connections=options.max_connections)


def serve(options: ServeOptions, decoder=None, shared: SharedEngine | None = None, workers: tuple[str, ...] = (),
          reload: Callable[[], object] | None = None) -> Serving:
    """The API over ``decoder``, not yet listening. Without a decoder /health says it is loading
    (and requests get 503) until ``serving.served.loaded(decoder)``. Under --rpc, ``workers`` and
    ``reload`` (a fresh decoder) let it load the models again once a lost worker answers."""
    if shared is None:
        served = ServedModel(decoder, options.model_id, mode=options.mode, max_waiting=options.max_waiting,
                             workers=workers, reload=reload)
    else:
        served = ServedModel(decoder, options.model_id, mode=options.mode, max_waiting=options.max_waiting,
                             turn=shared.turn, on_event=shared.on_event, plain_rate=shared.plain_rate,
                             workers=workers, reload=reload)
    return Serving(served, options)
