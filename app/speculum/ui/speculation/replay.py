"""Replay controls: step or play through a finished generation's cycles.

Each cycle takes two steps, as it happened: the draft proposed, then verified (the
accepted tokens kept, the rejected struck, the target's token added). Step 0 is the
empty answer; step 2·n shows all n cycles verified.

Played at 1×, each step comes when it came while the answer was written (its recorded
times, ``protocol.replay_pace``), by the clock: where drawing a step takes longer than the
step took, the next ones are shown together rather than late.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from itertools import accumulate

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QSlider, QStyle, QToolButton, QWidget


STEP_S = 0.2  # a step's time at 1× where none was recorded
SPEEDS = {"1×": 1.0, "4×": 4.0, "Instant": None}  # name: times the recorded pace (None: a step per frame)


class SeekSlider(QSlider):
    """A slider whose track, clicked, jumps to the step under the pointer (not one page at a time:
    a 300-cycle answer took 300 clicks to cross)."""

    def mousePressEvent(self, event) -> None:
        if event.button() == Qt.LeftButton:
            handle = self.style().pixelMetric(QStyle.PM_SliderLength, None, self)
            span = max(self.width() - handle, 1)
            x = int(event.position().x()) - handle // 2
            self.setValue(QStyle.sliderValueFromPosition(self.minimum(), self.maximum(), x, span))
            self.setSliderDown(True)  # a drag from here moves the handle on
        super().mousePressEvent(event)

    def mouseReleaseEvent(self, event) -> None:
        self.setSliderDown(False)
        super().mouseReleaseEvent(event)


class ReplayBar(QWidget):
    stepChanged = Signal(int)  # 0 … 2·n

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("replayBar")
        self.first = QToolButton(text="|◀", objectName="replayStart", toolTip="Back to the start")
        self.back = QToolButton(text="◀", objectName="replayBack", toolTip="Previous step")
        self.play = QToolButton(text="▶ Play", objectName="replayPlay", toolTip="Play the cycles as they happened")
        self.play.setCheckable(True)
        self.forward = QToolButton(text="▶", objectName="replayForward", toolTip="Next step")
        self.last = QToolButton(text="▶|", objectName="replayEnd", toolTip="To the end: the final answer (Esc)")
        self.speed = QComboBox(objectName="replaySpeed", toolTip="Replay speed")
        self.speed.addItems(list(SPEEDS))
        self.slider = SeekSlider(Qt.Horizontal, objectName="replaySlider")
        self.slider.setPageStep(2)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for w in (self.first, self.back, self.play, self.forward, self.last):
            layout.addWidget(w)
        layout.addWidget(self.slider, 1)
        layout.addWidget(self.speed)
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setTimerType(Qt.PreciseTimer)
        self.timer.timeout.connect(self._tick)
        self.due: list[float] = [0.0]  # seconds into the answer at which each step came (at 1×)
        self._clock: tuple[float, float] | None = None  # (time.monotonic(), answer seconds) when play began
        self.first.clicked.connect(lambda: self.slider.setValue(0))
        self.back.clicked.connect(lambda: self.slider.setValue(self.slider.value() - 1))
        self.forward.clicked.connect(lambda: self.slider.setValue(self.slider.value() + 1))
        self.last.clicked.connect(self.to_end)
        self.speed.currentTextChanged.connect(self._restart_clock)
        self.play.toggled.connect(self._play)
        self.slider.valueChanged.connect(self.stepChanged)
        self.slider.valueChanged.connect(self._moved)
        self._ticking = False

    def start(self, n_cycles: int, step: int | None = None, pace: list[float] | None = None) -> None:
        """``n_cycles`` to step through, from ``step`` (None: the end); ``pace``: each step's
        seconds as it happened (2·n of them), else STEP_S each."""
        self.pause()
        pace = pace if pace is not None and len(pace) == 2 * n_cycles else [STEP_S] * (2 * n_cycles)
        self.due = [0.0, *accumulate(max(s, 0.0) for s in pace)]
        self.slider.blockSignals(True)
        self.slider.setRange(0, 2 * n_cycles)
        self.slider.setValue(2 * n_cycles if step is None else step)
        self.slider.blockSignals(False)
        self.stepChanged.emit(self.slider.value())

    @property
    def step(self) -> int:
        return self.slider.value()

    @property
    def at_end(self) -> bool:
        return self.slider.value() >= self.slider.maximum()

    def set_step(self, step: int) -> None:
        self.slider.setValue(step)

    def to_end(self) -> None:
        """The final answer again, whole."""
        self.pause()
        self.slider.setValue(self.slider.maximum())

    @property
    def pace(self) -> float | None:
        """Times the recorded pace (None: Instant)."""
        return SPEEDS[self.speed.currentText()]

    def _play(self, on: bool) -> None:
        if on:
            if self.at_end:
                self.slider.setValue(0)
            self.play.setText("❚❚ Pause")
            self._restart_clock()
        else:
            self.play.setText("▶ Play")
            self.timer.stop()
            self._clock = None

    def pause(self) -> None:
        self.play.setChecked(False)

    def _restart_clock(self, *_) -> None:
        """Play on from the step shown, at the speed chosen."""
        if self.play.isChecked():
            self._clock = (time.monotonic(), self.due[min(self.step, len(self.due) - 1)])
            self._schedule()

    def _now(self) -> float:
        """Where in the answer's own time the replay stands now."""
        started, at = self._clock
        return at + (time.monotonic() - started) * self.pace

    def _schedule(self) -> None:
        """The timer fires when the next step is due."""
        if self.pace is None or self.step + 1 >= len(self.due):
            self.timer.start(0)
            return
        wait = (self.due[self.step + 1] - self._now()) / self.pace
        self.timer.start(max(0, round(1000 * wait)))

    def _moved(self, _step: int) -> None:
        if not self._ticking:  # the user moved it while playing: play on from there
            self._restart_clock()

    def _tick(self) -> None:
        if self.at_end or self._clock is None:
            self.pause()
            return
        self._ticking = True
        if self.pace is None:
            self.slider.setValue(self.step + 1)
        else:  # every step due by now, at least the next one
            due = bisect_right(self.due, self._now()) - 1
            self.slider.setValue(min(max(due, self.step + 1), self.slider.maximum()))
        self._ticking = False
        if self.at_end:
            self.pause()
        else:
            self._schedule()
