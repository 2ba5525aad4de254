"""The centre of the window: the banner, the transcript with the document under it, and the input."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QSplitter, QVBoxLayout, QWidget

from .banner import Banner
from .document import DocumentPane
from .inputbox import InputBox
from .transcript import Transcript


class ChatPane(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.banner = Banner()
        self.transcript = Transcript()
        self.document = DocumentPane()
        self.document.hide()
        # The document sits under the transcript: side by side, both were too narrow to read.
        self.chat_split = QSplitter(Qt.Vertical)
        self.chat_split.addWidget(self.transcript)
        self.chat_split.addWidget(self.document)
        self.chat_split.setChildrenCollapsible(False)
        self.input = InputBox()
        self.input.setFixedHeight(84)
        self.send_button = QPushButton("Send", objectName="sendButton")
        self.stop_button = QPushButton("Stop", objectName="stopButton", toolTip="Stop generating (Esc)")
        self.stop_button.setEnabled(False)
        side = QVBoxLayout()
        side.addWidget(self.send_button)
        side.addWidget(self.stop_button)
        side.addStretch()
        row = QHBoxLayout()
        row.addWidget(self.input, 1)
        row.addLayout(side)
        lay = QVBoxLayout(self)
        lay.addWidget(self.banner)
        lay.addWidget(self.chat_split, 1)
        lay.addLayout(row)

    def show_document(self, on: bool) -> None:
        self.document.setVisible(on)
        if on:
            # A pane shown after the splitter was laid out starts at zero width.
            total = sum(self.chat_split.sizes()) or self.chat_split.height()
            self.chat_split.setSizes([total * 9 // 20, total * 11 // 20])
