"""Small helpers for the QTextDocuments that grow while generating."""

from __future__ import annotations

from PySide6.QtGui import QTextCursor, QTextDocument


def end_cursor(document: QTextDocument) -> QTextCursor:
    """A cursor at the end of ``document``.

    ``setPosition``, not ``movePosition(End)``: moving first lays out the block the new
    cursor starts in (the whole first paragraph), a cost paid again at every frame.
    """
    cursor = QTextCursor(document)
    cursor.setPosition(document.characterCount() - 1)
    return cursor
