"""The message box: Enter sends, Shift+Enter breaks the line, Esc stops the generation."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QPlainTextEdit



class InputBox(QPlainTextEdit):
    submitted = Signal(str)
    stopRequested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("inputBox")
        self.setPlaceholderText("Message the model…  (Enter sends · Shift+Enter new line · Esc stops)")
        self.setTabChangesFocus(True)

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key_Return, Qt.Key_Enter) and not event.modifiers() & Qt.ShiftModifier:
            text = self.toPlainText().strip()
            if text:
                self.submitted.emit(text)
            return
        if event.key() == Qt.Key_Escape:
            self.stopRequested.emit()
            return
        super().keyPressEvent(event)
