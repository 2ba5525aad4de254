"""The Speculum window: its panes laid out, and wired to the engine process.

The window owns no model. It sends requests to the engine (``worker.Engine``) and hands
what comes back to its panes: batches of Cycle events while an answer is written (the
live answer, kept here), a result at the end, or a message in the banner.
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QMargins, QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QFrame, QMainWindow, QScrollArea, QSplitter, QVBoxLayout, QWidget

from .. import paths
from ..conversations import Conversation, ConversationStore, Message
from ..engine import profiles
from ..engine.vocabulary import Finish
from ..errors import SpeculumError
from .answer import (LiveAnswer, StagedCycle, cycle_records, document_question, extend_answer, finished_answer,
                     with_stages)
from .chatpane import ChatPane
from .conversationlist import ConversationList
from .generationform import GenerationForm
from .loadstatus import LoadStatus, crash_offer
from .look import window_words
from .modelbar import ModelBar
from .serving import ApiServing
from .setaside import saved_state_notice
from .settings import Settings
from .speculationpane import SpeculationPane
from .worker import Engine, GenerationRequest, LoadRequest

# While generating (the speculation view updates every frame, see worker.FRAME_MS):
ANSWER_UPDATE_MS = 200  # the Markdown answer
STATS_UPDATE_MS = 1000  # the stats panel's numbers, bars and chart: a meter, read once a second
# Where llama.cpp fills every core, the Markdown answer is redrawn with the stats (see
# worker.Engine._on_loaded): the speculation view still shows each token within a frame.
ANSWER_UPDATE_CORES_FULL_MS = STATS_UPDATE_MS


class Scrolling(QScrollArea):
    """A side pane that scrolls up and down only when the window is shorter than the pane's
    minimum, and otherwise fills the height as before. (The side panes asked for 650 pixels, so
    the window could not be made shorter than 714: taller than a 1366x768 screen at 125% scale,
    whose input box went off its bottom. Left to QScrollArea's own sizing, a pane with wrapping
    labels took its preferred height, and a 760-pixel window scrolled its stats.)"""

    def __init__(self, pane: QWidget):
        super().__init__()
        self.setWidget(pane)
        self.setFrameShape(QFrame.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self._bar = self.verticalScrollBar().sizeHint().width()
        self.setMinimumWidth(pane.minimumSizeHint().width() + self._bar)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        pane = self.widget()
        need = pane.minimumSizeHint().height()
        pane.resize(self.width() - (self._bar if need > self.height() else 0), max(self.height(), need))


FIRST_SIZE = QSize(1440, 900)  # what the window asks for on a screen with room
FRAME = QMargins(8, 40, 8, 8)  # what a window manager may add around the window: borders, a title bar


def first_geometry(area: QRect) -> QRect:
    """The window at its first start: its usual size where the screen has room, else the screen's
    free area less a frame, centred in it (a 1366x768 screen got 1440x900, and lost Send)."""
    room = area.marginsRemoved(FRAME)
    rect = QRect(QPoint(0, 0), FIRST_SIZE.boundedTo(room.size()))
    rect.moveCenter(room.center())
    return rect


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
        self.engine = Engine(self)
        self.gpu: str | None = None  # the engine process reports its backend once it has started
        self.loaded = self.loading = self.generating = False
        self._live: LiveAnswer | None = None
        self._crash: tuple | None = None  # the banner's message and actions after an engine crash, until a load
        self._connect_engine()  # before anything slow: the process reports "ready" once, as soon as it starts

        self.setWindowTitle("Speculum")
        self.setObjectName("mainWindow")
        self._build()
        self._connect()
        self.model_bar.apply(self.settings)
        self.generation_form.apply(self.settings)
        self.open_conversation(self.conversations.load(self.settings.conversation))
        style = paths.resource("style.qss")
        if style.is_file():
            self.setStyleSheet(style.read_text(encoding="utf-8"))
        if not (self.settings.geometry and self.restoreGeometry(QByteArray.fromHex(self.settings.geometry.encode()))):
            self.setGeometry(first_geometry(self.screen().availableGeometry()))
        if autoload and self.target_combo.currentData():
            self.load_pair()
        notice = saved_state_notice()
        if notice:
            self.banner.show_message(notice, kind="info")

    # ------------------------------------------------------------------ layout

    def _build(self) -> None:
        bar = self.model_bar = ModelBar(self)
        self.addToolBar(bar)
        self.target_combo, self.draft_combo, self.mode_combo = bar.target_combo, bar.draft_combo, bar.mode_combo
        self.load_button, self.models_button = bar.load_button, bar.models_button
        self.document_toggle, self.serve_panel = bar.document_toggle, bar.serve_panel

        # Left: conversations and settings.
        self.conversations = ConversationList(self.store)
        self.conversation_list = self.conversations.view
        self.new_button = self.conversations.new_button
        form = self.generation_form = GenerationForm()
        self.temperature, self.top_p, self.max_tokens = form.temperature, form.top_p, form.max_tokens
        self.k_spin = form.k_spin
        left = QWidget(objectName="sidebar")
        lay = QVBoxLayout(left)
        lay.addWidget(self.conversations, 1)
        lay.addWidget(self.generation_form)

        chat = self.chat = ChatPane()
        self.banner, self.transcript, self.document = chat.banner, chat.transcript, chat.document
        self.input = chat.input
        self.send_button, self.stop_button = chat.send_button, chat.stop_button
        pane = self.speculation_pane = SpeculationPane(self.transcript)
        self.speculation, self.stats, self.replay = pane.speculation, pane.stats, pane.replay
        self.replay_bar, self.replay_label = self.replay.bar, self.replay.label

        split = QSplitter(Qt.Horizontal)
        split.addWidget(Scrolling(left))
        split.addWidget(self.chat)
        split.addWidget(Scrolling(self.speculation_pane))
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 3)
        split.setStretchFactor(2, 2)
        split.setSizes([250, 660, 530])
        self.setCentralWidget(split)

        # Status bar: what runs where, and load progress.
        status = self.load_status = LoadStatus()
        self.setStatusBar(status)
        self.model_label, self.backend_label = status.model_label, status.backend_label
        self.load_progress, self.cancel_button = status.load_progress, status.cancel_button
        self._show_backend(None)

    def _connect_engine(self) -> None:
        w = self.engine.worker
        w.ready.connect(self._on_engine_ready)
        w.died.connect(self._on_engine_died)
        w.loaded.connect(self._on_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        w.stageChanged.connect(self._on_stage)
        w.promptProgress.connect(self._on_prompt_progress)
        w.plainRateMeasured.connect(self._on_plain_rate)
        self.engine.batcher.batchReady.connect(self._on_batch)

    def _connect(self) -> None:
        self.serving = ApiServing(self.engine, self.serve_panel, self.speculation_pane, self.load_status,
                                  lambda: self.loaded, lambda: self.generating, self.mode_combo.currentData, self)
        self.serving.error.connect(self.show_error)
        self.engine.worker.loadProgress.connect(self.load_status.show_load_progress)
        self.engine.worker.measuring.connect(self.load_status.show_measuring)
        self.load_button.clicked.connect(self.load_pair)
        self.cancel_button.clicked.connect(self.cancel_load)
        self.model_bar.pairReady.connect(self._on_pair_ready)
        self.model_bar.error.connect(self.show_error)
        self.chat.sendRequested.connect(self.send)
        self.chat.stopRequested.connect(self.stop)
        QShortcut(QKeySequence(Qt.Key_Escape), self, activated=self.stop)
        self.conversations.picked.connect(self.open_conversation)
        self.conversations.created.connect(self._on_conversation_created)
        self.conversations.deleteRequested.connect(lambda: self.delete_conversation())
        self.conversations.error.connect(self.show_error)
        self.document.summariseRequested.connect(self.summarise)
        self.document.editor.textChanged.connect(self._update_controls)  # Summarise needs text, and no generation
        self.document.error.connect(self.show_error)
        self.document_toggle.toggled.connect(self.chat.show_document)
        self.transcript.replayRequested.connect(self.replay_message)
        self.transcript.continueRequested.connect(self.continue_answer)
        self.model_bar.changed.connect(self._save_settings)
        self.generation_form.changed.connect(self._save_settings)

    # ------------------------------------------------------------------ settings

    def _save_settings(self, *_):
        s = self.settings
        s.mode = self.mode_combo.currentData()
        self.generation_form.store(s)
        s.conversation = self.current.id if self.current else ""
        try:
            s.save()
        except OSError as exc:
            self.show_error(f"Could not save the settings: {exc.strerror or exc}.")

    # ------------------------------------------------------------------ models

    def set_pair(self, target: str, draft: str | None = None, load: bool = True) -> None:
        self.model_bar.select_pair(target, draft)
        if load:
            self.load_pair()

    def load_pair(self, profile: profiles.Profile | None = None, why: str = "") -> None:
        """Load the chosen pair; ``profile`` (with ``why``) when the user picked a safer one after a crash."""
        target = self.target_combo.currentData()
        if not target:
            self.show_error("Pick a target model first (or use Models… to get one).")
            return
        if self.generating:
            self.show_error("Stop the generation before loading other models.")
            return
        draft = self.model_bar.draft_path()  # None for none and for Built-in (MTP)
        try:
            workers = self.generation_form.rpc_workers()
        except SpeculumError as exc:
            return self.show_error(str(exc))
        request = LoadRequest(str(target), str(draft) if draft else None, self.generation_form.n_ctx.value(),
                              *self.generation_form.gpu_layers(), rpc=workers)
        self.settings.target, self.settings.draft = request.target, request.draft or self.draft_combo.currentData() or ""
        self._save_settings()
        self._crash = None
        self.banner.hide()
        self.loaded = False
        self.loading = True
        self._update_controls()
        self.load_status.begin_load()
        self.serving.stopped()
        self.engine.load(request, profile, why)

    def cancel_load(self) -> None:
        self.engine.cancel_load()
        self.cancel_button.setEnabled(False)

    def _on_loaded(self, target, draft) -> None:
        self.loading = False
        self.loaded = True
        self.load_status.end_load()
        self.load_status.show_pair(target, draft)
        self._show_backend(target)
        self.engine.set_plain_rate(self.settings.plain_tokens_per_s.get(target.path))
        self._update_controls()
        self.serving.models_loaded()
        self.modelsLoaded.emit()

    def _on_load_failed(self, message: str) -> None:
        self.loading = False
        self.loaded = False
        self.load_status.end_load("No model loaded")
        self.show_error(message)
        self._update_controls()
        self.loadFailed.emit(message)

    def _on_engine_ready(self, gpu: str | None, _threads: dict) -> None:
        self.gpu = gpu
        self.generation_form.show_gpu(gpu)
        if not self.loaded:
            self._show_backend(None)

    def _on_engine_died(self, death) -> None:
        """The engine process crashed: keep the window, the conversation and the answer so far."""
        if self._live is not None:
            note = f"The engine stopped: {death.how}. The answer so far is kept."
            self._keep_partial_answer(self._end_generation(), note)
            if self.current is not None:
                self.transcript.show_messages(self.current.messages)
                self._replay_last()  # the kept answer replays like any other
        self.loading = False
        self.loaded = False
        self.load_status.end_load("No model loaded: the engine stopped")
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
        self._update_controls()
        self.engineDied.emit()

    def _show_backend(self, facts) -> None:
        self.load_status.show_backend(facts, self.gpu, self.engine.profile, self.engine.profile_why)

    def _on_plain_rate(self, target: str, tokens_per_s: float) -> None:
        self.settings.plain_tokens_per_s[target] = round(tokens_per_s, 3)

    def _on_pair_ready(self, target, draft) -> None:
        self.model_bar.refresh_models(str(target), str(draft) if draft else "")
        self.load_pair()

    # ------------------------------------------------------------------ conversations

    @property
    def current(self) -> Conversation | None:
        return self.conversations.current

    def open_conversation(self, conversation_id: str) -> None:
        conv = self.conversations.open(conversation_id)
        if conv is None:
            return
        self.transcript.show_messages(conv.messages)
        self.document.set_document(conv.document, conv.document_name)
        if conv.document:
            self.document_toggle.setChecked(True)
        self._replay_last()
        self.settings.conversation = conv.id
        self._save_settings()

    def _replay_last(self) -> None:
        """The speculation view, stats and replay bar show the conversation's last answer, finished."""
        self.speculation_pane.clear()
        messages = self.current.messages if self.current is not None else []
        last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].cycles), None)
        if last is not None:
            self.replay_message(last, step=None)
        else:
            self.replay.clear()

    def new_conversation(self) -> Conversation:
        return self.conversations.create()  # opened by _on_conversation_created

    def _on_conversation_created(self, conversation_id: str) -> None:
        self.open_conversation(conversation_id)
        self.input.setFocus()

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        self.conversations.rename(conversation_id, title)

    def delete_conversation(self, conversation_id: str | None = None, confirm: bool = True) -> None:
        conv = self.conversations.conversation(conversation_id) if conversation_id else self.current
        if conv is None:
            return
        if self.generating and self._live and self._live.conversation is conv:
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
        self.replay.load(self.current, index, step, self.settings.plain_tokens_per_s.get(self.settings.target),
                         staged)

    # ------------------------------------------------------------------ generating

    def _update_controls(self) -> None:
        self.chat.set_busy(self.generating, self.loading)
        self.load_button.setEnabled(not (self.generating or self.loading))
        self.conversations.set_generating(self.generating)

    def _can_generate(self) -> bool:
        if self.generating:
            return False
        if self.loading:
            self.show_error("The models are still loading.")
            return False
        if not self.loaded:
            if self._crash is not None:  # its Reload is the way on: the banner stays as it was
                self.show_error(*self._crash)
            else:
                self.show_error("No model is loaded. Pick a target model (and a draft) above and press Load.")
            return False
        return True

    def send(self, text: str) -> None:
        text = text.strip()
        if not text or not self._can_generate():
            return
        conv = self.current
        conv.messages.append(Message("user", text))
        self.conversations.title_from_question(conv, text)
        self.input.clear()
        self._begin(conv, self.generation_form.request(conv, self.mode_combo.currentData()), "chat", text)
        # Saved once the engine has the request: the first token does not wait for the disk, and
        # the question still survives a crash (only the answer being written can be lost).
        self.conversations.save(conv)

    def summarise(self) -> None:
        text = self.document.text()
        if not text.strip():
            self.show_error("The document is empty: paste text or open a file first.")
            return
        if not self._can_generate():
            return
        conv = self.current
        conv.document, conv.document_name = text, self.document.name
        name = self.document.name or "the pasted document"
        conv.messages.append(document_question(text, name))
        self.conversations.title_from_document(conv, name)
        self.document_toggle.setChecked(True)
        self._begin(conv, self.generation_form.request(conv, self.mode_combo.currentData(), document=text), "summary")
        self.conversations.save(conv)  # after the request, as in send

    def continue_answer(self, index: int) -> None:
        """Write on from the last answer, stopped at the user's token limit: the same answer grows
        (its tokens follow the prompt again, so the engine reads nothing twice)."""
        conv = self.current
        if conv is None or index != len(conv.messages) - 1 or conv.messages[index].finish != Finish.MAX_TOKENS:
            return
        if not self._can_generate():
            return
        answer = conv.messages[index]
        request = self.generation_form.request(conv, self.mode_combo.currentData())
        request.messages = conv.history(before=index)
        request.continues = [t for record in answer.cycles for t in record.get("emitted", [])]
        self._begin(conv, request, "chat", continues=index)

    def _begin(self, conv: Conversation, request: GenerationRequest, kind: str, restore: str = "",
               continues: int | None = None) -> None:
        self.banner.hide()
        self.generating = True
        self._update_controls()
        shown = conv.messages if continues is None else conv.messages[:continues]
        before = conv.messages[continues].content if continues is not None else ""
        self._live = LiveAnswer(conv, kind, restore, continues, before)
        self.replay.clear("Generating…")
        self.chat.begin_answer(shown)
        if self._live.before:
            self.transcript.update_answer(self._live.before)
        self.speculation_pane.clear()
        self.engine.generate(request)

    def stop(self) -> None:
        """Esc: stop the answer being written, or the load; else leave a replay for the final answer."""
        if self.generating:
            self.engine.stop()
            self.stop_button.setEnabled(False)
            self.replay_label.setText("Stopping after this target pass…")
        elif self.loading:
            self.cancel_load()
        elif self.replay.state is not None and not self.replay_bar.at_end:
            self.replay_bar.to_end()

    def _on_stage(self, stage: str) -> None:
        self.document.show_progress(f"Summarising in parts: {stage}…")
        self.statusBar().showMessage(f"Summarising in parts: {stage}")

    def _on_prompt_progress(self, read: int, total: int) -> None:
        if self._live is not None:
            self.chat.show_prompt_progress(read, total)

    def _on_batch(self, events: list) -> None:
        live = self._live
        if live is None:
            return
        self.chat.prompt_read()
        live.events.extend(events)
        # The speculation view is the live one, every frame. The Markdown answer and the stats
        # panel are re-rendered less often: each costs the UI thread more than a frame of tokens.
        self.speculation_pane.add_events(events)
        if live.answer_due(ANSWER_UPDATE_CORES_FULL_MS if self.engine.cores_full else ANSWER_UPDATE_MS):
            self.transcript.update_answer(live.text)
        if live.stats_due(STATS_UPDATE_MS):
            self.speculation_pane.show_snapshot(live.snapshot)

    def _on_finished(self, result) -> None:
        live = self._end_generation()  # the answer itself is drawn below, whole, with the conversation
        conv = self.conversations.conversation(result.conversation_id) or (live and live.conversation)
        if conv is None:
            self._update_controls()
            return
        staged = with_stages(result.cycles, live.events if live else [])
        if live is not None and live.continues is not None:
            index = live.continues
            done = finished_answer(conv, result, [])
            extend_answer(conv.messages[index], result.text, staged, done.finish, done.note)
            staged = None  # replayed from the whole answer's records
        else:
            index = len(conv.messages)
            conv.messages.append(finished_answer(conv, result, cycle_records(staged)))
        self.conversations.save(conv)
        self._save_settings()
        if conv is self.current:
            self.transcript.show_messages(conv.messages)
            if live and live.kind == "summary":
                self.chat.highlight_copies(result.cycles)
            self.replay_message(index, step=None, staged=staged)
        self._update_controls()
        self.generationFinished.emit()

    def _end_generation(self) -> LiveAnswer | None:
        """The answer stops being written: the one that was, with the cycles still waiting for a frame."""
        self.engine.batcher.flush()
        live, self._live = self._live, None
        self.generating = False
        self.document.show_progress("")
        self.chat.prompt_progress.hide()
        self.statusBar().clearMessage()
        return live

    def _on_failed(self, message: str) -> None:
        live = self._end_generation()
        if live is not None:
            conv = live.conversation
            # The question goes back to the box so nothing typed is lost; the conversation is unchanged.
            if live.continues is None and conv.messages and conv.messages[-1].role == "user":
                conv.messages.pop()
                self.conversations.save(conv)
            self.chat.restore_question(live.restore)
            if conv is self.current:
                self.transcript.show_messages(conv.messages)
        self._replay_last()  # the previous answer's stats and view, as they were before Send
        self.show_error(message)
        self._update_controls()
        self.generationFinished.emit()

    # ------------------------------------------------------------------ errors and closing

    def show_error(self, message: str, actions=()) -> None:
        self.banner.show_message(window_words(message), actions=actions)

    def _keep_partial_answer(self, live: LiveAnswer, note: str) -> None:
        if live.keep_partial(self.mode_combo.currentData(), note):
            self.conversations.save(live.conversation)

    def closeEvent(self, event) -> None:
        if self._live is not None:
            # Closing mid-generation: keep the partial answer, as Stop would.
            self.engine.stop()
            live, self._live = self._live, None
            self._keep_partial_answer(live, "Stopped when the window closed; the answer so far is kept.")
        self.settings.geometry = bytes(self.saveGeometry().toHex()).decode()
        self._save_settings()
        self.engine.shutdown()
        super().closeEvent(event)
