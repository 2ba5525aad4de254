"""The window's three columns (conversations and form, chat, speculation) and their sizes: kept
between runs, and the live view enlarged across the window on request."""

from __future__ import annotations

from PySide6.QtCore import QMargins, QPoint, QRect, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QScrollArea, QSplitter, QWidget

FIRST_SIZE = QSize(1440, 900)  # what the window asks for on a screen with room
FRAME = QMargins(8, 40, 8, 8)  # what a window manager may add around the window: borders, a title bar


def first_geometry(area: QRect) -> QRect:
    """The window at its first start: its usual size where the screen has room, else the screen's
    free area less a frame, centred in it (a 1366x768 screen got 1440x900, and lost Send)."""
    room = area.marginsRemoved(FRAME)
    rect = QRect(QPoint(0, 0), FIRST_SIZE.boundedTo(room.size()))
    rect.moveCenter(room.center())
    return rect


class Scrolling(QScrollArea):
    """A side pane that scrolls up and down only when the window is shorter than the pane's
    minimum, and otherwise fills the height (the side panes asked for 650 pixels: taller than a
    1366x768 screen at 125% scale allows; left to QScrollArea's own sizing, a pane with wrapping
    labels took its preferred height, and a 760-pixel window scrolled its stats). Short by no more
    than the pane's bottom margin, the pane gives up its margin instead: a scroll bar that moves
    by a pixel only hides width."""

    def __init__(self, pane: QWidget):
        super().__init__()
        self.setWidget(pane)
        self.setFrameShape(QFrame.NoFrame)
        self.setFocusPolicy(Qt.NoFocus)  # its controls are the Tab stops, not the frame around them
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self._bar = self.verticalScrollBar().sizeHint().width()
        self.setMinimumWidth(pane.minimumSizeHint().width() + self._bar)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        pane = self.widget()
        need = pane.minimumSizeHint().height()
        slack = pane.layout().contentsMargins().bottom() if pane.layout() is not None else 0
        scrolls = need > self.height() + slack
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAsNeeded if scrolls else Qt.ScrollBarAlwaysOff)
        pane.resize(self.width() - (self._bar if scrolls else 0), need if scrolls else self.height())


class Panes(QSplitter):
    """Side bar, chat and speculation pane side by side, with handles between them. ``enlarge``
    gives the speculation pane the whole window and hides its stats: the live view, large."""

    enlarged = Signal(bool)

    def __init__(self, sidebar: QWidget, chat: QWidget, speculation_pane: QWidget, stats: QWidget):
        super().__init__(Qt.Horizontal)
        self.setObjectName("panes")
        self.columns = [Scrolling(sidebar), chat, Scrolling(speculation_pane)]
        for column in self.columns:
            self.addWidget(column)
        self.setChildrenCollapsible(False)
        self.setStretchFactor(0, 0)
        self.setStretchFactor(1, 3)
        self.setStretchFactor(2, 2)
        self.setSizes([250, 660, 530])
        self.stats = stats
        self.is_enlarged = False
        self._before: list[int] = []  # the sizes to go back to
        self._pending: list[float] = []  # shares to set at the first show

    def shares(self) -> list[float]:
        """Each column's share of the width, as kept in the settings (from before enlarging)."""
        sizes = self._before if self.is_enlarged and self._before else self.sizes()
        total = sum(sizes)
        return [round(size / total, 4) for size in sizes] if total else []

    def restore(self, shares: list[float]) -> None:
        """Set the columns to these shares of the width once the window is shown at its size
        (set before, a first resize would share out the difference by stretch factors instead)."""
        if len(shares) == len(self.columns) and all(0 < share < 1 for share in shares):
            self._pending = shares

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._pending:
            QTimer.singleShot(0, self._apply_shares)  # once the window has laid itself out at its size

    def _apply_shares(self) -> None:
        if self._pending:
            total = sum(self.sizes())
            self.setSizes([round(share * total) for share in self._pending])
            self._pending = []

    def enlarge(self, on: bool) -> None:
        if on == self.is_enlarged:
            return
        if on:
            self._before = self.sizes()
        for column in self.columns[:2]:
            column.setVisible(not on)
        self.stats.setVisible(not on)
        self.is_enlarged = on
        if not on and self._before:
            self.setSizes(self._before)
        self.enlarged.emit(on)
