"""The first step when the models folder holds no model: how to get one, instead of an empty picker."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QFileDialog, QFrame, QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout,
                               QWidget)

from ... import paths
from ..chat.codeblocks import COPIED_MS
from ..chat.richtext import plain_label

DEMO_COMMAND = "pip install 'speculum[demo]' && speculum models install-demo"


def pick_model_file(parent: QWidget) -> str:
    """A GGUF file the user picks, starting in the models folder; "" when cancelled."""
    folder = paths.models_dir()
    path, _ = QFileDialog.getOpenFileName(parent, "Open a GGUF model", str(folder if folder.is_dir() else
                                                                          folder.parent), "GGUF models (*.gguf)")
    return path


class GetModelStep(QFrame):
    """Three ways to a first model: the demo pair's install command, Models… (download a pair
    that fits this machine), Open… (a GGUF file already on this computer)."""

    modelsRequested = Signal()
    openRequested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("getModelStep")
        title = QLabel("Get a model to start", objectName="stepTitle")
        where = plain_label(f"Speculum runs GGUF models on this computer, and {paths.models_dir()} holds none yet.")
        where.setWordWrap(True)
        self.command = QLineEdit(DEMO_COMMAND, objectName="demoCommand", readOnly=True,
                                 toolTip="Run this in a terminal, then restart Speculum")
        self.command.setCursorPosition(0)  # its start in sight: "pip install …"
        self.copy_button = QPushButton("Copy", objectName="copyCommand", toolTip="Copy the command")
        self.copy_button.clicked.connect(self.copy_command)
        self.models_button = QPushButton("Models…", objectName="stepModels",
                                         toolTip="Find and download a pair that fits this machine")
        self.open_button = QPushButton("Open…", objectName="stepOpen", toolTip="Use a GGUF file on this computer")
        self.models_button.clicked.connect(self.modelsRequested)
        self.open_button.clicked.connect(self.openRequested)

        demo = QHBoxLayout()
        demo.addWidget(self.command, 1)
        demo.addWidget(self.copy_button)
        layout = QVBoxLayout(self)
        layout.addWidget(title)
        layout.addWidget(where)
        for text, row in (("1. The demo pair (Qwen2.5-Coder 1.5B drafted by 0.5B, 1.6 GB, works offline):", demo),
                          ("2. Or download a pair that fits this machine:", self.models_button),
                          ("3. Or open a GGUF model you already have:", self.open_button)):
            line = QHBoxLayout()
            label = QLabel(text)
            label.setWordWrap(True)
            layout.addWidget(label)
            if isinstance(row, QHBoxLayout):
                layout.addLayout(row)
            else:
                line.addWidget(row)
                line.addStretch(1)
                layout.addLayout(line)

    def copy_command(self) -> None:
        QGuiApplication.clipboard().setText(DEMO_COMMAND)
        self.copy_button.setText("Copied")
        QTimer.singleShot(COPIED_MS, self.copy_button, lambda: self.copy_button.setText("Copy"))
