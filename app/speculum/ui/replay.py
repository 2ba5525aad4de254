"""Replay controls: step or play through a finished generation's cycles.

Each cycle takes two steps, as it happened: the draft proposed, then verified (the
accepted tokens kept, the rejected struck, the target's token added). Step 0 is the
empty answer; step 2·n shows all n cycles verified.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QSlider, QToolButton, QWidget


PLAY_INTERVAL_MS = 400


class ReplayBar(QWidget):
    stepChanged = Signal(int)  # 0 … 2·n

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("replayBar")
        self.back = QToolButton(text="◀", toolTip="Previous step")
        self.play = QToolButton(text="▶ Play", toolTip="Play the cycles as they happened")
        self.play.setCheckable(True)
        self.forward = QToolButton(text="▶|", toolTip="Next step")
        self.slider = QSlider(Qt.Horizontal)
        self.slider.setPageStep(2)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for w in (self.back, self.play, self.forward):
            layout.addWidget(w)
        layout.addWidget(self.slider, 1)
        self.timer = QTimer(self)
        self.timer.setInterval(PLAY_INTERVAL_MS)
        self.timer.timeout.connect(self._tick)
        self.back.clicked.connect(lambda: self.slider.setValue(self.slider.value() - 1))
        self.forward.clicked.connect(lambda: self.slider.setValue(self.slider.value() + 1))
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

    def set_step(self, step: int) -> None:
        self.slider.setValue(step)

    def _play(self, on: bool) -> None:
        if on:
            if self.slider.value() >= self.slider.maximum():
                self.slider.setValue(0)
            self.play.setText("❚❚ Pause")
            self.timer.start()
        else:
            self.play.setText("▶ Play")
            self.timer.stop()

    def pause(self) -> None:
        self.play.setChecked(False)

    def _tick(self) -> None:
        if self.slider.value() >= self.slider.maximum():
            self.pause()
        else:
            self.slider.setValue(self.slider.value() + 1)
