"""Check against plain decoding: an answer's link re-decodes its prompt plainly in the engine
process (engine/plaincheck.py) and the bar under the transcript shows the progress, a Cancel, and
then "Identical to plain decoding" or the first token where the two part, with both logits.

Tokens are model output: the bar shows them as plain text, never as rich text.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QProgressBar, QPushButton, QToolButton, QVBoxLayout

from ...conversations import Message
from ...engine.plaincheck import Outcome, PlainCheck
from ...protocol import CheckPlain, PlainChecked
from .richtext import plain_label

CHECK_LINK = "Check against plain decoding"
# The bar's colours by what the check found: green for the same tokens, amber where they part.
LOOKS = {
    None: "background: #eef1f5; border: 1px solid #c9d1dc;",
    Outcome.IDENTICAL: "background: #e7f6ea; border: 1px solid #8cc79a;",
    Outcome.DIFFERS: "background: #fff4e0; border: 1px solid #e0b060;",
    Outcome.CANCELLED: "background: #eef1f5; border: 1px solid #c9d1dc;",
}


def answer_tokens(message: Message) -> list[int]:
    """The token ids an answer was written as, from its cycle records (a Continue's included)."""
    return [t for record in message.cycles for t in record.get("emitted", []) if type(t) is int]


def checkable(message: Message) -> bool:
    """An answer the check can decode again: one generation's tokens (not a summary in parts)."""
    return (message.role == "assistant" and not any("stage" in record for record in message.cycles)
            and bool(answer_tokens(message)))


class PlainCheckBar(QFrame):
    """Under the transcript while a check runs and after: progress and Cancel, then the result."""

    def __init__(self, parent=None):
        super().__init__(parent, objectName="plainCheck")
        self.label = plain_label(objectName="plainCheckResult", wordWrap=True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)  # ids and logits to copy
        self.progress = QProgressBar(objectName="plainCheckProgress", textVisible=True)
        self.cancel_button = QPushButton("Cancel", objectName="plainCheckCancel",
                                         toolTip="Stop the check after this token (Esc)")
        self.close_button = QToolButton(text="✕", toolTip="Dismiss")
        self.close_button.clicked.connect(self.hide)
        row = QHBoxLayout()
        row.addWidget(self.progress, 1)
        row.addWidget(self.cancel_button)
        top = QHBoxLayout()
        top.addWidget(self.label, 1)
        top.addWidget(self.close_button, 0, Qt.AlignTop)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        layout.addLayout(top)
        layout.addLayout(row)
        self._look(None)
        self.hide()

    def _look(self, outcome: Outcome | None) -> None:
        self.setStyleSheet(f"QFrame#plainCheck {{ {LOOKS[outcome]} border-radius: 6px; }}")

    def begin(self, answer: str, total: int) -> None:
        self._look(None)
        self.label.setText(f"{answer}: decoding its prompt plainly, one token at a time…")
        self.progress.setRange(0, total)
        self.progress.setValue(0)
        self.progress.setFormat(f"0 / {total:,} tokens")
        self.progress.show()
        self.cancel_button.setEnabled(True)
        self.cancel_button.show()
        self.close_button.hide()
        self.show()

    def show_progress(self, checked: int, total: int) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(checked)
        self.progress.setFormat(f"{checked:,} / {total:,} tokens")

    def cancelling(self) -> None:
        self.cancel_button.setEnabled(False)
        self.progress.setFormat(self.progress.format() + " · cancelling…")

    def show_ended(self, text: str, outcome: Outcome) -> None:
        self._look(outcome)
        self.label.setText(text)
        self.progress.hide()
        self.cancel_button.hide()
        self.close_button.show()
        self.show()

    def text(self) -> str:
        return self.label.text() if self.isVisible() else ""


class PlainChecking(QObject):
    """The window's checks against plain decoding, one at a time, in its engine process. The bar
    belongs to the conversation whose answer was checked: another conversation opened hides it,
    and going back shows its check again (running, or its result until dismissed)."""

    finished = Signal()  # a check ended and its result (or why it could not run) is shown

    def __init__(self, window):
        super().__init__(window)
        self.w = window
        self.bar = PlainCheckBar()
        chat = window.chat
        chat.layout().insertWidget(chat.layout().indexOf(chat.prompt_progress), self.bar)
        self.busy = False
        self._answer = ""  # the answer being checked, in words ("Answer 2")
        self._conversation: str | None = None  # whose answer is being checked
        self._ended: dict[str, tuple[str, Outcome]] = {}  # a conversation's last result, until dismissed
        self.last: PlainCheck | None = None  # the last check's result (None: none ended, or it could not run)
        self.bar.cancel_button.clicked.connect(self.cancel)
        self.bar.close_button.clicked.connect(self._dismissed)
        worker = window.engine.worker
        worker.plainCheckProgress.connect(self.bar.show_progress)
        worker.plainChecked.connect(self._on_checked)
        worker.plainCheckFailed.connect(self._on_failed)
        worker.died.connect(lambda _death: self._on_failed("The engine stopped during the check."))

    def check(self, index: int) -> None:
        """The transcript's link on answer ``index`` of the open conversation."""
        w, conv = self.w, self.w.current
        if conv is None or not 0 <= index < len(conv.messages) or not checkable(conv.messages[index]):
            return
        if self.busy or w.generating:
            w.show_error("Wait for the answer being written (or the check running) to end, or stop it.")
            return
        if not w.loaded:
            w.show_error("Load the model that wrote the answer to check it against plain decoding.")
            return
        tokens = answer_tokens(conv.messages[index])
        number = sum(m.role == "assistant" for m in conv.messages[:index + 1])
        self._answer = f"Answer {number}"
        self._conversation = conv.id
        self._ended.pop(conv.id, None)
        self.busy = True
        w.update_controls()
        self.bar.begin(self._answer, len(tokens))
        w.engine.check_plain(CheckPlain(conv.id, index, conv.history(before=index), tokens))

    def cancel(self) -> None:
        if self.busy:
            self.w.engine.stop()
            self.bar.cancelling()

    def show_for(self, conversation_id: str | None) -> None:
        """The bar as conversation ``conversation_id`` left it: its check running, its last result, or none."""
        if self.busy:
            self.bar.setVisible(conversation_id == self._conversation)
        elif conversation_id in self._ended:
            self.bar.show_ended(*self._ended[conversation_id])
        else:
            self.bar.hide()

    def _on_checked(self, event: PlainChecked) -> None:
        self.last = event.result
        self._end(f"{self._answer}: {event.result.words()}", event.result.outcome)

    def _on_failed(self, message: str) -> None:
        if self.busy:
            self.last = None
            self._end(f"{self._answer}: the check could not run. {message}", Outcome.CANCELLED)

    def _end(self, text: str, outcome: Outcome) -> None:
        self.busy = False
        self._ended[self._conversation] = (text, outcome)
        self.w.update_controls()
        current = self.w.current
        self.show_for(current.id if current is not None else None)
        self.finished.emit()

    def _dismissed(self) -> None:
        current = self.w.current
        if current is not None:
            self._ended.pop(current.id, None)
