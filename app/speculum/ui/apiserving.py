"""Serving the loaded models over the OpenAI API from the engine process, behind the Serve switch.

While the window writes no answer of its own, each API request is shown live in the
speculation pane, as the window's own answers are.
"""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, Signal

from ..protocol import Finished, Started
from .servepanel import ServePanel
from .speculation.speculationpane import SpeculationPane

SERVING_MESSAGE_MS = 5000


class ApiServing(QObject):
    error = Signal(str)

    def __init__(self, engine, panel: ServePanel, pane: SpeculationPane, status_bar,
                 loaded: Callable[[], bool], answering: Callable[[], bool], mode: Callable[[], str], parent=None):
        super().__init__(parent)
        self.engine, self.panel, self.pane, self.status_bar = engine, panel, pane, status_bar
        self._loaded, self._answering, self._mode = loaded, answering, mode
        w = engine.worker
        w.serving.connect(self._on_serving)
        w.serveFailed.connect(self._on_serve_failed)
        w.servedRequest.connect(self._on_served_request)
        engine.served_batcher.batchReady.connect(self._on_served_batch)
        panel.switched.connect(self._switch)
        self.port: int | None = None  # where the API is served, or asked to be
        self.serving = False
        self.resume_port: int | None = None  # served when the engine crashed: served again once reloaded
        self._last = None  # the served request's last cycle event (its speed)
        self._client = ""  # the served request's client address (its Started event's)

    def _switch(self, on: bool, port: int) -> None:
        self.resume_port = None  # the user decides now
        if not on:
            self.engine.stop_serving()
        elif not self._loaded():
            self.panel.show_stopped()
            self.error.emit("Load a model first: the API serves the loaded models.")
        else:
            self.port = port
            self.engine.serve(port, self._mode())

    def engine_died(self) -> None:
        """The engine process (and the server in it) ended: remember to serve again after Reload."""
        if self.serving:
            self.resume_port = self.port
        self.stopped()

    def stopped(self) -> None:
        """A new engine process serves nothing until asked (or until it resumes after a crash)."""
        self.serving = False
        self.panel.show_stopped()

    def models_loaded(self) -> None:
        """Loaded again after a crash: what was served is served again, on the same port."""
        port, self.resume_port = self.resume_port, None
        if port is not None:
            self.panel.port.setValue(port)
            self.port = port
            self.engine.serve(port, self._mode())

    def _on_serving(self, url: str, model_id: str) -> None:
        self.serving = bool(url)
        if url:
            self.panel.show_serving(url, model_id)
            self.status_bar.showMessage(f"Serving {model_id} at {url}", SERVING_MESSAGE_MS)
        else:
            self.panel.show_stopped()

    def _on_serve_failed(self, message: str) -> None:
        self.panel.show_stopped()
        self.error.emit(message)

    def _on_served_request(self, event) -> None:
        """An API client's request (Started, Finished, Failed): counted and logged; shown live in
        the speculation view and stats, like the window's own, unless the window is writing an answer."""
        if isinstance(event, Started):
            self._client = event.client
        else:
            self.engine.served_batcher.flush()  # its last cycles before its count
        if isinstance(event, Finished):
            rate = self._last.snapshot.tokens_per_s if self._last is not None else None
            self.panel.add_request((event.usage or {}).get("completion_tokens", 0), rate, self._client)
        self._last = None
        if not self._answering():
            self.pane.show_served_request(event)

    def _on_served_batch(self, events: list) -> None:
        self._last = events[-1]
        if self._answering():
            return
        self.pane.add_events(events)
        self.pane.show_snapshot(events[-1].snapshot)
