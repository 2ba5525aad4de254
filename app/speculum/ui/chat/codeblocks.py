"""Code blocks in the transcript, as an editor shows code: each line kept whole (a wrapped line
started again at column 0 and broke Python's indentation), a long one scrolling sideways inside
its own block (the whole transcript scrolled sideways, prose and all), and a head line over
each block naming its language, with a Copy button at its right that says "Copied".

The text view cannot hold widgets, so a code block is one object character in the document
(``CODE_OBJECT``) that carries the code as written and takes the block's room; over each one in
sight a ``CodeBlockView`` (a read-only, unwrapped plain-text editor under its head line) is laid
as a child of the view's viewport. The code is model output: it is only ever set as plain text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QMimeData, QObject, QPoint, QPointF, QRectF, QSizeF, Qt, QTimer
from PySide6.QtGui import (QColor, QFont, QFontDatabase, QFontMetricsF, QGuiApplication, QPainter, QPyTextObject,
                           QTextBlock, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat)
from PySide6.QtWidgets import (QApplication, QFrame, QHBoxLayout, QPlainTextEdit, QScrollBar, QTextEdit, QToolButton,
                               QVBoxLayout, QWidget)

from .richtext import plain_label

CODE_BACKGROUND = QColor("#f2f4f7")
HEAD_BACKGROUND = QColor("#e4e7ec")
HEAD_TEXT = QColor("#4b5563")
CODE_OBJECT = QTextFormat.UserObject + 1  # a code block: one object character in the transcript
CODE = QTextFormat.UserProperty + 1  # its code, as written (what its Copy button copies)
LANGUAGE = QTextFormat.UserProperty + 2  # the language the model named after the fence, or "code"
OBJECT_CHARACTER = "\ufffc"
COPIED_MS = 1500  # how long a Copy button says "Copied"
PAD = 4  # pixels around the code, inside its block
TAB = 4  # spaces a tab stands for


def _all_fixed_pitch(block: QTextBlock) -> bool:
    """Every character of ``block`` in the monospace font the Markdown reader gives code."""
    it = block.begin()
    found = False
    while not it.atEnd():
        frag = it.fragment()
        if frag.text().strip():
            fmt = frag.charFormat()
            if not (fmt.fontFixedPitch() or "monospace" in (fmt.fontFamilies() or [])):
                return False
            found = True
        it += 1
    return found


def _is_code(block: QTextBlock) -> bool:
    fmt = block.blockFormat()
    return fmt.hasProperty(QTextFormat.BlockCodeFence) or fmt.hasProperty(QTextFormat.BlockCodeLanguage)


def code_format(block: QTextBlock) -> QTextCharFormat | None:
    """The format of the code object that is ``block``'s only character; None for any other block."""
    if block.length() != 2:  # the object character and the block's end
        return None
    fmt = block.begin().fragment().charFormat()
    return fmt if fmt.objectType() == CODE_OBJECT else None


def code_blocks_in(document: QTextDocument) -> list[tuple[str, str]]:
    """Each code block of the document, in order: (its code, its language)."""
    found, block = [], document.begin()
    while block.isValid():
        fmt = code_format(block)
        if fmt is not None:
            found.append((fmt.stringProperty(CODE), fmt.stringProperty(LANGUAGE)))
        block = block.next()
    return found


def style_code(document: QTextDocument, start: int, end: int, opening: str | None) -> None:
    """Between ``start`` and ``end`` (Markdown inserted at ``start``): each run of code lines the
    Markdown reader made becomes one code object holding the lines as written; inline code is set
    monospaced on the code colour. ``opening``: the language of the code block the Markdown opens
    with (``richtext.opening_code``), whose first line merged into the block at ``start``."""
    mono = QFontDatabase.systemFont(QFontDatabase.FixedFont)
    runs: list[list[QTextBlock]] = []
    block, in_code = document.findBlock(start), False
    if opening is not None and not _all_fixed_pitch(block):
        opening = None  # an empty fence makes no block at all
    if opening is not None:
        runs.append([block])
        block, in_code = block.next(), True
    while block.isValid() and block.position() <= end:
        code = _is_code(block)
        if code:
            if in_code:
                runs[-1].append(block)
            else:
                runs.append([block])
        else:
            _inline_code(document, block, mono)
        in_code = code
        block = block.next()
    for i, run in reversed(list(enumerate(runs))):  # from the end: the positions before stay as they were
        _to_object(run, opening if i == 0 and opening is not None else "")


