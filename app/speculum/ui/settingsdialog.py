"""The Settings dialog (File ▸ Settings…): what the engine keeps from one prompt to the next,
the prompt cache's budget and the n-gram memory, and exact speculation. All apply at the next Load."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import (QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QPushButton, QSpinBox, QVBoxLayout, QWidget)

from ..engine.drafting import ngrammemory
from ..engine.llama import cpu_settings
from ..engine.promptcache import MIB, default_budget
from .chat.richtext import escaped_tooltip
from .settings import MAX_PROMPT_CACHE_MIB, Settings

AUTOMATIC, OFF = -1, 0  # the prompt cache's two special values

CACHE_TIP = escaped_tooltip(
    "The prompt cache keeps what the models computed for recent prompts in memory, so a conversation you "
    "switch back to, an answer you ask again, or an API client that resends the same document starts at the "
    "first new token instead of reading everything again.\n"
    "Automatic: a quarter of the memory free when the models load (between 256 MiB and 8 GiB).\n"
    "Off: every prompt is read in full. A number: at most that many MiB; the least recently used prompts "
    "go first.\nApplies at the next Load.")
MEMORY_TIP = escaped_tooltip(
    "The n-gram memory lets Speculum draft from text this machine has written and read before (earlier "
    "answers and documents), not only from the prompt at hand: a regenerated answer or a document quoted "
    "again is drafted whole. It is kept in the data folder, at most 1 MiB per model family, and a "
    "conversation's part is forgotten when you delete it.\n"
    "Off: nothing is drafted from it or added to it (what it holds stays until you forget it).\n"
    "Applies at the next Load.")
EXACT_TIP = escaped_tooltip(
    "Exact speculation computes every row of a verification pass with the kernel a single step uses, so "
    "an answer at temperature 0 is plain decoding's, token for token, in every mode (each answer's "
    "'Check against plain decoding' shows it). It costs speed on the CPU: verify passes and prompt "
    "reading are slower (the README says how much).\n"
    "Off: faster, but at a near tie between two tokens a speculative answer can take the other one.\n"
    "Applies at the next Load (the engine starts again).")
FORGET_TIP = escaped_tooltip(
    "Empty the n-gram memory now: everything it learned from every conversation and API request is deleted "
    "from the data folder. Conversations themselves are kept.")


class CacheSpin(QSpinBox):
    """MiB for the prompt cache, with "Automatic" below "Off" (0)."""

    def __init__(self, **kwargs):
        super().__init__(minimum=AUTOMATIC, maximum=MAX_PROMPT_CACHE_MIB, singleStep=256, **kwargs)
        self.automatic = f"Automatic (about {default_budget() // MIB:,} MiB now)"

    def stepBy(self, steps: int) -> None:
        """Automatic, Off, then whole steps of 256 MiB."""
        value, step = self.value(), self.singleStep()
        for _ in range(abs(steps)):
            if steps > 0:
                value = OFF if value == AUTOMATIC else (value // step + 1) * step
            else:
                value = AUTOMATIC if value == OFF else max(OFF, (value - 1) // step * step)
        self.setValue(value)

    def textFromValue(self, value: int) -> str:
        return self.automatic if value == AUTOMATIC else "Off" if value == OFF else f"{value:,} MiB"

    def valueFromText(self, text: str) -> int:
        text = text.strip().lower()
        if text.startswith("auto"):
            return AUTOMATIC
        if text.startswith("off"):
            return OFF
        digits = "".join(c for c in text if c.isdigit())
        return int(digits) if digits else OFF

    def validate(self, text: str, pos: int):
        typed = text.strip().lower()
        if typed.startswith("automatic") or typed == "off":
            return QValidator.Acceptable, text, pos
        if not typed or "automatic".startswith(typed) or "off".startswith(typed):
            return QValidator.Intermediate, text, pos
        number = typed.replace(",", "").removesuffix("mib").strip()
        if number.isdigit() and int(number) <= MAX_PROMPT_CACHE_MIB:
            return QValidator.Acceptable, text, pos
        return QValidator.Invalid, text, pos


EMPTY = "It is empty."


def caption(text: str) -> QLabel:
    label = QLabel(text, objectName="caption", wordWrap=True)
    label.setTextFormat(Qt.PlainText)
    return label


def memory_size_words() -> str:
    """How much the n-gram memory holds on disk, in words."""
    size = 0
    try:
        for path in ngrammemory.folder().glob("*.bin"):
            size += path.stat().st_size
    except OSError:  # a folder that cannot be read, a file the engine replaced meanwhile
        pass
    if not size:
        return EMPTY
    return f"It holds {size / 1024:,.0f} KiB." if size < MIB else f"It holds {size / MIB:,.1f} MiB."


class SettingsDialog(QDialog):
    """The memory settings; OK stores them in ``settings`` (the window saves them)."""

    def __init__(self, settings: Settings, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setObjectName("settingsDialog")
        self.settings = settings
        self.cache = CacheSpin(objectName="promptCacheMib", toolTip=CACHE_TIP)
        self.cache.setValue(max(settings.prompt_cache_mib, AUTOMATIC))
        self.memory = QCheckBox("Draft from what this machine wrote and read before", objectName="ngramMemory",
                                toolTip=MEMORY_TIP, checked=settings.ngram_memory)
        self.forget = QPushButton("Forget what the n-gram memory learned", objectName="forgetNgramMemory",
                                  toolTip=FORGET_TIP)
        self.held = QLabel(memory_size_words(), objectName="caption", toolTip=FORGET_TIP)
        self.forget.clicked.connect(self.forget_memory)
        self.exact = QCheckBox("Exact speculation: answers at temperature 0 are plain decoding's, token for token",
                               objectName="exactSpeculation", toolTip=EXACT_TIP, checked=settings.exact)
        built = cpu_settings.build_has_row_switch()
        self.exact.setEnabled(built)
        self.forget.setEnabled(self.held.text() != EMPTY)
        group = QGroupBox("What is kept between prompts")
        form = QFormLayout(group)
        form.addRow("Prompt cache", self.cache)
        form.labelForField(self.cache).setToolTip(CACHE_TIP)
        form.addRow("", caption("A prompt seen before is not read again: a conversation you switch back to, "
                                "an answer asked again."))
        form.addRow("N-gram memory", self.memory)
        form.labelForField(self.memory).setToolTip(MEMORY_TIP)
        form.addRow("", caption("Earlier answers and documents become drafts: text written again is "
                                "written faster."))
        row = QHBoxLayout()
        row.addWidget(self.forget)
        row.addWidget(self.held, 1)
        form.addRow("", row)
        exactness = QGroupBox("Exactness")
        exact_form = QVBoxLayout(exactness)
        exact_form.addWidget(self.exact)
        exact_form.addWidget(caption("On the CPU: prompts read a little slower (8% for a Q4_K_M model, a third for "
                                     "other repacked types such as Q4_0)." if built else
                                     "This llama.cpp build has no row-invariance switch: "
                                     "bash scripts/setup-env.sh builds one that has."))
        note = caption("Changes apply at the next Load.")
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.button(QDialogButtonBox.Ok).setToolTip("Keep these settings; they apply at the next Load")
        buttons.button(QDialogButtonBox.Cancel).setToolTip("Leave the settings as they were "
                                                           "(a memory already forgotten stays forgotten)")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(group)
        layout.addWidget(exactness)
        layout.addWidget(note)
        layout.addWidget(buttons)

    def forget_memory(self) -> None:
        """Empty the n-gram memory on disk (a loaded engine reads it again before its next draft)."""
        try:
            ngrammemory.clear()
        except OSError as exc:
            self.held.setText(f"Could not forget it: {exc.strerror or exc}.")
            return
        self.held.setText("Forgotten: it is empty.")
        self.forget.setEnabled(False)

    def accept(self) -> None:
        self.settings.prompt_cache_mib = self.cache.value()
        self.settings.ngram_memory = self.memory.isChecked()
        if self.exact.isChecked() != self.settings.exact:
            self.settings.exact_chosen = True
        self.settings.exact = self.exact.isChecked()
        super().accept()
