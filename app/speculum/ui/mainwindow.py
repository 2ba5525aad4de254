"""The Speculum window: its panes laid out, and wired to the engine process.

The window owns no model. It loads models in the engine process (``worker.Engine``), keeps
the conversations and what happens when the engine crashes; ``answering.Answering`` writes
the answers. Its parts are public: the model bar, the sidebar's conversations and form, the
chat pane, the speculation pane and the status bar (``load_status``).
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, Qt, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import QMainWindow, QVBoxLayout, QWidget

from .. import paths
from ..conversations import Conversation, ConversationStore
from ..engine.llama import profiles
from ..engine.settings import LoadOptions
from ..errors import SpeculumError
from ..protocol import LoadRequest
from .chat.answer import StagedCycle
from .chat.answering import Answering
from .chat.chatpane import ChatPane
from .chat.conversationlist import ConversationList
from .chat.plaincheck import PlainChecking
from .generationform import GenerationForm
from .library.getmodel import GetModelStep, pick_model_file
from .library.loadstatus import LoadStatus, crash_offer
from .look import window_words
from .library.modelbar import ModelBar
from .apiserving import ApiServing
from .focusring import FocusRing
from .panes import Panes, first_geometry
from .setaside import saved_state_notice
from .settings import Settings
from .speculation.speculationpane import SpeculationPane
from .worker import Engine


class MainWindow(QMainWindow):
    generationFinished = Signal()  # the window has rendered and saved a finished answer (or shown why not)
    modelsLoaded = Signal()
    loadFailed = Signal(str)  # after the window showed the message
    engineDied = Signal()  # after the window kept what it could and offered Reload

    def __init__(self, settings: Settings | None = None, store: ConversationStore | None = None,
                 autoload: bool = True):
        super().__init__()
        self.settings = settings or Settings.load()
        self.store = store or ConversationStore()
        self.engine = Engine(self, exact=self.settings.exact)
        self.gpu: str | None = None  # the engine process reports its backend once it has started
        self.loaded = self.loading = False
        self._crash: tuple | None = None  # the banner's message and actions after an engine crash, until a load
        self._connect_engine()  # before anything slow: the process reports "ready" once, as soon as it starts

        self.setWindowTitle("Speculum")
        self.setObjectName("mainWindow")
        self._build()
        self.focus_ring = FocusRing(self)  # where the keyboard is, on every control
        self.answering = Answering(self)
        self.answering.finished.connect(self.generationFinished)
        self.plain_checking = PlainChecking(self)
        self._connect()
        self.model_bar.apply(self.settings)
        self.show_get_model()
        self.generation_form.apply(self.settings)
        self.open_conversation(self.conversations.load(self.settings.conversation))
        style = paths.resource("style.qss")
        if style.is_file():
            self.setStyleSheet(style.read_text(encoding="utf-8"))
        if not (self.settings.geometry and self.restoreGeometry(QByteArray.fromHex(self.settings.geometry.encode()))):
            self.setGeometry(first_geometry(self.screen().availableGeometry()))
        self.panes.restore(self.settings.panes)
        if autoload and self.model_bar.target_combo.currentData():
            self.load_pair()
        notice = saved_state_notice()
        if notice:
            self.chat.banner.show_message(notice, kind="info")

    # ------------------------------------------------------------------ layout

    def _build(self) -> None:
        self.model_bar = ModelBar(self)
        self.addToolBar(self.model_bar)
        # Left: conversations and settings.
        self.conversations = ConversationList(self.store)
        self.generation_form = GenerationForm()
        left = QWidget(objectName="sidebar")
        lay = QVBoxLayout(left)
        lay.addWidget(self.conversations, 1)
        lay.addWidget(self.generation_form)
        self.chat = ChatPane()
        self.get_model = GetModelStep()  # over the chat while there is no model at all
        self.chat.layout().insertWidget(0, self.get_model)
        self.speculation_pane = SpeculationPane(self.chat.transcript)
        self.panes = Panes(left, self.chat, self.speculation_pane, self.speculation_pane.stats)
        self.setCentralWidget(self.panes)
        menu = self.menuBar().addMenu("&File")
        menu.setToolTipsVisible(True)
        self.open_action = QAction("&Open model…", self, shortcut=QKeySequence.Open, triggered=self.open_model,
                                   toolTip="Load a GGUF model file from this computer as the target")
        self.settings_action = QAction("&Settings…", self, shortcut=QKeySequence("Ctrl+,"),
                                       menuRole=QAction.PreferencesRole, triggered=self.open_settings,
                                       toolTip="The prompt cache and the n-gram memory: what is kept between prompts")
        quit_action = QAction("&Quit", self, shortcut=QKeySequence.Quit, menuRole=QAction.QuitRole,
                              triggered=self.close, toolTip="Close the window; the conversations are kept")
        menu.addActions([self.open_action, self.settings_action, quit_action])
        view = self.menuBar().addMenu("&View")
        view.setToolTipsVisible(True)
        self.enlarge_action = QAction("&Enlarge the live view", self, checkable=True, shortcut=QKeySequence("F11"),
                                      toggled=self.panes.enlarge,
                                      toolTip="The speculation view across the whole window; again to go back")
        view.addAction(self.enlarge_action)
        self.panes.enlarged.connect(self.enlarge_action.setChecked)
        self.panes.enlarged.connect(self._show_enlarged)
        self.speculation_pane.enlarge_button.toggled.connect(self.panes.enlarge)
        # Status bar: what runs where, and load progress.
        self.load_status = LoadStatus()
        self.setStatusBar(self.load_status)
        self._show_backend(None)

    def _connect_engine(self) -> None:
        w = self.engine.worker
        w.ready.connect(self._on_engine_ready)
        w.died.connect(self._on_engine_died)
        w.loaded.connect(self._on_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.plainRateMeasured.connect(self._on_plain_rate)

    def _connect(self) -> None:
        bar, chat = self.model_bar, self.chat
        self.serving = ApiServing(self.engine, bar.serve_panel, self.speculation_pane, self.load_status,
                                  lambda: self.loaded, lambda: self.generating, bar.mode_combo.currentData, self)
        self.serving.error.connect(self.show_error)
        self.engine.worker.loadProgress.connect(self.load_status.show_load_progress)
        self.engine.worker.measuring.connect(self.load_status.show_measuring)
        self.load_status.postponeMeasuring.connect(self.engine.postpone_measuring)
        chat.input.typed.connect(self.engine.user_typed)  # measuring this machine waits while the user types
        bar.load_button.clicked.connect(self.load_pair)
        self.load_status.cancel_button.clicked.connect(self.cancel_load)
        bar.pairReady.connect(self._on_pair_ready)
        bar.modelsChanged.connect(self.show_get_model)
        bar.target_combo.currentIndexChanged.connect(self.update_controls)  # Load needs a target
        self.get_model.modelsRequested.connect(bar.open_models_dialog)
        self.get_model.openRequested.connect(self.open_model)
        bar.error.connect(self.show_error)
        chat.sendRequested.connect(self.send)
        chat.stopRequested.connect(self.stop)
        QShortcut(QKeySequence(Qt.Key_Escape), self, activated=self.stop)
        self.conversations.picked.connect(self.open_conversation)
        self.conversations.created.connect(self._on_conversation_created)
        self.conversations.deleteRequested.connect(lambda: self.delete_conversation())
        self.conversations.error.connect(self.show_error)
        chat.document.summariseRequested.connect(self.summarise)
        chat.document.editor.textChanged.connect(self.update_controls)  # Summarise needs text, and no generation
        chat.document.error.connect(self.show_error)
        bar.document_toggle.toggled.connect(chat.show_document)
        chat.transcript.replayRequested.connect(self.replay_message)
        chat.transcript.continueRequested.connect(self.answering.continue_answer)
        chat.transcript.checkRequested.connect(self.plain_checking.check)
        bar.changed.connect(self.save_settings)
        self.generation_form.changed.connect(self.save_settings)

    # ------------------------------------------------------------------ settings

    def save_settings(self, *_):
        s = self.settings
        s.mode = self.model_bar.mode_combo.currentData()
        self.generation_form.store(s)
        s.conversation = self.current.id if self.current else ""
        try:
            s.save()
        except OSError as exc:
            self.show_error(f"Could not save the settings: {exc.strerror or exc}.")

    def open_settings(self):
        """File ▸ Settings…: the memory settings, saved on OK; they apply at the next Load."""
        from .settingsdialog import SettingsDialog

        dialog = SettingsDialog(self.settings, self)
        dialog.accepted.connect(self.save_settings)
        dialog.open()
        return dialog

    # ------------------------------------------------------------------ models

    def set_pair(self, target: str, draft: str | None = None, load: bool = True) -> None:
        self.model_bar.select_pair(target, draft)
        if load:
            self.load_pair()

    def load_pair(self, profile: profiles.Profile | None = None, why: str = "") -> None:
        """Load the chosen pair; ``profile`` (with ``why``) when the user picked a safer one after a crash."""
        target = self.model_bar.target_combo.currentData()
        if not target:
            self.show_error("Pick a target model first (or use Models… to get one).")
            return
        if self.generating or self.plain_checking.busy:
            self.show_error("Stop the generation (or the check) before loading other models.")
            return
        draft = self.model_bar.draft_path()  # None for none and for Built-in (MTP)
        try:
            workers = self.generation_form.rpc_workers()
        except SpeculumError as exc:
            return self.show_error(str(exc))
        target_layers, draft_layers = self.generation_form.gpu_layers()
        options = LoadOptions(n_ctx=self.generation_form.n_ctx.value(), target_gpu_layers=target_layers,
                              draft_gpu_layers=draft_layers, rpc=workers,
                              prompt_cache_mib=self.settings.prompt_cache_budget(),
                              ngram_memory=self.settings.ngram_memory)
        request = LoadRequest(str(target), str(draft) if draft else None, options)
        self.settings.target = request.target
        self.settings.draft = request.draft or self.model_bar.draft_combo.currentData() or ""
        self.save_settings()
        self._crash = None
        self.chat.banner.hide()
        self.loaded = False
        self.loading = True
        self.update_controls()
        self.load_status.begin_load()
        self.serving.stopped()
        self.model_bar.show_loaded(None)
        self.engine.exact = self.settings.exact  # (a change starts a fresh engine process)
        self.engine.load(request, profile, why)

    def cancel_load(self) -> None:
        self.engine.cancel_load()
        self.load_status.cancel_button.setEnabled(False)

    def _on_loaded(self, target, draft) -> None:
        self.loading = False
        self.loaded = True
        self.load_status.end_load()
        self.load_status.show_pair(target, draft)
        self.model_bar.show_loaded(draft is not None)  # Draft model mode needs a draft model
        self._show_backend(target)
        self.engine.set_plain_rate(self.settings.plain_tokens_per_s.get(target.path))
        self.update_controls()
        self.serving.models_loaded()
        self.modelsLoaded.emit()

    def _on_load_failed(self, message: str) -> None:
        self.loading = False
        self.loaded = False
        self.load_status.end_load("No model loaded")
        self.model_bar.show_loaded(None)
        self.show_error(message)
        self.update_controls()
        self.loadFailed.emit(message)

    def _on_engine_ready(self, gpu: str | None, _threads: dict) -> None:
        self.gpu = gpu
        self.generation_form.show_gpu(gpu)
        if not self.loaded:
            self._show_backend(None)

    def _on_engine_died(self, death) -> None:
        """The engine process crashed: keep the window, the conversation and the answer so far."""
        if self.answering.keep_partial(f"The engine stopped: {death.how}. The answer so far is kept."):
            if self.current is not None:
                self.chat.transcript.show_messages(self.current.messages)
                self.replay_last()  # the kept answer replays like any other
        self.loading = False
        self.loaded = False
        self.load_status.end_load("No model loaded: the engine stopped")
        self.model_bar.show_loaded(None)
        self.load_status.show_measuring(False)
        self.serving.engine_died()
        self._show_backend(None)
        message, safer, why = crash_offer(death, bool(self.gpu))
        if self.serving.resume_port is not None:
            message += f" Reloading serves the API again on port {self.serving.resume_port}."
        actions = [("Reload", self.load_pair)]
        if safer is not None:
            actions.insert(0, (f"Reload with the {safer.name} profile", lambda: self.load_pair(profile=safer, why=why)))
        self._crash = (message, actions)  # shown until the user reloads
        self.show_error(message, actions)
        self.update_controls()
        self.engineDied.emit()

    def _show_backend(self, facts) -> None:
        self.load_status.show_backend(facts, self.gpu, self.engine.profile, self.engine.profile_why)

    def _on_plain_rate(self, target: str, tokens_per_s: float) -> None:
        self.settings.plain_tokens_per_s[target] = round(tokens_per_s, 3)

    def _on_pair_ready(self, target, draft) -> None:
        self.model_bar.refresh_models(str(target), str(draft) if draft else "")
        self.show_get_model()
        self.load_pair()

    def _show_enlarged(self, on: bool) -> None:
        button = self.speculation_pane.enlarge_button
        button.setChecked(on)
        button.setText("Back to the chat" if on else "Enlarge")

    def open_model(self) -> None:
        """File ▸ Open model… (and the first step's Open…): a GGUF file as the target, loaded."""
        path = pick_model_file(self)
        if path:
            self.model_bar.refresh_models(path, "")
            self.show_get_model()
            self.load_pair()

    def show_get_model(self) -> None:
        """The "get a model" step stands over the chat while the picker has no model to offer."""
        self.get_model.setVisible(not self.model_bar.has_models())

    # ------------------------------------------------------------------ conversations

    @property
    def current(self) -> Conversation | None:
        return self.conversations.current

    def open_conversation(self, conversation_id: str) -> None:
        conv = self.conversations.open(conversation_id)
        if conv is None:
            return
        self.chat.transcript.show_messages(conv.messages)
        self.chat.document.set_document(conv.document, conv.document_name)
        self.chat.document.highlight(conv.document_copies)  # what its summary copied, as it was shown
        if conv.document:
            self.model_bar.document_toggle.setChecked(True)
        self.replay_last()
        self.plain_checking.show_for(conv.id)
        self.settings.conversation = conv.id
        self.save_settings()

    def replay_last(self) -> None:
        """The speculation view, stats and replay bar show the conversation's last answer, finished."""
        self.speculation_pane.clear()
        messages = self.current.messages if self.current is not None else []
        last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].cycles), None)
        if last is not None:
            self.replay_message(last, step=None)
        else:
            self.speculation_pane.replay.clear()

    def new_conversation(self) -> Conversation:
        return self.conversations.create()  # opened by _on_conversation_created

    def _on_conversation_created(self, conversation_id: str) -> None:
        self.open_conversation(conversation_id)
        self.chat.input.setFocus()

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        self.conversations.rename(conversation_id, title)

    def delete_conversation(self, conversation_id: str | None = None, confirm: bool = True) -> None:
        conv = self.conversations.conversation(conversation_id) if conversation_id else self.current
        if conv is None:
            return
        live = self.answering.live
        if live is not None and live.conversation is conv:
            self.show_error("Stop the generation before deleting its conversation.")
            return
        next_id = self.conversations.delete(conv, confirm)
        if next_id is not None:
            self.open_conversation(next_id)

    def replay_message(self, index: int, step: int | None = 0, staged: list[StagedCycle] | None = None) -> None:
        """Load an answer's cycle records into the replay bar; step 0 starts before the first cycle.
        ``staged``: the answer's cycles when at hand (just generated), so its records are not read back."""
        if self.generating or self.current is None or not (0 <= index < len(self.current.messages)):
            return
        self.speculation_pane.replay.load(self.current, index, step,
                                          self.settings.plain_tokens_per_s.get(self.settings.target), staged)

    # ------------------------------------------------------------------ generating

    @property
    def generating(self) -> bool:
        return self.answering.generating

    def send(self, text: str) -> None:
        self.answering.send(text)

    def summarise(self) -> None:
        self.answering.summarise()

    def update_controls(self) -> None:
        self.chat.set_busy(self.generating or self.plain_checking.busy, self.loading)
        self.model_bar.load_button.setEnabled(not (self.generating or self.loading or self.plain_checking.busy)
                                              and bool(self.model_bar.target_combo.currentData()))
        self.conversations.set_generating(self.generating)

    def can_generate(self) -> bool:
        """Whether an answer can start now; if not (and not because one is being written), says why."""
        if self.generating:
            return False
        if self.plain_checking.busy:
            self.show_error("The engine is checking an answer against plain decoding: wait for it, or Cancel it.")
            return False
        if self.loading:
            self.show_error("The models are still loading.")
            return False
        if not self.loaded:
            if self._crash is not None:  # its Reload is the way on: the banner stays as it was
                self.show_error(*self._crash)
            elif not self.model_bar.has_models():
                self.show_error("There is no model yet: get one with one of the three ways above.")
            else:
                self.show_error("No model is loaded. Pick a target model (and a draft) above and press Load.")
            return False
        return True

    def stop(self) -> None:
        """Esc: stop the answer being written, or the load; else leave a replay for the final answer."""
        replay = self.speculation_pane.replay
        if self.generating:
            self.answering.stop()
        elif self.plain_checking.busy:
            self.plain_checking.cancel()
        elif self.loading:
            self.cancel_load()
        elif replay.state is not None and not replay.bar.at_end:
            replay.bar.to_end()

    # ------------------------------------------------------------------ errors and closing

    def show_error(self, message: str, actions=()) -> None:
        self.chat.banner.show_message(window_words(message), actions=actions)

    def closeEvent(self, event) -> None:
        if self.generating:
            # Closing mid-generation: keep the partial answer, as Stop would.
            self.engine.stop()
            self.answering.keep_partial("Stopped when the window closed; the answer so far is kept.")
        self.settings.geometry = bytes(self.saveGeometry().toHex()).decode()
        self.settings.panes = self.panes.shares()
        self.save_settings()
        self.engine.shutdown()
        super().closeEvent(event)
