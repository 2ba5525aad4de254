"""The message box: Enter sends, Shift+Enter breaks the line, Esc stops the generation."""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QPlainTextEdit



class InputBox(QPlainTextEdit):
    """Four lines tall when short; it grows with what is typed or pasted, up to ``tallest()``
    pixels (the chat pane gives half its height), then scrolls."""
    submitted = Signal(str)
    stopRequested = Signal()
    typed = Signal()  # a keystroke that is not Enter or Esc: the user is writing
    SHORTEST = 84

    def __init__(self, parent=None, tallest: Callable[[], int] | None = None):
        super().__init__(parent)
        self.setObjectName("inputBox")
        self.setPlaceholderText("Message the model…  (Enter sends · Shift+Enter new line · Esc stops)")
        self.setTabChangesFocus(True)
        self.tallest = tallest or (lambda: 4 * self.SHORTEST)
        self.setFixedHeight(self.SHORTEST)
        self.document().documentLayout().documentSizeChanged.connect(self.fit)

    def fit(self, *_) -> None:
        """As tall as the text (wrapped lines count), within SHORTEST and ``tallest()``."""
        lines = self.document().documentLayout().documentSize().height()  # in lines for a plain text edit
        margins = self.contentsMargins()
        wanted = int(lines * self.fontMetrics().lineSpacing() + 2 * self.document().documentMargin()
                     + margins.top() + margins.bottom())
        self.setFixedHeight(max(self.SHORTEST, min(wanted, max(self.tallest(), self.SHORTEST))))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self.fit()  # a narrower box wraps into more lines

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key_Return, Qt.Key_Enter) and not event.modifiers() & Qt.ShiftModifier:
            text = self.toPlainText().strip()
            if text:
                self.submitted.emit(text)
            return
        if event.key() == Qt.Key_Escape:
            self.stopRequested.emit()
            return
        self.typed.emit()
        super().keyPressEvent(event)
