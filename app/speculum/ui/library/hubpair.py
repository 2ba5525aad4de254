"""Asking for a model on the Hugging Face Hub (and an optional draft) to add to the library."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QWidget

from ...models.remote import HubRef


class HubPairDialog(QDialog):
    """Ask for a Hub file (and an optional draft) to add."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Add from the Hugging Face Hub")
        self.target = QLineEdit()
        self.target.setPlaceholderText("hf:OWNER/REPO/FILE.gguf or a …/resolve/main/… link")
        self.draft = QLineEdit()
        self.draft.setPlaceholderText("optional: a draft model with the same tokenizer")
        self.name = QLineEdit()
        form = QFormLayout(self)
        form.addRow(QLabel("Both headers are checked over the network before anything is downloaded."))
        form.addRow("Target", self.target)
        form.addRow("Draft", self.draft)
        form.addRow("Name", self.name)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        self.resize(560, 0)

    def refs(self) -> tuple[HubRef, HubRef | None]:
        def parse(text: str) -> HubRef:
            text = text.strip()
            ref = HubRef.parse(text if text.startswith(("hf:", "http")) else f"hf:{text}")
            assert ref is not None
            return ref
        target = parse(self.target.text())
        return target, parse(self.draft.text()) if self.draft.text().strip() else None
