"""The centre of the window: the banner, the transcript with the document under it, and the input."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QPushButton, QSplitter, QVBoxLayout, QWidget

from ..banner import Banner
from .document import DocumentPane
from .inputbox import InputBox
from .transcript import WRITING, Transcript


class ChatPane(QWidget):
    sendRequested = Signal(str)  # Send, or Enter in the input box
    stopRequested = Signal()  # Stop, or Esc in the input box

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
        self.input = InputBox(tallest=lambda: self.height() // 2)
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
        # A long prompt (a document) takes seconds to read before the first token: say how far.
        self.prompt_progress = QProgressBar(objectName="promptProgress", textVisible=True)
        self.prompt_progress.hide()
        lay.addWidget(self.prompt_progress)
        lay.addLayout(row)
        self.send_button.clicked.connect(lambda: self.sendRequested.emit(self.input.toPlainText()))
        self.input.submitted.connect(self.sendRequested)
        self.input.stopRequested.connect(self.stopRequested)
        self.stop_button.clicked.connect(self.stopRequested)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.input.fit()  # its tallest is half the pane

    def set_busy(self, generating: bool, loading: bool) -> None:
        busy = generating or loading
        self.send_button.setEnabled(not busy)
        self.document.summarise_button.setEnabled(not busy and bool(self.document.text().strip()))
        self.stop_button.setEnabled(generating)

    def show_prompt_progress(self, read: int, total: int) -> None:
        """Prompt tokens read so far while the prompt is read; hidden once it is (Stop cancels)."""
        if read >= total:
            self.prompt_read()
            return
        self.transcript.set_answer_status("reading the prompt…")
        self.prompt_progress.setRange(0, total)
        self.prompt_progress.setValue(read)
        self.prompt_progress.setFormat(f"Reading the prompt… {read:,} / {total:,} tokens")
        self.prompt_progress.show()

    def prompt_read(self) -> None:
        """The prompt is read (or the first tokens came): the bar goes, the answer is being written."""
        self.prompt_progress.hide()
        self.transcript.set_answer_status(WRITING)

    def begin_answer(self, messages) -> None:
        """The conversation so far, and a place for the answer about to be written."""
        self.document.highlight([])
        self.transcript.show_messages(messages)
        self.transcript.begin_answer()

    def restore_question(self, text: str) -> None:
        """A question whose answer failed goes back to the input box, unless the user typed anew."""
        if text and not self.input.toPlainText().strip():
            self.input.setPlainText(text)

    def show_document(self, on: bool) -> None:
        self.document.setVisible(on)
        if on:
            # A pane shown after the splitter was laid out starts at zero width.
            total = sum(self.chat_split.sizes()) or self.chat_split.height()
            self.chat_split.setSizes([total * 9 // 20, total * 11 // 20])
