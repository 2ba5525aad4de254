"""The banner across the top of the chat: a message the user can act on, with action buttons."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget


class Banner(QFrame):
    """A message across the top of the chat: errors the user can act on, never a console-only traceback."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("banner")
        self.label = QLabel()
        self.label.setTextFormat(Qt.PlainText)  # messages quote file and model names
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.close_button = close = QToolButton(text="✕", toolTip="Dismiss")
        close.clicked.connect(self.hide)
        self.actions_row = QHBoxLayout()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        layout.addWidget(self.label, 1)
        layout.addLayout(self.actions_row)
        layout.addWidget(close, 0, Qt.AlignTop)
        self.hide()

    def show_message(self, text: str, kind: str = "error", actions=()) -> None:
        """Show ``text``; ``actions`` are (label, callback) buttons that also dismiss the banner."""
        self.setProperty("kind", kind)
        self.style().unpolish(self)
        self.style().polish(self)
        self.label.setText(text)
        while self.actions_row.count():
            self.actions_row.takeAt(0).widget().deleteLater()
        # Made now, the buttons would come last in the window's Tab order: put them where they are seen.
        before = self.close_button.previousInFocusChain()
        for label, callback in actions:
            button = QPushButton(label, objectName="bannerAction")
            button.clicked.connect(self.hide)
            button.clicked.connect(callback)
            self.actions_row.addWidget(button, 0, Qt.AlignTop)
            QWidget.setTabOrder(before, button)
            before = button
        QWidget.setTabOrder(before, self.close_button)
        self.show()

    def action_labels(self) -> list[str]:
        return [self.actions_row.itemAt(i).widget().text() for i in range(self.actions_row.count())]

    def trigger(self, label: str) -> None:
        """Press the action button called ``label`` (tests, keyboard users)."""
        for i in range(self.actions_row.count()):
            button = self.actions_row.itemAt(i).widget()
            if button.text() == label:
                button.click()
                return
        raise KeyError(label)

    def text(self) -> str:
        return self.label.text() if self.isVisible() else ""
