"""The live speculation view: every cycle's drafted tokens, accepted or struck through.

Each token is a run of text with its own character format: green for an accepted
draft, red and struck through for a rejected one, blue for the target's correction,
violet for the bonus token after a fully accepted draft, neutral for a plain step.
The format carries the token's kind and a tooltip naming its cycle, draft position,
drafter and probability.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor, QTextFormat, QTextLayout
from PySide6.QtWidgets import QTextEdit, QToolTip

from ...engine.vocabulary import Finish
from .. import look
from ..opaque import OpaqueScrollArea
from ..chat.richtext import escaped_tooltip

KIND = QTextFormat.UserProperty + 1  # the token kind stored in each run's format


def _format(kind: str, tooltip: str) -> QTextCharFormat:
    fmt = QTextCharFormat()
    fg, bg = look.COLOURS[kind]
    fmt.setForeground(QColor(fg))
    if bg:
        fmt.setBackground(QColor(bg))
    if kind == look.REJECTED:
        fmt.setFontStrikeOut(True)
    if kind in (look.CORRECTION, look.BONUS):
        fmt.setFontWeight(QFont.Bold)
    if kind == look.PROPOSED:
        fmt.setUnderlineStyle(QTextCharFormat.DotLine)
    fmt.setProperty(KIND, kind)
    fmt.setToolTip(tooltip)
    return fmt


def _p(values: list, i: int) -> str:
    return f" · p = {values[i]:.2f}" if i < len(values) else ""


def token_runs(cycle, verified: bool = True) -> list[tuple[str, str, str]]:
    """(text, kind, tooltip) for each token of a cycle; ``verified=False``: the draft as proposed."""
    n = cycle.index + 1
    drafter = look.DRAFTERS.get(cycle.source, cycle.source)
    k = len(cycle.drafted)
    runs = []
    if not verified:
        for j, text in enumerate(cycle.drafted_text):
            runs.append((look.visible(text), look.PROPOSED,
                         f"Cycle {n} · draft position {j + 1} of {k} · drafter: {drafter} · waiting for the target"))
        return runs
    accepted = look.ACCEPTED_AS.get(cycle.source, look.ACCEPTED)
    for j, text in enumerate(cycle.drafted_text):
        ok = j < cycle.n_accepted
        runs.append((look.visible(text), accepted if ok else look.REJECTED,
                     f"Cycle {n} · draft position {j + 1} of {k} · drafter: {drafter} · "
                     f"{'accepted' if ok else 'rejected'}{_p(cycle.p_drafted, j)}"))
    for j in range(cycle.n_accepted, len(cycle.emitted)):
        text = cycle.emitted_text[j] if j < len(cycle.emitted_text) else ""
        if not k:
            kind, what = look.PLAIN, "plain step (nothing drafted)"
        elif cycle.n_accepted < k:
            kind, what = look.CORRECTION, f"target's correction after {cycle.n_accepted} of {k} drafts"
        else:
            kind, what = look.BONUS, f"target's bonus token: all {k} drafts accepted"
        shown = "⟨end⟩" if text == "" and cycle.finish == Finish.EOG else look.visible(text)
        runs.append((shown, kind, f"Cycle {n} · {what}{_p(cycle.p_emitted, j)}"))
    return runs


class SpeculationView(OpaqueScrollArea, QTextEdit):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("speculationView")
        self.setReadOnly(True)
        self.setUndoRedoEnabled(False)
        self.setLineWrapMode(QTextEdit.WidgetWidth)
        self.setPlaceholderText("Each cycle's drafted tokens appear here as the model writes.")
        self._pending_from: int | None = None  # where an unverified (replay) draft starts
        self._stage = ""
        self.legend = Legend()
        # Following the newest tokens, also when the view is laid out or resized after it was
        # filled (at a restart it was filled before the window had its size, and stopped a few
        # pixels short of the end: a clipped row at the top, the last one cut). Scrolling up
        # stops following; back at the end follows again.
        self._following = True
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._keep_following)
        bar.valueChanged.connect(self._scrolled)

    def clear_view(self) -> None:
        self.clear()
        self._pending_from = None
        self._stage = ""

    # -- rendering --

    def _cursor(self) -> QTextCursor:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.End)
        return cursor

    def _stage_line(self, cursor: QTextCursor, stage: str) -> None:
        if stage == self._stage:
            return
        self._stage = stage
        if not stage:
            return
        fmt = QTextCharFormat()
        fmt.setForeground(look.MUTED)
        fmt.setFontItalic(True)
        if not self.document().isEmpty():
            cursor.insertText("\n", fmt)
        cursor.insertText(f"— {stage} —\n", fmt)

    def _insert(self, cursor: QTextCursor, runs) -> None:
        for text, kind, tooltip in runs:
            cursor.insertText(text, _format(kind, tooltip))

    def append_cycles(self, staged) -> None:
        """Add verified cycles at the end, each a ``CycleEvent`` or ``answer.StagedCycle``: a cycle
        with its stage of a long document, named once where the stage changes."""
        self._drop_pending()
        cursor = self._cursor()
        cursor.beginEditBlock()
        for item in staged:
            self.legend.note(item.cycle.source)
            self._stage_line(cursor, item.stage)
            self._insert(cursor, token_runs(item.cycle))
        cursor.endEditBlock()
        self._follow()

    def show_proposed(self, staged) -> None:
        """Replay: show a cycle's draft as proposed, before the target checked it."""
        self._drop_pending()
        cursor = self._cursor()
        self._stage_line(cursor, staged.stage)
        self._pending_from = cursor.position()
        self._insert(cursor, token_runs(staged.cycle, verified=False))
        self._follow()

    def _drop_pending(self) -> None:
        if self._pending_from is not None:
            cursor = self._cursor()
            cursor.setPosition(self._pending_from, QTextCursor.KeepAnchor)
            cursor.removeSelectedText()
            self._pending_from = None

    def _follow(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
        self._following = True

    def _scrolled(self, value: int) -> None:
        self._following = value >= self.verticalScrollBar().maximum()

    def _keep_following(self, _low: int = 0, high: int = 0) -> None:
        if self._following:
            self.verticalScrollBar().setValue(high)

    def _row_height(self) -> int:
        """A row's height as the text layout makes it (16 pixels where the font metrics said 15)."""
        probe = QTextLayout("X", self.font())
        probe.beginLayout()
        line = probe.createLine()
        probe.endLayout()
        return max(1, math.ceil(line.height()))

    def resizeEvent(self, event) -> None:
        """Whole rows only: the viewport a whole number of rows and one document margin tall, so
        scrolled to its end the view shows the bottom margin under its last row, and no clipped
        row at its top. (A scroll area's resizeEvent is its viewport's.)"""
        super().resizeEvent(event)
        row = self._row_height()
        room = self.height() - 2 * self.frameWidth() - int(self.document().documentMargin())
        spare = room % row if room > row else 0
        if self.viewportMargins().bottom() != spare:
            self.setViewportMargins(0, 0, 0, spare)
        self._keep_following(0, self.verticalScrollBar().maximum())

    # -- reading back (hover, tests) --

    def token_at(self, position: int) -> tuple[str, str, str] | None:
        """(text, kind, tooltip) of the token run holding document ``position``."""
        block = self.document().findBlock(position)
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.position() <= position < frag.position() + frag.length():
                fmt = frag.charFormat()
                kind = fmt.property(KIND)
                return (frag.text(), kind, fmt.toolTip()) if kind else None
            it += 1
        return None

    def runs(self) -> list[tuple[str, str, QTextCharFormat]]:
        """Every token run in the view with its kind and format, in order."""
        out = []
        block = self.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                frag = it.fragment()
                kind = frag.charFormat().property(KIND)
                if kind:
                    out.append((frag.text(), kind, frag.charFormat()))
                it += 1
            block = block.next()
        return out

    def viewportEvent(self, event) -> bool:
        if event.type() == QEvent.ToolTip:
            cursor = self.cursorForPosition(event.pos())
            # cursorForPosition lands between characters; the token is the one under the mouse.
            rect = self.cursorRect(cursor)
            position = cursor.position() - (1 if event.pos().x() < rect.x() else 0)
            token = self.token_at(max(position, 0))
            if token:
                # The drafter's name comes from saved cycles: shown literally, never as HTML.
                QToolTip.showText(event.globalPos(), escaped_tooltip(token[2]), self)
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)


class Legend(QTextEdit):
    """One line naming the colours, drawn with the same formats as the tokens."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("legend")
        self.setReadOnly(True)
        self.setFocusPolicy(Qt.NoFocus)  # a key, not a control: no Tab stop
        self.setFrameShape(QTextEdit.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        for kind in (look.ACCEPTED, look.REJECTED, look.CORRECTION, look.BONUS, look.PLAIN):
            self._add(kind)
        self.kinds = {look.ACCEPTED}

    def _add(self, kind: str) -> None:
        cursor = self.textCursor()
        cursor.movePosition(QTextCursor.End)
        cursor.insertText(f" {look.SHORT[kind]} ", _format(kind, look.LABELS[kind]))
        cursor.insertText("  ", QTextCharFormat())
        self.setFixedHeight(int(self.document().size().height()) + 6)

    def note(self, source) -> None:
        """A drafter with its own colour is named once its first draft is shown."""
        kind = look.ACCEPTED_AS.get(source, look.ACCEPTED)
        if kind not in self.kinds:
            self.kinds.add(kind)
            self._add(kind)

    def resizeEvent(self, event):
        super().resizeEvent(event)
        self.document().setTextWidth(self.viewport().width())
        self.setFixedHeight(int(self.document().size().height()) + 6)
