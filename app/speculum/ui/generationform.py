"""The Generation and Hardware groups of the sidebar, bound to the window's ``Settings``."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QDoubleSpinBox, QFormLayout, QGroupBox, QLabel, QLineEdit, QSpinBox, QVBoxLayout,
                               QWidget)

from ..engine.rpc import client as rpc  # addresses only: this module loads no llama.cpp
from .look import BUILT_IN_MTP
from .settings import Settings
from ..protocol import GenerationRequest


class GenerationForm(QWidget):
    changed = Signal()  # the user changed a value: the settings are worth saving

    def __init__(self, parent=None):
        super().__init__(parent)
        self.temperature = QDoubleSpinBox(objectName="temperature", minimum=0.0, maximum=2.0, singleStep=0.1,
                                          decimals=2, toolTip="0 = greedy: always the most likely token")
        self.top_p = QDoubleSpinBox(objectName="topP", minimum=0.05, maximum=1.0, singleStep=0.05, decimals=2)
        self.max_tokens = QSpinBox(objectName="maxTokens", minimum=0, maximum=32768, singleStep=64,
                                   specialValueText="Until the end",
                                   toolTip="Until the end: the answer runs until the model ends it or the context "
                                           "is full.\nA number stops it there, with Continue to write on.")
        self.k_spin = QSpinBox(objectName="draftLength", minimum=0, maximum=15, specialValueText="Adaptive",
                               toolTip=f"Tokens drafted per cycle in Draft model, Prompt lookup and {BUILT_IN_MTP} modes; "
                                       "Adaptive lets Speculum pick k from what it measures")
        generation = QGroupBox("Generation")
        form = QFormLayout(generation)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Draft length k", self.k_spin)
        self.n_ctx = QSpinBox(objectName="contextSize", minimum=128, maximum=131072, singleStep=512,
                              toolTip="Context size in tokens (applies at the next Load)")
        self.target_layers = QSpinBox(objectName="targetGpuLayers", minimum=-1, maximum=999, specialValueText="All")
        self.draft_layers = QSpinBox(objectName="draftGpuLayers", minimum=-1, maximum=999, specialValueText="All")
        hardware = QGroupBox("Hardware")
        form = QFormLayout(hardware)
        form.addRow("Context", self.n_ctx)
        form.addRow("Target GPU layers", self.target_layers)
        form.addRow("Draft GPU layers", self.draft_layers)
        self.rpc = QLineEdit(objectName="rpcWorkers", placeholderText="none: this machine only",
                             toolTip="`speculum rpc-worker`s (HOST:PORT, comma-separated) that take the target's "
                                     "layers; the draft stays here. Applies at the next Load.")
        form.addRow("RPC workers", self.rpc)
        self.hardware_note = QLabel("Starting the engine…")
        self.hardware_note.setObjectName("caption")
        self.hardware_note.setTextFormat(Qt.PlainText)  # the GPU's name as the driver reports it
        self.hardware_note.setWordWrap(True)
        form.addRow(self.hardware_note)
        for spin in (self.target_layers, self.draft_layers):
            spin.setEnabled(False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)  # it sits in the sidebar's own margins
        lay.addWidget(generation)
        lay.addWidget(hardware)
        self._applying = False
        for spin in self._spins():
            spin.valueChanged.connect(self._on_value_changed)
        self.rpc.editingFinished.connect(self._on_value_changed)

    def _spins(self):
        return (self.temperature, self.top_p, self.max_tokens, self.k_spin, self.n_ctx,
                self.target_layers, self.draft_layers)

    def _on_value_changed(self, *_) -> None:
        if not self._applying:
            self.changed.emit()

    def apply(self, s: Settings) -> None:
        """Show the saved values (each setter fires valueChanged: only the finished state counts)."""
        self._applying = True
        self.temperature.setValue(s.temperature)
        self.top_p.setValue(s.top_p)
        self.max_tokens.setValue(s.max_tokens)
        self.k_spin.setValue(s.k)
        self.rpc.setText(s.rpc)
        self.n_ctx.setValue(s.n_ctx)
        self.target_layers.setValue(s.target_gpu_layers)
        self.draft_layers.setValue(s.draft_gpu_layers)
        self._applying = False

    def store(self, s: Settings) -> None:
        s.temperature = self.temperature.value()
        s.top_p = self.top_p.value()
        s.max_tokens = self.max_tokens.value()
        s.k = self.k_spin.value()
        s.rpc = self.rpc.text().strip()
        s.n_ctx = self.n_ctx.value()
        s.target_gpu_layers = self.target_layers.value()
        s.draft_gpu_layers = self.draft_layers.value()

    def request(self, conversation, mode: str, **extra) -> GenerationRequest:
        """A request to answer ``conversation`` with the values shown; ``extra``: e.g. the document."""
        return GenerationRequest(conversation_id=conversation.id, messages=conversation.history(), mode=mode,
                                 k=self.k_spin.value() or None, temperature=self.temperature.value(),
                                 top_p=self.top_p.value(), max_tokens=self.max_tokens.value(), **extra)

    def rpc_workers(self) -> tuple[str, ...]:
        """The RPC workers typed in; ValueError (SpeculumError) in plain words when one is malformed."""
        return rpc.parse_endpoints(self.rpc.text()) if self.rpc.text().strip() else ()

    def gpu_layers(self) -> tuple[int | None, int | None]:
        """Target and draft layers for a load: None where the spinner shows "All" (-1)."""
        return tuple(None if spin.value() < 0 else spin.value() for spin in (self.target_layers, self.draft_layers))

    def show_gpu(self, gpu: str | None) -> None:
        """The engine process reported its GPU backend (None: this llama.cpp build runs on the CPU)."""
        # One short line: the sidebar is narrow, and a wrapped note is clipped in its group.
        self.hardware_note.setText(f"GPU: {gpu} · applies at the next Load" if gpu else "CPU only: no GPU backend")
        self.hardware_note.setToolTip(f"This llama.cpp build offloads to {gpu}; changes apply at the next Load." if gpu
                                      else "This llama.cpp build runs on the CPU only.")
        for spin in (self.target_layers, self.draft_layers):
            spin.setEnabled(bool(gpu))
            spin.setToolTip("Layers on the GPU: All, or a number (0 = CPU only)" if gpu
                            else "No GPU backend in this llama.cpp build")
