"""The right of the window: the speculation view, the replay bar and the stats, for the
window's own answers and for an API client's requests alike."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from ...protocol import Finished, Started
from .replaycontroller import ReplayController
from .tokenview import SpeculationView
from .stats import StatsPanel


class SpeculationPane(QWidget):
    def __init__(self, transcript, parent=None):
        super().__init__(parent)
        self.setObjectName("speculationPane")
        self.speculation = SpeculationView()
        self.stats = StatsPanel()
        self.replay = ReplayController(self.speculation, self.stats, transcript, self)
        lay = QVBoxLayout(self)
        lay.setSpacing(4)  # every pixel counts in a window on a 1280x720 screen (see stats.Chart)
        title = QLabel("Speculation, cycle by cycle")
        title.setObjectName("paneTitle")
        # The live view across the whole window (the window connects it; F11 too).
        self.enlarge_button = QToolButton(text="Enlarge", checkable=True, objectName="enlargeButton",
                                          toolTip="Show the live view across the whole window (F11); again to go back")
        heading = QHBoxLayout()
        heading.addWidget(title, 1)
        heading.addWidget(self.enlarge_button)
        lay.addLayout(heading)
        lay.addWidget(self.speculation.legend)
        lay.addWidget(self.speculation, 1)
        lay.addWidget(self.replay.bar)
        lay.addWidget(self.replay.label)
        lay.addWidget(self.stats)
        self._bottom = lay.contentsMargins().bottom()

    def resizeEvent(self, event) -> None:
        """A few pixels short of its minimum (the window's column gives up to its bottom margin
        rather than scroll, panes.Scrolling), the pane gives up that margin: left to the layout,
        every row was squeezed, and the stats' last row was cut."""
        lay = self.layout()
        margins = lay.contentsMargins()
        need = lay.minimumSize().height() - margins.bottom() + self._bottom
        bottom = max(0, self._bottom - max(0, need - event.size().height()))
        if bottom != margins.bottom():
            margins.setBottom(bottom)
            lay.setContentsMargins(margins)
        super().resizeEvent(event)

    def clear(self) -> None:
        self.speculation.clear_view()
        self.stats.reset()

    def add_events(self, events) -> None:
        """CycleEvents as they arrive: every cycle in the view, every point in the chart (drawn later)."""
        self.stats.chart.add_points([(e.snapshot.seconds, e.snapshot.tokens_per_s) for e in events], redraw=False)
        self.speculation.append_cycles(events)

    def show_snapshot(self, snapshot, scope: str = "") -> None:
        """``scope``: what the numbers add up, for an answer written in parts (``answer.stages_scope``)."""
        self.stats.show_snapshot(snapshot)
        self.stats.set_scope(scope)
        self.stats.chart.update()

    def show_served_request(self, event) -> None:
        """An API client's request (Started, Finished, Failed): shown live, like the window's own answers."""
        if isinstance(event, Started):
            self.clear()
            self.replay.label.setText("Answering an API request…")
        elif isinstance(event, Finished):
            self.replay.label.setText(f"Answered an API request: {event.usage['completion_tokens']} tokens.")
        else:
            self.replay.label.setText("An API request failed.")
