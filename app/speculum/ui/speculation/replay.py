"""Replay controls: step or play through a finished generation's cycles.

Each cycle takes two steps, as it happened: the draft proposed, then verified (the
accepted tokens kept, the rejected struck, the target's token added). Step 0 is the
empty answer; step 2·n shows all n cycles verified.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QSlider, QStyle, QToolButton, QWidget


PLAY_INTERVAL_MS = 400  # one step at 1x
SPEEDS = {"1×": PLAY_INTERVAL_MS, "4×": PLAY_INTERVAL_MS // 4, "Instant": 0}  # name: milliseconds per step


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
        self.timer.setInterval(PLAY_INTERVAL_MS)
        self.timer.timeout.connect(self._tick)
        self.first.clicked.connect(lambda: self.slider.setValue(0))
        self.back.clicked.connect(lambda: self.slider.setValue(self.slider.value() - 1))
        self.forward.clicked.connect(lambda: self.slider.setValue(self.slider.value() + 1))
        self.last.clicked.connect(self.to_end)
        self.speed.currentTextChanged.connect(lambda name: self.timer.setInterval(SPEEDS[name]))
        self.play.toggled.connect(self._play)
        self.slider.valueChanged.connect(self.stepChanged)

    def start(self, n_cycles: int, step: int | None = None) -> None:
        self.pause()
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

    def _play(self, on: bool) -> None:
        if on:
            if self.at_end:
                self.slider.setValue(0)
            self.play.setText("❚❚ Pause")
            self.timer.start()
        else:
            self.play.setText("▶ Play")
            self.timer.stop()

    def pause(self) -> None:
        self.play.setChecked(False)

    def _tick(self) -> None:
        if self.at_end:
            self.pause()
        else:
            self.slider.setValue(self.slider.value() + 1)