def _inline_code(document: QTextDocument, block: QTextBlock, mono: QFont) -> None:
    it = block.begin()
    while not it.atEnd():
        frag = it.fragment()
        if frag.charFormat().fontFixedPitch():
            cursor = QTextCursor(document)
            cursor.setPosition(frag.position())
            cursor.setPosition(frag.position() + frag.length(), QTextCursor.KeepAnchor)
            char = QTextCharFormat()
            char.setFontFamilies([mono.family()])
            char.setBackground(CODE_BACKGROUND)
            cursor.mergeCharFormat(char)
        it += 1


def _to_object(run: list[QTextBlock], named: str) -> None:
    """Replace the lines of one code block with its object. The language is the fence's first
    word (``named``: read from the Markdown, where the fence's block format was lost)."""
    language = named or run[0].blockFormat().stringProperty(QTextFormat.BlockCodeLanguage).strip()
    code = "\n".join(b.text() for b in run)
    cursor = QTextCursor(run[0])
    cursor.setPosition(run[-1].position() + run[-1].length() - 1, QTextCursor.KeepAnchor)
    cursor.removeSelectedText()
    place = QTextBlockFormat()
    place.setTopMargin(6)
    place.setBottomMargin(4)
    cursor.setBlockFormat(place)
    fmt = QTextCharFormat()
    fmt.setObjectType(CODE_OBJECT)
    fmt.setProperty(CODE, code)
    fmt.setProperty(LANGUAGE, (language or "code")[:40])
    cursor.insertText(OBJECT_CHARACTER, fmt)


def text_with_code(document: QTextDocument, start: int = 0, end: int | None = None) -> str:
    """The document's text from ``start`` to ``end``, each code object as the code it holds."""
    end = document.characterCount() - 1 if end is None else end
    lines, block = [], document.findBlock(start)
    while block.isValid() and block.position() <= end:
        fmt = code_format(block)
        if fmt is not None:
            lines.append(fmt.stringProperty(CODE))
        else:
            lo, hi = max(start, block.position()), min(end, block.position() + block.length() - 1)
            lines.append(block.text()[lo - block.position():hi - block.position()])
        block = block.next()
    return "\n".join(lines).replace("\u2028", "\n").replace("\u00a0", " ")  # as QTextDocument.toPlainText


_WIDTHS: dict[tuple[str, str], float] = {}


@dataclass(frozen=True)
class CodeMetrics:
    """The sizes of a code block, from the fonts and widgets that show it: one place for the room
    the document keeps and the size of the editor laid over it."""
    font: QFont  # the code's
    line: int  # one line's height in the editor (its layout rounds up)
    head: int  # the head line's height: the Copy button's, and a little
    bar: int  # a horizontal scroll bar's height
    space: float  # a space's width (tabs stand for TAB of them)

    @classmethod
    def of(cls, base: QFont) -> CodeMetrics:
        font = QFont(base)
        font.setFamilies([QFontDatabase.systemFont(QFontDatabase.FixedFont).family()])
        font.setFixedPitch(True)
        fm = QFontMetricsF(font)
        button = copy_button()
        button.ensurePolished()  # its style sheet's font and padding
        return cls(font, math.ceil(fm.height()), button.sizeHint().height() + 4,
                   QScrollBar(Qt.Horizontal).sizeHint().height(), fm.horizontalAdvance(" "))

    def code_width(self, code: str) -> float:
        """The longest line's width (the layout asks for a block's size many times: remembered)."""
        width = _WIDTHS.get((code, self.font.key()))
        if width is None:
            fm = QFontMetricsF(self.font)
            width = max((fm.horizontalAdvance(line.expandtabs(TAB)) for line in code.split("\n")), default=0.0)
            if len(_WIDTHS) > 512:  # a live answer's growing block leaves one entry per frame
                _WIDTHS.clear()
            _WIDTHS[(code, self.font.key())] = width
        return width

    def scrolls(self, code: str, width: float) -> bool:
        return self.code_width(code) + 2 * PAD > width

    def size(self, code: str, width: float) -> QSizeF:
        """The block's size at ``width``: its head, every line (the editor shows n lines in n
        lines' height and its margins, and a pixel), and a scroll bar under a line too long."""
        lines = code.count("\n") + 1
        bar = self.bar if self.scrolls(code, width) else 0
        return QSizeF(width, self.head + lines * self.line + 2 * PAD + 1 + bar)


def copy_button(parent: QWidget | None = None) -> QToolButton:
    return QToolButton(parent, text="Copy", objectName="codeCopy", toolTip="Copy this code block",
                       cursor=Qt.PointingHandCursor)


