"""Widgets that repaint alone while a generation streams in.

A style-sheet background makes a scroll area's viewport and scroll-bar containers
transparent, and a custom-painted widget is transparent unless it says otherwise. Each
update of such a widget then repaints everything behind it too: the pane, the splitter,
the main window. While generating that happens several times a second, and on a machine
whose cores all run llama.cpp the UI's time comes out of decoding. Filling the widget's
own background keeps a repaint to the widget.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QWidget

_SCROLL_BAR_BOXES = ("qt_scrollarea_vcontainer", "qt_scrollarea_hcontainer")


class OpaqueScrollArea:
    """Mix into a QAbstractScrollArea subclass (first base): its viewport and scroll bars fill
    their own background. The style sheet's polish resets that, so it is set after each polish."""

    def event(self, event) -> bool:
        handled = super().event(event)
        if event.type() in (QEvent.Polish, QEvent.StyleChange):
            self.viewport().setAutoFillBackground(True)
            for name in _SCROLL_BAR_BOXES:
                box = self.findChild(QWidget, name)
                if box is not None:
                    box.setAutoFillBackground(True)
        return handled


def paints_own_background(widget: QWidget) -> None:
    """For a widget whose paintEvent fills its whole rect first: Qt need not paint behind it."""
    widget.setAttribute(Qt.WA_OpaquePaintEvent, True)
