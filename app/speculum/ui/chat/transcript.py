"""The chat transcript: the user's turns as typed, the answers rendered as Markdown."""

from __future__ import annotations

import html

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QColor, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextOption
from PySide6.QtWidgets import QTextBrowser

from ...engine.vocabulary import Finish
from ..look import MODE_NAMES
from ..opaque import OpaqueScrollArea
from .codeblocks import CodeBlocks, selection_as_text, style_code, text_with_code
from .plaincheck import CHECK_LINK, checkable
from .richtext import RefusingResources, markdown_fragment, opening_code


FINISH_NOTES = {
    Finish.STOPPED: "stopped",
    Finish.CONTEXT_FULL: "context full",
}


def settled_length(markdown: str) -> int:
    """How much of a growing Markdown text is final: up to its last blank line outside a code fence."""
    end = pos = 0
    in_fence = False
    for line in markdown.splitlines(keepends=True):
        pos += len(line)
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not stripped and not in_fence and line.endswith("\n"):
            end = pos
    return end


def replay_index(url: QUrl, scheme: str = "replay") -> int | None:
    """The message a ``replay:N`` (or ``continue:N``) link points at; None for any other link
    (answers hold links too)."""
    if url.scheme() != scheme:
        return None
    number = url.path() or url.host()
    return int(number) if number.isascii() and number.isdigit() and len(number) < 10 else None


WRITING = "writing…"  # the live answer's header while it is written