class CodeObjects(QPyTextObject):
    """The document layout's handler of code objects: the room each takes (the view's width, its
    lines' height), and a plain picture of the block where no editor lies over it. (PySide's own
    base: one made of QObject and QTextObjectInterface is not taken by the layout, whose cast to
    the interface fails, and the objects took no room.)"""

    def __init__(self, view: QTextEdit):
        super().__init__(view)
        self.view = view
        self._metrics: CodeMetrics | None = None

    @property
    def metrics(self) -> CodeMetrics:
        if self._metrics is None:
            self._metrics = CodeMetrics.of(self.view.document().defaultFont())
        return self._metrics

    def width(self, document: QTextDocument) -> float:
        """The room a line of the transcript has (a wider object would make the transcript scroll
        sideways)."""
        text_width = document.textWidth() if document.textWidth() > 0 else self.view.viewport().width()
        return max(text_width - 2 * document.documentMargin() - 2, 80.0)

    def intrinsicSize(self, document, position, fmt) -> QSizeF:  # noqa: N802 - Qt's name
        return self.metrics.size(fmt.stringProperty(CODE), self.width(document))

    def drawObject(self, painter: QPainter, rect: QRectF, document, position, fmt) -> None:  # noqa: N802
        m = self.metrics
        painter.save()
        painter.setClipRect(rect)
        painter.fillRect(rect, CODE_BACKGROUND)
        head = QRectF(rect.left(), rect.top(), rect.width(), m.head)
        painter.fillRect(head, HEAD_BACKGROUND)
        painter.setPen(HEAD_TEXT)
        painter.drawText(head.adjusted(6, 0, 0, 0), Qt.AlignLeft | Qt.AlignVCenter, fmt.stringProperty(LANGUAGE))
        painter.setPen(self.view.palette().text().color())
        painter.setFont(m.font)
        ascent = QFontMetricsF(m.font).ascent()
        for i, line in enumerate(fmt.stringProperty(CODE).split("\n")):
            painter.drawText(QPointF(rect.left() + PAD, rect.top() + m.head + PAD + i * m.line + ascent),
                             line.expandtabs(TAB))
        painter.restore()


class CodeEditor(QPlainTextEdit):
    """A code block's lines: read-only, unwrapped, scrolled sideways by its own bar (or a sideways
    wheel, or Shift and the wheel); an up-and-down wheel scrolls the transcript around it."""

    def __init__(self, metrics: CodeMetrics, outer: QScrollBar, parent=None):
        super().__init__(parent, objectName="codeEditor")
        self.outer = outer  # the transcript's own vertical bar
        self.setReadOnly(True)
        self.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.TextSelectableByKeyboard)
        self.setLineWrapMode(QPlainTextEdit.NoWrap)
        self.setFrameShape(QFrame.NoFrame)
        self.setFocusPolicy(Qt.ClickFocus)  # the Tab stops are the Copy buttons
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)  # its block is as tall as its lines
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAsNeeded)
        self.setFont(metrics.font)
        self.setTabStopDistance(TAB * metrics.space)
        self.document().setDocumentMargin(PAD)
        self.setStyleSheet(f"QPlainTextEdit#codeEditor {{ background: {CODE_BACKGROUND.name()}; border: none; }}")

    def wheelEvent(self, event) -> None:
        delta = event.angleDelta()
        sideways = abs(delta.x()) > abs(delta.y()) or event.modifiers() & Qt.ShiftModifier
        bar = self.horizontalScrollBar()
        if not sideways or not bar.maximum():
            QApplication.sendEvent(self.outer, event)  # (ignored, it went no further than this block)
            return
        steps = (delta.x() or delta.y()) / 120
        bar.setValue(bar.value() - round(steps * 3 * bar.singleStep()))
        event.accept()


class CodeBlockView(QFrame):
    """Laid over a code object: the head line (its language and Copy) and the code in an editor."""

    def __init__(self, metrics: CodeMetrics, outer: QScrollBar, parent: QWidget):
        super().__init__(parent, objectName="codeBlock")
        self.setAutoFillBackground(True)
        self.code = ""
        self.language = plain_label(objectName="codeLanguage")  # model output: never rich text
        self.copy_button = copy_button(self)
        self.copy_button.clicked.connect(self.copy)
        self.editor = CodeEditor(metrics, outer, self)
        head = QWidget(self, objectName="codeHead")
        head.setFixedHeight(metrics.head)
        head.setAutoFillBackground(True)
        palette = head.palette()
        palette.setColor(head.backgroundRole(), HEAD_BACKGROUND)
        palette.setColor(head.foregroundRole(), HEAD_TEXT)
        head.setPalette(palette)
        row = QHBoxLayout(head)
        row.setContentsMargins(6, 0, 2, 0)
        row.addWidget(self.language, 1)
        row.addWidget(self.copy_button)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(head)
        column.addWidget(self.editor, 1)

    def show_code(self, code: str, language: str, fresh: bool = False) -> None:
        """``fresh``: laid over a block it did not show before (a block being written keeps its place)."""
        if code != self.code or fresh:
            other = fresh or not code.startswith(self.code)  # not this block, grown by a few tokens
            self.code = code
            self.editor.setPlainText(code)
            if other:
                self.copy_button.setText("Copy")
                self.editor.horizontalScrollBar().setValue(0)
        self.language.setText(language)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code)
        self.copy_button.setText("Copied")
        QTimer.singleShot(COPIED_MS, self.copy_button, lambda: self.copy_button.setText("Copy"))


