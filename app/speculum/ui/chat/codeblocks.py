"""Code blocks in the transcript, as an editor shows code: each line kept whole (a wrapped line
started again at column 0 and broke Python's indentation), the transcript scrolling sideways
for a long one, and a head line over each block with a Copy button at its right that says
"Copied".

The text view cannot hold widgets, so the buttons are children of its viewport, placed over
the head lines in sight whenever the view scrolls, resizes or lays out anew. What a block
copies is read from the document at the click: the model's text, never markup.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QPoint, Qt, QTimer
from PySide6.QtGui import (QColor, QFontDatabase, QGuiApplication, QTextBlock, QTextBlockFormat, QTextCharFormat,
                           QTextCursor, QTextDocument, QTextFormat)
from PySide6.QtWidgets import QTextEdit, QToolButton, QWidget

CODE_BACKGROUND = QColor("#f2f4f7")
HEAD_BACKGROUND = QColor("#e4e7ec")
HEAD_TEXT = QColor("#4b5563")
CODE = QTextFormat.UserProperty + 1  # a code block's lines (what its Copy button copies)
CODE_HEAD = QTextFormat.UserProperty + 2  # the line over a code block: its language, and the Copy button
COPIED_MS = 1500  # how long a Copy button says "Copied"


def _all_fixed_pitch(block: QTextBlock) -> bool:
    """A code block's first line merges into the block before it and loses the code-fence
    property; its text is still all in the monospace font the Markdown reader gave it."""
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
    if fmt.hasProperty(CODE_HEAD):
        return False
    return (fmt.boolProperty(CODE) or fmt.hasProperty(QTextFormat.BlockCodeFence)
            or fmt.hasProperty(QTextFormat.BlockCodeLanguage) or _all_fixed_pitch(block))


def style_code(document: QTextDocument, start: int, end: int) -> None:
    """Between ``start`` and ``end``: code blocks in a monospaced font on a light background,
    their lines unbroken, each under a head line naming its language; inline code monospaced."""
    mono = QFontDatabase.systemFont(QFontDatabase.FixedFont)
    block = document.findBlock(start)
    firsts, in_code = [], False
    while block.isValid() and block.position() <= end:
        code = _is_code(block)
        if code and not in_code and not block.blockFormat().boolProperty(CODE):  # (not one styled before)
            firsts.append(block)
        in_code = code
        if code:
            fmt = block.blockFormat()
            fmt.setBackground(CODE_BACKGROUND)
            fmt.setLeftMargin(6)
            fmt.setNonBreakableLines(True)
            fmt.setProperty(CODE, True)
            cursor = QTextCursor(block)
            cursor.setBlockFormat(fmt)
            cursor.select(QTextCursor.BlockUnderCursor)
            char = QTextCharFormat()
            char.setFontFamilies([mono.family()])
            char.setFontFixedPitch(True)
            cursor.mergeCharFormat(char)
        else:
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
        block = block.next()
    for first in reversed(firsts):
        _add_head(first)


def _add_head(first: QTextBlock) -> None:
    """A line over the code block that starts at ``first``: the language the model named (as
    plain text), or "code". Inserted as a block of its own before the block's first line."""
    code_format = first.blockFormat()
    # A first line merged into the block before it lost the language; the block's next line has it.
    named = [b.blockFormat().stringProperty(QTextFormat.BlockCodeLanguage).strip() for b in (first, first.next())
             if b.isValid() and b.blockFormat().boolProperty(CODE)]
    language = next((n for n in named if n), "code")
    code_format.setTopMargin(0)
    cursor = QTextCursor(first)
    cursor.insertBlock(code_format, QTextCharFormat())  # the code moves down; ``first`` is left empty
    cursor.movePosition(QTextCursor.PreviousBlock)
    head = QTextBlockFormat()
    head.setProperty(CODE_HEAD, True)
    head.setBackground(HEAD_BACKGROUND)
    head.setLeftMargin(6)
    head.setTopMargin(max(first.blockFormat().topMargin(), 6))  # apart from the prose above
    head.setNonBreakableLines(True)
    cursor.setBlockFormat(head)
    char = QTextCharFormat()
    char.setForeground(HEAD_TEXT)  # the line as tall as the text's: its button is styled to fit (style.qss)
    cursor.insertText(language[:40], char)


def code_under(head: QTextBlock) -> str:
    """The code of the block under the head line ``head``, as written."""
    lines, block = [], head.next()
    while block.isValid() and block.blockFormat().boolProperty(CODE):
        lines.append(block.text())
        block = block.next()
    return "\n".join(lines)


class CopyButtons(QObject):
    """Copy buttons over a text view's code heads in sight, at the right edge of the view."""

    def __init__(self, view: QTextEdit):
        super().__init__(view)
        self.view = view
        self.buttons: list[QToolButton] = []
        self._placing = QTimer(self, singleShot=True, interval=0, timeout=self.place)
        view.verticalScrollBar().valueChanged.connect(self._placing.start)
        view.horizontalScrollBar().valueChanged.connect(self._placing.start)
        view.document().documentLayout().documentSizeChanged.connect(self._placing.start)
        view.document().contentsChanged.connect(self._placing.start)
        view.viewport().installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:
        if event.type() in (QEvent.Resize, QEvent.Show):
            self._placing.start()
        return False

    def heads_in_sight(self) -> list[QTextBlock]:
        """Only the blocks in sight are looked at: a long conversation costs no more than a short one."""
        view, layout = self.view, self.view.document().documentLayout()
        height = view.viewport().height()
        offset = view.verticalScrollBar().value()
        block = view.cursorForPosition(QPoint(0, 0)).block()
        heads = []
        while block.isValid():
            top = layout.blockBoundingRect(block).top() - offset
            if top > height:
                break
            if block.blockFormat().boolProperty(CODE_HEAD):
                heads.append(block)
            block = block.next()
        return heads

    def place(self) -> None:
        view, layout = self.view, self.view.document().documentLayout()
        heads = self.heads_in_sight()
        while len(self.buttons) < len(heads):
            button = QToolButton(view.viewport(), text="Copy", objectName="codeCopy",
                                 toolTip="Copy this code block", cursor=Qt.PointingHandCursor)
            button.clicked.connect(lambda _=False, b=button: self.copy(b))
            # Tab stops right after the transcript, top to bottom (made later, they came last).
            QWidget.setTabOrder(self.buttons[-1] if self.buttons else view, button)
            self.buttons.append(button)
        offset = view.verticalScrollBar().value()
        for i, button in enumerate(self.buttons):
            if i >= len(heads):
                button.hide()
                continue
            rect = layout.blockBoundingRect(heads[i])
            if button.property("head") != heads[i].position():
                button.setText("Copy")
            button.setProperty("head", heads[i].position())
            # As wide as its longer word, so "Copied" fits where "Copy" was; within its head line.
            button.setFixedSize(button.fontMetrics().horizontalAdvance("Copied") + 16, int(rect.height()))
            button.move(view.viewport().width() - button.width() - 6, int(rect.top() - offset))
            button.show()

    def copy(self, button: QToolButton) -> None:
        head = self.view.document().findBlock(int(button.property("head")))
        if not head.blockFormat().boolProperty(CODE_HEAD):
            self.place()  # the transcript changed under the button
            return
        QGuiApplication.clipboard().setText(code_under(head))
        button.setText("Copied")
        QTimer.singleShot(COPIED_MS, button, lambda: button.setText("Copy"))