class Transcript(OpaqueScrollArea, RefusingResources, QTextBrowser):
    replayRequested = Signal(int)  # index of an assistant message in the conversation
    continueRequested = Signal(int)  # index of an answer stopped at the user's token limit
    checkRequested = Signal(int)  # index of an answer to check against plain decoding

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("transcript")
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._anchor)
        self.setPlaceholderText("Write a message below, or open a document and press Summarise.")
        self._answer_from: int | None = None
        self._status = ""
        self._settled_text = ""  # the live answer's head already rendered, ending at _settled_at
        self._settled_at = 0
        self.setWordWrapMode(QTextOption.WrapAtWordBoundaryOrAnywhere)  # a long identifier wraps too (not code)
        self.code_blocks = CodeBlocks(self)  # each scrolls sideways on its own, with its Copy button

    def _anchor(self, url: QUrl) -> None:
        for scheme, signal in (("replay", self.replayRequested), ("continue", self.continueRequested),
                               ("check", self.checkRequested)):
            index = replay_index(url, scheme)
            if index is not None:
                signal.emit(index)

    # -- building blocks --

    def _cursor(self) -> QTextCursor:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.End)
        return cursor

    def _new_block(self, cursor: QTextCursor, top_margin: float = 14) -> None:
        fmt = QTextBlockFormat()
        fmt.setTopMargin(top_margin)
        if self.document().isEmpty():
            cursor.setBlockFormat(fmt)
        else:
            cursor.insertBlock(fmt, QTextCharFormat())

    def _header(self, cursor: QTextCursor, who: str, details: str = "", link: str = "") -> None:
        self._new_block(cursor)
        colour = "#1d3f9e" if who == "You" else "#0b5d1e"
        extra = f" <span style='color:#6b7280'>· {html.escape(details)}</span>" if details else ""
        if link:
            extra += f" <span style='color:#6b7280'>·</span> {link}"
        cursor.insertHtml(f"<span style='color:{colour}; font-weight:600'>{who}</span>{extra}")

    def _markdown(self, cursor: QTextCursor, text: str) -> None:
        self._new_block(cursor, 4)
        start = cursor.position()
        cursor.insertFragment(markdown_fragment(text or " "))  # no raw HTML, no images: see richtext
        # One object per code block, an editor laid over it.
        style_code(self.document(), start, cursor.position(), opening_code(text))
        cursor.movePosition(QTextCursor.End)

    # -- whole conversation --

    def show_messages(self, messages) -> None:
        """Render a conversation (speculum.conversations.Message list)."""
        self.clear()
        self._answer_from = None
        cursor = self._cursor()
        for i, m in enumerate(messages):
            if m.role == "user":
                self._header(cursor, "You")
                self._markdown(cursor, m.shown)  # what the user writes reads as what the model does
            else:
                details = [MODE_NAMES.get(m.mode, m.mode)] if m.mode else []
                if m.stats.get("tokens_per_s"):
                    details.append(f"{m.stats['tokens_per_s']:.1f} tok/s")
                if m.finish in FINISH_NOTES:
                    details.append(FINISH_NOTES[m.finish])
                # An answer stopped before its first token has one empty cycle: nothing to replay.
                link = f"<a href='replay:{i}'>Replay</a>" if m.cycles and m.stats.get("tokens", 1) else ""
                if checkable(m):
                    link += (" <span style='color:#6b7280'>·</span> " if link else "") + \
                        f"<a href='check:{i}'>{CHECK_LINK}</a>"
                self._header(cursor, "Assistant", " · ".join(details), link)
                if not m.unwritten:  # (one stopped while its prompt was read is only its note)
                    self._markdown(cursor, m.shown)
                if m.note:
                    self._note(cursor, m.note)
                if m.finish == Finish.MAX_TOKENS:
                    self._limit_reached(cursor, m.stats.get("tokens", 0), i if i == len(messages) - 1 else None)
        self._follow()

    def _note(self, cursor: QTextCursor, note: str) -> None:
        self._new_block(cursor, 2)
        fmt = QTextCharFormat()
        fmt.setForeground(QColor("#8a5a00"))
        fmt.setFontItalic(True)
        cursor.insertText(note, fmt)

    def _limit_reached(self, cursor: QTextCursor, tokens: int, index: int | None) -> None:
        """An answer cut by the user's token limit says so, and the last one offers to write on."""
        self._new_block(cursor, 4)
        more = f" — <a href='continue:{index}'>Continue</a>" if index is not None else ""
        cursor.insertHtml(f"<span style='color:#8a5a00; font-weight:600'>Stopped at {tokens:,} tokens</span>{more}")

    # -- the answer being written --

    def begin_answer(self, header: str = WRITING) -> None:
        cursor = self._cursor()
        self._header(cursor, "Assistant", header)
        self._answer_from = cursor.position()
        self._settled_text, self._settled_at = "", self._answer_from
        self._status = header  # the header ends with it, right before the answer
        self._follow()

    def set_answer_status(self, status: str) -> None:
        """Change the live answer's header ("reading the prompt…", then "writing…") while none
        of the answer is settled (what is shown after the header moves with it)."""
        if self._answer_from is None or self._settled_at != self._answer_from or status == self._status:
            return
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._answer_from - len(self._status))
        cursor.setPosition(self._answer_from, QTextCursor.KeepAnchor)
        fmt = cursor.charFormat()
        cursor.insertText(status, fmt)
        self._answer_from = self._settled_at = cursor.position()
        self._status = status

    def update_answer(self, text: str) -> None:
        """Show the answer so far. Only what changed since the last call is rendered: the head up
        to the last blank line outside a code fence stays as it was (later tokens cannot change
        how it reads), so a long answer costs no more per update than a short one."""
        if self._answer_from is None:
            self.begin_answer()
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        if not text.startswith(self._settled_text):  # a new answer, or a rewritten one
            self._settled_text, self._settled_at = "", self._answer_from
        cursor = self._cursor()
        cursor.setPosition(self._settled_at, QTextCursor.KeepAnchor)
        cursor.removeSelectedText()
        settled = settled_length(text)
        if settled > len(self._settled_text):
            self._markdown(cursor, text[len(self._settled_text):settled])
            self._settled_text, self._settled_at = text[:settled], cursor.position()
        if text[settled:] or not settled:
            self._markdown(cursor, text[settled:])
        if at_bottom:
            self._follow()

    def answer_text(self) -> str:
        if self._answer_from is None:
            return ""
        return text_with_code(self.document(), self._answer_from).strip()

    def toPlainText(self) -> str:  # noqa: N802 - Qt's name
        """The transcript as text, each code block as its code (in the document it is one object)."""
        return text_with_code(self.document())

    def createMimeDataFromSelection(self):  # noqa: N802 - Qt's name: a copied selection holds the code too
        return selection_as_text(self)

    def _follow(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
