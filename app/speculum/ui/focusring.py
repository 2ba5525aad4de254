"""Where the keyboard is: one ring drawn around the widget that has the focus, whatever its kind.

Fusion marks focus faintly or not at all once a style sheet styles a control (a dotted line on
Send, nothing on the replay buttons or the pickers); a style-sheet border per kind of control
would have to restyle each one whole. One ring, a child of the window laid over the focused
widget, marks them all the same way (the window's child: it lives as long as the window).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QRect, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QApplication, QWidget
from shiboken6 import isValid

RING = QColor("#2f6fdf")
WIDTH = 2


class FocusRing(QWidget):
    """A frame around ``QApplication.focusWidget()`` while it is inside ``window``; clicks go through it."""

    def __init__(self, window: QWidget):
        super().__init__(window)
        self.window_ = window
        self.target: QWidget | None = None
        self._watched: list[QWidget] = []  # the target and its parents, up to the window
        self.setObjectName("focusRing")
        self.setAttribute(Qt.WA_TransparentForMouseEvents)
        self.setAttribute(Qt.WA_NoSystemBackground)
        self.setFocusPolicy(Qt.NoFocus)
        self.hide()
        self._follower = _Follower(self)
        QApplication.instance().focusChanged.connect(self._focus_changed)

    def _focus_changed(self, _old, new) -> None:
        for watched in self._watched:
            if isValid(watched):
                watched.removeEventFilter(self._follower)
        inside = new is not None and new is not self and new.window() is self.window_
        self.target = new if inside else None
        # The widget and the panes it sits in: a splitter dragged or a pane scrolled moves it too.
        self._watched = []
        widget = self.target
        while widget is not None and widget is not self.window_:
            widget.installEventFilter(self._follower)
            self._watched.append(widget)
            widget = widget.parentWidget()
        self.follow()

    def follow(self) -> None:
        target = self.target
        if target is None or not isValid(target) or not target.isVisible():
            self.hide()
            return
        room = WIDTH + 1
        at = target.mapTo(self.window_, target.rect().topLeft())
        self.setGeometry(QRect(at, target.size()).adjusted(-room, -room, room, room))
        self.raise_()
        self.show()

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.Antialiasing)
        painter.setPen(QPen(RING, WIDTH))
        painter.drawRoundedRect(QRect(0, 0, self.width(), self.height()).adjusted(1, 1, -1, -1), 4, 4)


class _Follower(QObject):
    """Keeps the ring on its widget as the widget moves, resizes, hides or shows."""

    def __init__(self, ring: FocusRing):
        super().__init__(ring)
        self.ring = ring

    def eventFilter(self, watched, event) -> bool:
        if event.type() in (QEvent.Move, QEvent.Resize, QEvent.Show, QEvent.Hide, QEvent.ParentChange):
            self.ring.follow()
        return False