class CodeBlocks(QObject):
    """The code blocks of a text view: the handler of their objects, and an editor over each one
    in sight, placed whenever the view scrolls, resizes or lays out anew. Each editor keeps its
    block (by the object's place in the document), so a block keeps how far it was scrolled."""

    def __init__(self, view: QTextEdit):
        super().__init__(view)
        self.view = view
        self.objects = CodeObjects(view)
        view.document().documentLayout().registerHandler(CODE_OBJECT, self.objects)
        self.views: dict[int, CodeBlockView] = {}  # by the object's position, those in sight
        self._spare: list[CodeBlockView] = []
        self._placing = QTimer(self, singleShot=True, interval=0, timeout=self.place)
        view.verticalScrollBar().valueChanged.connect(self._placing.start)
        view.document().documentLayout().documentSizeChanged.connect(self._placing.start)
        view.document().contentsChanged.connect(self._placing.start)
        view.viewport().installEventFilter(self)

    @property
    def shown(self) -> list[CodeBlockView]:
        """The editors in sight, top to bottom."""
        return [self.views[p] for p in sorted(self.views)]

    @property
    def copy_buttons(self) -> list[QToolButton]:
        return [v.copy_button for v in self.shown]

    def eventFilter(self, watched, event) -> bool:
        if event.type() in (QEvent.Resize, QEvent.Show):
            self._placing.start()
        return False

    def objects_in_sight(self) -> list[tuple[QTextBlock, QTextCharFormat]]:
        """Only the blocks in sight are looked at: a long conversation costs no more than a short one."""
        view, layout = self.view, self.view.document().documentLayout()
        height, offset = view.viewport().height(), view.verticalScrollBar().value()
        block = view.cursorForPosition(QPoint(0, 0)).block()
        found = []
        while block.isValid() and layout.blockBoundingRect(block).top() - offset <= height:
            fmt = code_format(block)
            if fmt is not None:
                found.append((block, fmt))
            block = block.next()
        return found

    def object_rect(self, block: QTextBlock, fmt: QTextCharFormat) -> QRectF | None:
        """Where the object lies in the document: drawn on its line's baseline, at the line's start;
        None before its block is laid out."""
        layout = block.layout()
        if layout.lineCount() == 0:
            return None
        line = layout.lineAt(0)
        size = self.objects.intrinsicSize(self.view.document(), block.position(), fmt)
        top_left = layout.position() + QPointF(line.x(), line.y() + line.ascent() - size.height())
        return QRectF(top_left, size)

    def place(self) -> None:
        seen = self.objects_in_sight() if self.view.isVisible() else []
        wanted = {block.position() for block, _ in seen}
        for position in [p for p in self.views if p not in wanted]:
            spare = self.views.pop(position)
            spare.hide()
            self._spare.append(spare)
        dx, dy = self.view.horizontalScrollBar().value(), self.view.verticalScrollBar().value()
        for block, fmt in seen:
            rect = self.object_rect(block, fmt)
            if rect is None:
                continue
            view = self.views.get(block.position())
            fresh = view is None
            if fresh:
                view = self._spare.pop() if self._spare else CodeBlockView(
                    self.objects.metrics, self.view.verticalScrollBar(), self.view.viewport())
                self.views[block.position()] = view
            view.show_code(fmt.stringProperty(CODE), fmt.stringProperty(LANGUAGE), fresh)
            view.setGeometry(rect.translated(-dx, -dy).toAlignedRect())
            view.show()
        # Tab stops right after the transcript, top to bottom (made later, they came last).
        previous = self.view
        for button in self.copy_buttons:
            QWidget.setTabOrder(previous, button)
            previous = button


def selection_as_text(view: QTextEdit) -> QMimeData:
    """What a copy of the view's selection holds: its text, each code block as its code."""
    cursor = view.textCursor()
    data = QMimeData()
    data.setText(text_with_code(view.document(), cursor.selectionStart(), cursor.selectionEnd()))
    return data
