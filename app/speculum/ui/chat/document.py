"""The document pane: paste text, or drop/open a file; Summarise; the copied spans highlighted."""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QObject, QStandardPaths, Qt, Signal
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QTextEdit,
                               QVBoxLayout, QWidget)

from ...documents import SUPPORTED, read_document
from ...errors import SpeculumError

COPIED = QColor("#c9f2d0")


class _Reading(QObject):
    """Carries one file's text (or why not) from its reading thread back to the UI thread."""

    done = Signal(int, str, str, str)  # request number, file name, text, error message


def _read(number: int, path: Path, reading: _Reading) -> None:
    try:
        text, error = read_document(path), ""
    except SpeculumError as exc:
        text, error = "", str(exc)
    except Exception as exc:  # noqa: BLE001 - a message in the window, never a lost thread
        text, error = "", f"Could not read {path.name}: {exc}"
    try:
        reading.done.emit(number, path.name, text, error)
    except RuntimeError:
        pass  # the window closed while the file was read


class DocumentPane(QWidget):
    summariseRequested = Signal()
    error = Signal(str)
    documentOpened = Signal(str)  # the file's name, once its text is in the pane

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("documentPane")
        self.setAcceptDrops(True)
        self.name = ""
        self._requests = 0  # files asked for; only the latest one's text is shown
        self._last_folder: Path | None = None  # where the last document came from
        self._reading = _Reading()
        self._reading.done.connect(self._on_read)
        self.open_button = QPushButton("Open…")
        self.open_button.setToolTip("Open a .txt, .md, .html or .pdf file (or drop one here)")
        self.summarise_button = QPushButton("Summarise")
        self.summarise_button.setObjectName("summariseButton")
        self.summarise_button.setToolTip("Summarise this document; Auto mode drafts from it by prompt lookup")
        self.clear_button = QPushButton("Clear")
        self.title = QLabel("Document", textFormat=Qt.PlainText)  # shows the file's name
        self.title.setObjectName("paneTitle")
        self.progress = QLabel("", textFormat=Qt.PlainText)
        self.progress.setObjectName("progressLabel")
        self.editor = QPlainTextEdit()
        self.editor.setObjectName("documentText")
        self.editor.setPlaceholderText("Paste a document here, or drop a .txt, .md, .html or .pdf file.\n\n"
                                       "Spans the answer copied from it by prompt lookup are highlighted in green.")
        self.caption = QLabel("")
        self.caption.setObjectName("caption")
        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.open_button)
        top.addWidget(self.clear_button)
        top.addWidget(self.summarise_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.progress)
        layout.addWidget(self.editor, 1)
        layout.addWidget(self.caption)
        self.progress.hide()
        self.open_button.clicked.connect(self.choose_file)
        self.clear_button.clicked.connect(lambda: self.set_document("", ""))
        self.summarise_button.clicked.connect(self.summariseRequested)
        self.editor.textChanged.connect(self._changed)

    # -- content --

    def text(self) -> str:
        return self.editor.toPlainText()

    def set_document(self, text: str, name: str = "") -> None:
        self.name = name
        self.editor.setPlainText(text)
        self.editor.moveCursor(QTextCursor.Start)
        self.title.setText(f"Document · {name}" if name else "Document")

    def _changed(self) -> None:
        self.editor.setExtraSelections([])
        words = len(self.text().split())
        self.caption.setText(f"{words:,} words" if words else "")

    def open_path(self, path: str | Path) -> None:
        """Read a file in the background (a large PDF takes seconds); ``documentOpened`` or
        ``error`` follows."""
        path = Path(path)
        self._last_folder = path.parent
        self._requests += 1
        self.show_progress(f"Reading {path.name}…")
        threading.Thread(target=_read, args=(self._requests, path, self._reading), daemon=True,
                         name="document-reader").start()

    def _on_read(self, number: int, name: str, text: str, error: str) -> None:
        if number != self._requests:
            return  # another file was asked for since
        self.show_progress("")
        if error:
            self.error.emit(error)
            return
        self.set_document(text, name)
        self.documentOpened.emit(name)

    def start_folder(self) -> str:
        """Where Open… starts: the last document's folder, else the user's documents (it started in
        whatever folder the app was launched from)."""
        if self._last_folder is not None and self._last_folder.is_dir():
            return str(self._last_folder)
        return QStandardPaths.writableLocation(QStandardPaths.DocumentsLocation) or str(Path.home())

    def choose_file(self) -> None:
        patterns = " ".join(f"*{s}" for s in SUPPORTED)
        path, _ = QFileDialog.getOpenFileName(self, "Open a document", self.start_folder(), f"Documents ({patterns})")
        if path:
            self.open_path(path)

    def dragEnterEvent(self, event) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:
        for url in event.mimeData().urls():
            if url.isLocalFile():
                self.open_path(url.toLocalFile())
                event.acceptProposedAction()
                return

    # -- what the answer copied --

    def highlight(self, spans: list[tuple[int, int]]) -> None:
        fmt = QTextCharFormat()
        fmt.setBackground(COPIED)
        selections = []
        for start, end in spans:
            sel = QTextEdit.ExtraSelection()
            sel.cursor = QTextCursor(self.editor.document())
            sel.cursor.setPosition(start)
            sel.cursor.setPosition(end, QTextCursor.KeepAnchor)
            sel.format = fmt
            selections.append(sel)
        self.editor.setExtraSelections(selections)
        copied = sum(e - s for s, e in spans)
        words = len(self.text().split())
        if spans:
            self.caption.setText(f"{words:,} words · {len(spans)} spans ({copied:,} characters) copied "
                                 "into the answer by accepted lookup drafts")
        else:
            self.caption.setText(f"{words:,} words")

    def highlighted(self) -> list[str]:
        return [sel.cursor.selectedText() for sel in self.editor.extraSelections()]

    def show_progress(self, text: str) -> None:
        self.progress.setText(text)
        self.progress.setVisible(bool(text))
