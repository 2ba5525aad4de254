"""The Serve switch: the loaded models as an OpenAI-compatible API for other programs."""

from __future__ import annotations

import time
from collections import deque

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QMenu, QSpinBox, QToolButton, QWidget

from .chat.richtext import escaped_tooltip

DEFAULT_PORT = 8080
LOG_LINES = 8  # the requests the log keeps


def example_request(base_url: str, model_id: str) -> str:
    """A copy-paste request another program can send."""
    return (f"curl {base_url}/chat/completions -H 'Content-Type: application/json' \\\n"
            f"  -d '{{\"model\": \"{model_id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'")


def address(base_url: str) -> str:
    """The base URL as the toolbar shows it: host and port ("127.0.0.1:8080"); the whole URL is
    in its menu and what Copy copies."""
    return base_url.removeprefix("http://").removeprefix("https://").removesuffix("/v1")


class ServePanel(QWidget):
    """Switch and port; once serving, the address with its request count (its menu: the base
    URL, the model's name in the API, the last requests) and Copy (the URL and an example).
    Narrow on purpose: at 1280 pixels the toolbar has room for the pickers and this, no more
    (the URL, Copy and a request count side by side went into the toolbar's overflow menu)."""

    switched = Signal(bool, int)  # on, port

    def __init__(self, parent=None):
        super().__init__(parent)
        self.switch = QToolButton(text="Serve API", checkable=True, objectName="serveSwitch",
                                  toolTip="Serve the loaded models to other programs through the OpenAI API "
                                          "(this machine only)")
        self.port = QSpinBox(objectName="servePort", minimum=1024, maximum=65535, value=DEFAULT_PORT,
                             toolTip="Port of the API on 127.0.0.1")
        self.url = QToolButton(objectName="serveUrl", popupMode=QToolButton.InstantPopup)
        self.url.setMenu(QMenu(self.url))
        self.copy = QToolButton(text="Copy", objectName="serveCopy",
                                toolTip="Copy the base URL and an example request")
        self.copy.clicked.connect(self.copy_example)
        self.answered = 0
        self.log: deque[str] = deque(maxlen=LOG_LINES)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (self.switch, self.port, self.url, self.copy):
            layout.addWidget(widget)
        self.switch.toggled.connect(lambda on: self.switched.emit(on, self.port.value()))
        self.base_url = self.model_id = ""
        self.show_stopped()

    def show_serving(self, base_url: str, model_id: str) -> None:
        self._show(True, base_url, model_id)

    def add_request(self, tokens: int, tokens_per_s: float | None, client: str = "") -> None:
        """One request answered: counted, and logged with who asked, its size and speed."""
        self.answered += 1
        rate = f", {tokens_per_s:.1f} tok/s" if tokens_per_s else ""
        who = f"{client}  " if client else ""
        self.log.appendleft(f"{time.strftime('%H:%M:%S')}  {who}{tokens} token{'s' * (tokens != 1)}{rate}")
        self._describe()

    def requests_text(self) -> str:
        return f"{self.answered} request{'s' * (self.answered != 1)}" if self.answered else ""

    def _describe(self) -> None:
        """The address button's text, tooltip and menu, from the serving state and the log."""
        count = self.requests_text()
        self.url.setText(address(self.base_url) + (f" · {count}" if count else ""))
        self.url.adjustSize()
        self.updateGeometry()  # the toolbar lays out anew: a longer text is not cut off at its edge
        about = [f"Base URL: {self.base_url}", f"Model name in the API: {self.model_id}"]
        if self.log:
            about += ["", "Requests answered since Serve was switched on; the last ones:", *self.log]
        self.url.setToolTip(escaped_tooltip("\n".join(about)))
        menu = self.url.menu()
        menu.clear()
        menu.addAction("Copy the base URL and an example request", self.copy_example)
        menu.addSeparator()
        for line in about:
            if line:
                menu.addAction(line).setEnabled(False)
            else:
                menu.addSeparator()

    def show_stopped(self) -> None:
        self._show(False, "", "")

    def _show(self, serving: bool, base_url: str, model_id: str) -> None:
        self.base_url, self.model_id = base_url, model_id
        self.switch.blockSignals(True)  # showing the state is not the user switching
        self.switch.setChecked(serving)
        self.switch.blockSignals(False)
        self.port.setVisible(not serving)  # the address names it; the toolbar has no room for both
        if not serving:  # a new serving counts afresh
            self.answered = 0
            self.log.clear()
        self._describe()
        self.url.setVisible(serving)
        self.copy.setVisible(serving)

    def example(self) -> str:
        return f"{self.base_url}\n\n{example_request(self.base_url, self.model_id)}\n"

    def copy_example(self) -> None:
        QGuiApplication.clipboard().setText(self.example())
