"""The window's toolbar: the pair picker with Load and Models…, the mode, the document pane and the API switch.

It only chooses; loading, generating and serving are the window's, which listens to its
buttons and signals.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (QComboBox, QLabel, QPushButton, QSizePolicy, QStyle, QStyleOptionComboBox,
                               QStylePainter, QToolBar)

from ...engine.vocabulary import Mode
from ...models.gguf import is_assistant, nextn_layers
from .modelchoices import ModelChoice, local_models
from ..chat.richtext import escaped_tooltip
from ..servepanel import ServePanel
from ..look import BUILT_IN, BUILT_IN_MTP, MODE_NAMES
from ..settings import Settings

NO_DRAFT = "(no draft model)"


def models_dialog_class():
    try:
        from .models_dialog import ModelsDialog  # a build may leave the library out; the window works without it
    except ImportError:  # anything else is a bug to see, not a feature to hide
        return None
    return ModelsDialog


class PairCombo(QComboBox):
    """A model picker as wide as the toolbar has room for (16 to 40 characters) that shows a
    long name elided in its middle, so both the model's name and its role ("… (demo target)")
    stay in sight, and whose list shows names whole. (Sized to their longest names, the two pickers pushed Serve API out of a 1280-pixel
    window's toolbar into its overflow menu once it served: the switch to stop it hidden.)"""

    CHARACTERS = 16  # at least; wider where the toolbar has room, up to WIDEST
    WIDEST = 40

    def __init__(self, toolTip: str = "", **kwargs):
        super().__init__(**kwargs)
        self.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(self.CHARACTERS)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.setMaximumWidth(self.fontMetrics().averageCharWidth() * self.WIDEST)
        self.about = toolTip
        self.setToolTip(toolTip)
        # The whole name on hover, where the picker shows it elided; a file's name is shown as
        # written, never read as markup.
        self.currentTextChanged.connect(self.name_tooltip)

    def name_tooltip(self, *_) -> None:
        """The whole name on hover (also after a choice made with signals blocked)."""
        name = self.currentText()
        self.setToolTip(escaped_tooltip(f"{name}\n{self.about}") if name else self.about)

    def shown_text(self) -> str:
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        field = self.style().subControlRect(QStyle.CC_ComboBox, option, QStyle.SC_ComboBoxEditField, self)
        return self.fontMetrics().elidedText(self.currentText(), Qt.ElideMiddle, field.width())

    def paintEvent(self, event):
        painter = QStylePainter(self)
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        painter.drawComplexControl(QStyle.CC_ComboBox, option)
        option.currentText = self.shown_text() if self.currentIndex() >= 0 else self.placeholderText()
        painter.drawControl(QStyle.CE_ComboBoxLabel, option)

    def showPopup(self) -> None:
        names = [self.itemText(i) for i in range(self.count())]
        widest = max((self.fontMetrics().horizontalAdvance(n) for n in names), default=0)
        self.view().setMinimumWidth(widest + 2 * self.style().pixelMetric(QStyle.PM_ScrollBarExtent))
        super().showPopup()


class ModelBar(QToolBar):
    changed = Signal()  # the user picked another mode: the settings are worth saving
    pairReady = Signal(str, str)  # the Models dialog has a pair on disk: target path, draft path ("" for none)
    modelsChanged = Signal()  # the picker was filled anew from the library
    error = Signal(str)

    def __init__(self, parent=None):
        super().__init__("Models", parent)
        self.setObjectName("modelBar")
        self.setMovable(False)
        self.target_combo = PairCombo(objectName="targetCombo", toolTip="Target model: the one whose answer you get")
        self.target_combo.setPlaceholderText("(no model yet)")
        self.draft_combo = PairCombo(objectName="draftCombo",
                                     toolTip="Draft model: a smaller model of the same vocabulary that proposes tokens")
        self.load_button = QPushButton("Load", objectName="loadButton", toolTip="Load the chosen target and draft")
        self.models_button = QPushButton("Models…", objectName="modelsButton")
        self.mode_combo = QComboBox(objectName="modeCombo")
        for mode, label in MODE_NAMES.items():
            self.mode_combo.addItem(label, mode)
        self.mode_combo.setToolTip("Auto: the policy picks the drafter and draft length from measurements.\n"
                                   "Draft model: the small model drafts. Prompt lookup: drafts copied from\n"
                                   "the prompt and answer so far. Built-in (MTP): the target's own multi-token\n"
                                   "prediction head drafts (models with NextN layers). Off: plain decoding.")
        self.document_toggle = QAction("Document", self, checkable=True, toolTip="Show the document pane")
        self.serve_panel = ServePanel()
        self.addWidget(QLabel("Target"))
        self.addWidget(self.target_combo)
        self.addWidget(QLabel("← draft"))
        self.addWidget(self.draft_combo)
        self.addWidget(self.load_button)
        self.addWidget(self.models_button)
        self.addSeparator()
        self.addWidget(QLabel("Mode"))
        self.addWidget(self.mode_combo)
        self.addSeparator()
        self.addAction(self.document_toggle)
        self.widgetForAction(self.document_toggle).setFocusPolicy(Qt.StrongFocus)  # a Tab stop like the rest
        self.addSeparator()
        self.addWidget(self.serve_panel)
        self.models_button.clicked.connect(self.open_models_dialog)
        self.mode_combo.currentIndexChanged.connect(self._on_mode_changed)
        self.target_combo.currentIndexChanged.connect(self._on_target_changed)
        self.draft_combo.currentIndexChanged.connect(self._on_draft_changed)
        self._applying = False
        self._choices: list[ModelChoice] = []
        self._loaded_draft: bool | None = None
        self.models_button.setEnabled(models_dialog_class() is not None)
        if not self.models_button.isEnabled():
            self.models_button.setToolTip("The model library is not part of this build")
        else:
            self.models_button.setToolTip("Find, download and check model pairs")

    def _on_target_changed(self, *_) -> None:
        self._fill_drafts(self.draft_combo.currentData() or "")
        self.draft_combo.name_tooltip()

    def _fill_drafts(self, keep: str) -> None:
        """The draft list for the chosen target: none, Built-in (MTP) exactly when the target has
        NextN layers, then every model but the target itself (no model drafts for itself)."""
        target = self.target_combo.currentData() or ""
        combo = self.draft_combo
        combo.blockSignals(True)
        combo.clear()
        combo.addItem(NO_DRAFT, "")
        if target and nextn_layers(target) > 0:
            combo.addItem(BUILT_IN_MTP, BUILT_IN)
            combo.setItemData(1, "The target's own multi-token prediction head drafts: no draft model",
                              Qt.ToolTipRole)
        for choice in self._choices:
            if choice.path != target:
                combo.addItem(choice.label, choice.path)
        combo.setCurrentIndex(max(0, combo.findData(keep)) if keep != target else 0)
        combo.blockSignals(False)
        self._offer_modes()

    def show_loaded(self, draft_model: bool | None) -> None:
        """What the engine holds: a pair with a draft model (True), without one (False), or nothing
        loaded (None: the modes follow the picker). Draft model mode needs a draft model loaded."""
        self._loaded_draft = draft_model
        self._offer_modes()

    def _offer_modes(self) -> None:
        """Draft model and Built-in (MTP) modes only where the pair can draft that way; picked
        otherwise, they failed only after Send. Each disabled one says why on hover."""
        target, draft = self.target_combo.currentData() or "", self.draft_combo.currentData() or ""
        draft_file = draft not in ("", BUILT_IN)
        # MTP: the target's own NextN layers, or a Gemma 4 assistant as its draft.
        mtp = bool(target) and (nextn_layers(target) > 0 or (draft_file and is_assistant(draft)))
        drafting = (draft_file and not is_assistant(draft)) if self._loaded_draft is None else self._loaded_draft
        self._offer_mode(Mode.MTP, mtp, "This target has no multi-token prediction (NextN) layers of its own, "
                                        "and its draft is no MTP assistant: pick Draft model, Prompt lookup or Auto.")
        self._offer_mode(Mode.DRAFT, drafting, "No draft model is loaded: pick one in the draft list and press "
                                               "Load, or use Prompt lookup or Auto.")

    def _offer_mode(self, mode: Mode, offered: bool, why_not: str) -> None:
        index = self.mode_combo.findData(mode)
        self.mode_combo.model().item(index).setEnabled(offered)
        self.mode_combo.setItemData(index, None if offered else why_not, Qt.ToolTipRole)
        if not offered and self.mode_combo.currentData() == mode:
            self.mode_combo.setCurrentIndex(self.mode_combo.findData(Mode.AUTO))

    def _on_draft_changed(self, *_) -> None:
        """Built-in (MTP) and a Gemma 4 assistant both draft as an MTP head: MTP mode."""
        draft = self.draft_combo.currentData() or ""
        self._offer_modes()
        if (draft == BUILT_IN or (draft and is_assistant(draft))) and not self._applying:
            self.mode_combo.setCurrentIndex(max(0, self.mode_combo.findData(Mode.MTP)))

    def draft_path(self) -> str | None:
        """The chosen draft file; None for none and for Built-in (MTP)."""
        draft = self.draft_combo.currentData() or ""
        return None if draft in ("", BUILT_IN) else draft

    def _on_mode_changed(self, *_) -> None:
        if not self._applying:
            self.changed.emit()

    def apply(self, s: Settings) -> None:
        """Show the saved pair and mode (setting the mode fires currentIndexChanged: not a change)."""
        self._applying = True
        self.refresh_models(s.target, s.draft)
        index = self.mode_combo.findData(s.mode)
        if index < 0 or not self.mode_combo.model().item(index).isEnabled():
            index = self.mode_combo.findData(Mode.AUTO)
        self.mode_combo.setCurrentIndex(index)
        self._applying = False

    def refresh_models(self, target: str = "", draft: str | None = None) -> None:
        """Fill the pair picker from the library, keeping (or setting) the chosen pair."""
        target = target or (self.target_combo.currentData() or "")
        draft = draft if draft is not None else (self.draft_combo.currentData() or "")
        self._choices = local_models()
        # A Gemma 4 assistant drafts on its target's KV cache: a draft, never a target.
        targets = [c for c in self._choices if not is_assistant(c.path)]
        combo = self.target_combo
        combo.blockSignals(True)
        combo.clear()
        for choice in targets:
            combo.addItem(choice.label, choice.path)
        combo.blockSignals(False)
        if not target and targets:
            target = targets[0].path
            if len(self._choices) > 1 and "demo target" in self._choices[0].label:
                draft = draft or self._choices[1].path
        self.select_pair(target, draft or None)
        self.modelsChanged.emit()

    def has_models(self) -> bool:
        """Whether the picker has any model to offer (else the window shows how to get one)."""
        return self.target_combo.count() > 0

    def select_pair(self, target: str, draft: str | None = None) -> None:
        if target:
            self._select(self.target_combo, str(target))
        self._fill_drafts(str(draft) if draft else "")
        if draft == BUILT_IN and self.draft_combo.findData(BUILT_IN) < 0:
            draft = None  # the target has no NextN layers (any more)
        if draft != self.target_combo.currentData():
            self.draft_combo.blockSignals(True)
            self._select(self.draft_combo, str(draft) if draft else "")
            self.draft_combo.blockSignals(False)
        self.target_combo.name_tooltip()
        self.draft_combo.name_tooltip()
        self._on_draft_changed()

    @staticmethod
    def _select(combo: QComboBox, path: str) -> None:
        index = combo.findData(path)
        if index < 0:
            combo.addItem(f"{Path(path).stem}  ·  (not in the library)", path)
            index = combo.count() - 1
        combo.setCurrentIndex(index)

    def open_models_dialog(self) -> None:
        cls = models_dialog_class()
        if cls is None:
            self.error.emit("The model library dialog is not available in this build.")
            return
        try:
            dialog = cls(self.window())
        except Exception as exc:
            self.error.emit(f"The model library could not open: {exc}")
            return
        dialog.pair_ready.connect(self.pairReady)
        dialog.finished.connect(lambda _result: self.refresh_models())  # downloaded, deleted: what is there now
        dialog.open()
