"""The Serve switch: the loaded models as an OpenAI-compatible API for other programs."""

from __future__ import annotations

import time
from collections import deque

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMenu, QSpinBox, QToolButton, QWidget

DEFAULT_PORT = 8080
LOG_LINES = 8  # the requests the log keeps


def example_request(base_url: str, model_id: str) -> str:
    """A copy-paste request another program can send."""
    return (f"curl {base_url}/chat/completions -H 'Content-Type: application/json' \\\n"
            f"  -d '{{\"model\": \"{model_id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'")


class ServePanel(QWidget):
    """Switch and port; once serving, the base URL (with the port) and a Copy button (URL and an
    example) instead of the port."""

    switched = Signal(bool, int)  # on, port

    def __init__(self, parent=None):
        super().__init__(parent)
        self.switch = QToolButton(text="Serve API", checkable=True, objectName="serveSwitch",
                                  toolTip="Serve the loaded models to other programs through the OpenAI API "
                                          "(this machine only)")
        self.port = QSpinBox(objectName="servePort", minimum=1024, maximum=65535, value=DEFAULT_PORT,
                             toolTip="Port of the API on 127.0.0.1")
        self.url = QLabel(objectName="serveUrl")
        self.url.setTextFormat(Qt.PlainText)
        self.url.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.copy = QToolButton(text="Copy", objectName="serveCopy",
                                toolTip="Copy the base URL and an example request")
        self.copy.clicked.connect(self.copy_example)
        # How many requests were answered, and the last few on hover or click.
        self.requests = QToolButton(objectName="serveRequests", popupMode=QToolButton.InstantPopup)
        self.requests.setMenu(QMenu(self.requests))
        self.answered = 0
        self.log: deque[str] = deque(maxlen=LOG_LINES)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (self.switch, self.port, self.url, self.copy, self.requests):
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
        self.requests.setText(f"{self.answered} request{'s' * (self.answered != 1)}")
        self.requests.setToolTip("Requests answered since Serve was switched on; the last ones:\n"
                                 + "\n".join(self.log))
        menu = self.requests.menu()
        menu.clear()
        for line in self.log:
            menu.addAction(line).setEnabled(False)
        self.requests.show()

    def show_stopped(self) -> None:
        self._show(False, "", "")

    def _show(self, serving: bool, base_url: str, model_id: str) -> None:
        self.base_url, self.model_id = base_url, model_id
        self.switch.blockSignals(True)  # showing the state is not the user switching
        self.switch.setChecked(serving)
        self.switch.blockSignals(False)
        self.port.setVisible(not serving)  # the URL names it; the toolbar has no room for both
        self.url.setText(base_url)
        self.url.setVisible(serving)
        self.copy.setVisible(serving)
        if not serving:  # a new serving counts afresh
            self.answered = 0
            self.log.clear()
        self.requests.setVisible(serving and self.answered > 0)

    def example(self) -> str:
        return f"{self.base_url}\n\n{example_request(self.base_url, self.model_id)}\n"

    def copy_example(self) -> None:
        QGuiApplication.clipboard().setText(self.example())
