"""The window's status bar: the loaded pair, load progress with Cancel, and where the engine runs."""

from __future__ import annotations

import re

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QMenu, QProgressBar, QPushButton, QStatusBar, QToolButton

from ...engine.llama import profiles
from ...engine.vocabulary import Device
from ..chat.richtext import escaped_tooltip
from ..worker import Activity

PROGRESS_SCALE = 1000  # the bar counts thousandths of the load
# Words a GGUF's name may carry from the model it was converted from, untrue of the GGUF itself:
# the demo draft calls itself "Qwen2.5 Coder 0.5B Instruct AWQ" and is a Q4_K_M GGUF.
_FORMAT_WORDS = re.compile(r"\s+\b(AWQ|GPTQ|GGUF|EXL2|MLX|HQQ|bnb|4bit|8bit)\b", re.IGNORECASE)


def shown_name(name: str) -> str:
    """A model's name as the status bar shows it: what it is, less another format's tag."""
    return _FORMAT_WORDS.sub("", name).strip() or name


def crash_offer(death, has_gpu: bool) -> tuple[str, profiles.Profile | None, str]:
    """What to say when the engine process died, and the safer profile to offer (with why) when
    it died loading or at the first decode."""
    safer = profiles.safer_than(death.profile, has_gpu) if death.during_load else None
    message = death.message()
    if safer is None:
        return message, None, ""
    why = f"the {death.profile.name} profile crashed ({death.how}) while {death.activity.words}"
    message += (f" This happened {'during the load' if death.activity is Activity.LOADING else 'at the first decode'}"
                f": the {safer.name} profile ({safer.description}) may avoid it.")
    return message, safer, why


LATER_MINUTES = 15  # the shorter of the two ways to put the first measurement off
MEASURING_TIP = escaped_tooltip(
    "Speculum times a few target passes of different sizes, once per model pair, so that Auto mode knows "
    "what drafting costs on this machine and picks what is fastest here. It uses the cores for about a "
    "minute, and gives way at once when you send, and while you type.")
LATER_TIP = escaped_tooltip(
    "Put the measuring off. Until it is done, Auto mode chooses from estimates of this machine's costs (and "
    "learns from your answers as they come), so its first choices may be slower than they could be.")


class LoadStatus(QStatusBar):
    postponeMeasuring = Signal(object)  # seconds the user put the measuring off for; None: this session

    def __init__(self, parent=None):
        super().__init__(parent)
        self.backend_label = QLabel(objectName="backendLabel")
        self.model_label = QLabel("No model loaded", objectName="modelLabel", textFormat=Qt.PlainText)
        self.load_progress = QProgressBar(objectName="loadProgress", maximum=PROGRESS_SCALE, textVisible=True)
        self.load_progress.setFixedWidth(220)
        self.cancel_button = QPushButton("Cancel", objectName="cancelLoad", toolTip="Cancel loading")
        self.load_progress.hide()
        self.cancel_button.hide()
        self.measuring = QLabel("Measuring this machine…", toolTip=MEASURING_TIP)
        self.measuring.setObjectName("caption")
        self.measuring.hide()
        self.later = QToolButton(text="Later", objectName="measureLater", toolTip=LATER_TIP,
                                 popupMode=QToolButton.InstantPopup, autoRaise=True)
        menu = QMenu(self.later)
        menu.addAction(f"In {LATER_MINUTES} minutes", lambda: self._postpone(LATER_MINUTES * 60.0))
        menu.addAction("Not again this session", lambda: self._postpone(None))
        menu.setToolTipsVisible(True)
        for action in menu.actions():
            action.setToolTip(LATER_TIP)
        self.later.setMenu(menu)
        self.later.hide()
        self.addWidget(self.model_label, 1)
        self.addPermanentWidget(self.measuring)
        self.addPermanentWidget(self.later)
        self.addPermanentWidget(self.load_progress)
        self.addPermanentWidget(self.cancel_button)
        self.addPermanentWidget(self.backend_label)

    def show_measuring(self, on: bool) -> None:
        self.measuring.setVisible(on)
        self.later.setVisible(on)

    def _postpone(self, seconds: float | None) -> None:
        self.show_measuring(False)  # the engine stops after the pass it is in, and says so
        self.postponeMeasuring.emit(seconds)

    def begin_load(self) -> None:
        self.load_progress.setValue(0)
        self.load_progress.setFormat("Loading target… %p%")
        self.load_progress.show()
        self.cancel_button.show()
        self.model_label.setText("Loading models…")

    def show_load_progress(self, stage: str, fraction: float) -> None:
        self.load_progress.setFormat(f"Loading {stage}… %p%")
        self.load_progress.setValue(int(fraction * PROGRESS_SCALE))

    def end_load(self, model_text: str | None = None) -> None:
        self.load_progress.hide()
        self.cancel_button.hide()
        self.cancel_button.setEnabled(True)
        if model_text is not None:
            self.model_label.setText(model_text)

    def show_pair(self, target, draft) -> None:
        pair = f"{shown_name(target.name)} ({target.quantization})"
        if draft:
            pair += f"  ←  {shown_name(draft.name)} ({draft.quantization})"
        elif target.nextn_layers:
            pair += "  ←  built-in (its own MTP head)"
        elif target.assistant:
            pair += f"  ←  {target.assistant} (Gemma 4 assistant, on the target's KV cache)"
        else:
            pair += "  ·  no draft model (prompt lookup only)"
        self.model_label.setText(f"{pair}  ·  context {target.n_ctx:,} tokens")

    def show_backend(self, facts, gpu: str | None, profile: profiles.Profile, why: str) -> None:
        """Where the loaded target runs (``facts``), or, with none loaded, what the engine offers."""
        if facts is None:
            text = f"Backend: {gpu or 'CPU'}"
        elif facts.device == Device.CPU:
            text = "Backend: CPU"
        else:
            text = f"Backend: {facts.backend} · {facts.n_gpu_layers if facts.n_gpu_layers < 10**5 else 'all'} layers"
        if facts is not None and profile is not profiles.STANDARD:
            text += f" · {profile.name} profile"
            self.backend_label.setToolTip(profiles.describe(profile, why))
        else:
            self.backend_label.setToolTip("")
        self.backend_label.setText(text)
