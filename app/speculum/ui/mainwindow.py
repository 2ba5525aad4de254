"""The Speculum window: pair picker, conversations, transcript, speculation view, stats, replay.

The window owns no model. It sends requests to the engine thread (``worker.Engine``)
and renders what comes back: batches of Cycle events while generating, a result at the
end, or an error message shown in the window's banner.
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QElapsedTimer, Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QMainWindow, QSplitter, QVBoxLayout, QWidget

from .. import paths, summarise
from ..conversations import Conversation, ConversationStore, Message
from ..engine import profiles
from .answer import LiveAnswer, answer_so_far, answer_stats, cycle_records, with_stages
from .chatpane import ChatPane
from .conversationlist import ConversationList
from .generationform import GenerationForm
from .loadstatus import LoadStatus
from .modelbar import ModelBar
from .setaside import saved_state_notice
from .settings import Settings
from .speculationpane import SpeculationPane
from .worker import Engine, GenerationRequest, LoadRequest

# While generating (the speculation view updates every frame, see worker.FRAME_MS):
ANSWER_UPDATE_MS = 200  # the Markdown answer
STATS_UPDATE_MS = 1000  # the stats panel's numbers, bars and chart: a meter, read once a second


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
        self.loaded = False
        self.loading = False
        self.generating = False
        self._live: LiveAnswer | None = None

        self.setWindowTitle("Speculum")
        self.setObjectName("mainWindow")
        self.resize(1440, 900)
        self._build()
        self._connect()
        self._apply_settings()
        self.open_conversation(self.conversations.load(self.settings.conversation))
        style = paths.resource("style.qss")
        if style.is_file():
            self.setStyleSheet(style.read_text(encoding="utf-8"))
        if self.settings.geometry:
            self.restoreGeometry(QByteArray.fromHex(self.settings.geometry.encode()))
        if autoload and self.target_combo.currentData():
            self.load_pair()
        notice = saved_state_notice()
        if notice:
            self.banner.show_message(notice, kind="info")

    # ------------------------------------------------------------------ layout

    def _build(self) -> None:
        self.model_bar = ModelBar(self)
        self.addToolBar(self.model_bar)
        bar = self.model_bar
        self.target_combo, self.draft_combo, self.mode_combo = bar.target_combo, bar.draft_combo, bar.mode_combo
        self.load_button, self.models_button = bar.load_button, bar.models_button
        self.document_toggle, self.serve_panel = bar.document_toggle, bar.serve_panel

        # Left: conversations and settings.
        self.conversations = ConversationList(self.store)
        self.conversation_list = self.conversations.view
        self.new_button = self.conversations.new_button
        self.generation_form = GenerationForm()
        form = self.generation_form
        self.temperature, self.top_p, self.max_tokens, self.k_spin = form.temperature, form.top_p, form.max_tokens, form.k_spin
        left = QWidget(objectName="sidebar")
        lay = QVBoxLayout(left)
        lay.addWidget(self.conversations, 1)
        lay.addWidget(self.generation_form)

        self.chat = ChatPane()
        chat = self.chat
        self.banner, self.transcript, self.document, self.input = chat.banner, chat.transcript, chat.document, chat.input
        self.send_button, self.stop_button = chat.send_button, chat.stop_button
        self.speculation_pane = SpeculationPane(self.transcript)
        pane = self.speculation_pane
        self.speculation, self.stats, self.replay = pane.speculation, pane.stats, pane.replay
        self.replay_bar, self.replay_label = self.replay.bar, self.replay.label

        split = QSplitter(Qt.Horizontal)
        split.addWidget(left)
        split.addWidget(self.chat)
        split.addWidget(self.speculation_pane)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 3)
        split.setStretchFactor(2, 2)
        split.setSizes([250, 660, 530])
        self.setCentralWidget(split)

        # Status bar: what runs where, and load progress.
        self.load_status = LoadStatus()
        self.setStatusBar(self.load_status)
        status = self.load_status
        self.model_label, self.backend_label = status.model_label, status.backend_label
        self.load_progress, self.cancel_button = status.load_progress, status.cancel_button
        self._show_backend(None)

    def _connect(self) -> None:
        w = self.engine.worker
        w.ready.connect(self._on_engine_ready)
        w.died.connect(self._on_engine_died)
        w.serving.connect(self._on_serving)
        w.serveFailed.connect(self._on_serve_failed)
        w.servedRequest.connect(self._on_served_request)
        self.engine.served_batcher.batchReady.connect(self._on_served_batch)
        self.serve_panel.switched.connect(self._switch_serving)
        w.loadProgress.connect(self._on_load_progress)
        w.loaded.connect(self._on_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        w.stageChanged.connect(self._on_stage)
        w.plainRateMeasured.connect(self._on_plain_rate)
        self.engine.batcher.batchReady.connect(self._on_batch)
        self.load_button.clicked.connect(self.load_pair)
        self.cancel_button.clicked.connect(self.cancel_load)
        self.model_bar.pairReady.connect(self._on_pair_ready)
        self.model_bar.error.connect(self.show_error)
        self.send_button.clicked.connect(lambda: self.send(self.input.toPlainText()))
        self.input.submitted.connect(self.send)
        self.input.stopRequested.connect(self.stop)
        self.stop_button.clicked.connect(self.stop)
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
        self.mode_combo.currentIndexChanged.connect(self._save_settings)
        self.generation_form.changed.connect(self._save_settings)

    # ------------------------------------------------------------------ settings

    def _apply_settings(self) -> None:
        s = self.settings
        self._applying = True  # each setter below fires valueChanged; save only the finished state
        self.model_bar.refresh_models(s.target, s.draft)
        self.mode_combo.setCurrentIndex(max(0, self.mode_combo.findData(s.mode)))
        self.generation_form.apply(s)
        self._applying = False

    def _save_settings(self, *_):
        if getattr(self, "_applying", False):
            return
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
        draft = self.draft_combo.currentData() or None
        request = LoadRequest(str(target), str(draft) if draft else None, self.generation_form.n_ctx.value(),
                              *self.generation_form.gpu_layers())
        self.settings.target, self.settings.draft = request.target, request.draft or ""
        self._save_settings()
        self.banner.hide()
        self.loaded = False
        self.loading = True
        self._update_controls()
        self.load_status.begin_load()
        self.serve_panel.show_stopped()  # the new engine process serves nothing until asked
        self.engine.load(request, profile, why)

    def cancel_load(self) -> None:
        self.engine.cancel_load()
        self.cancel_button.setEnabled(False)

    def _on_load_progress(self, stage: str, fraction: float) -> None:
        self.load_status.show_load_progress(stage, fraction)

    def _on_loaded(self, target, draft) -> None:
        self.loading = False
        self.loaded = True
        self.load_status.end_load()
        self.load_status.show_pair(target, draft)
        self._show_backend(target)
        rate = self.settings.plain_tokens_per_s.get(target.path)
        self.engine.set_plain_rate(rate)
        self._update_controls()
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

    # ------------------------------------------------------------------ serving the API

    def _switch_serving(self, on: bool, port: int) -> None:
        if not on:
            self.engine.stop_serving()
        elif not self.loaded:
            self.serve_panel.show_stopped()
            self.show_error("Load a model first: the API serves the loaded models.")
        else:
            self.engine.serve(port, self.mode_combo.currentData())

    def _on_serving(self, url: str, model_id: str) -> None:
        if url:
            self.serve_panel.show_serving(url, model_id)
            self.statusBar().showMessage(f"Serving {model_id} at {url}", 5000)
        else:
            self.serve_panel.show_stopped()

    def _on_serve_failed(self, message: str) -> None:
        self.serve_panel.show_stopped()
        self.show_error(message)

    def _on_served_request(self, kind: str, payload) -> None:
        """An API client's request: shown live in the speculation view and stats, like the window's own."""
        if self.generating:
            return
        if kind != "started":
            self.engine.served_batcher.flush()  # its last cycles before its count
        self.speculation_pane.show_served_request(kind, payload)

    def _on_served_batch(self, events: list) -> None:
        if self.generating:
            return
        self.speculation_pane.add_events(events)
        self.speculation_pane.show_snapshot(events[-1].snapshot)

    def _on_engine_died(self, death) -> None:
        """The engine process crashed: keep the window, the conversation and the answer so far."""
        if self._live is not None:
            self.engine.batcher.flush()
            self._keep_partial_answer(f"The engine stopped: {death.how}. The answer so far is kept.")
            self.generating = False
            self.document.show_progress("")
            self.statusBar().clearMessage()
            self.replay_label.setText("")
            if self.current is not None:
                self.transcript.show_messages(self.current.messages)
        self.loading = False
        self.loaded = False
        self.load_status.end_load("No model loaded: the engine stopped")
        self.serve_panel.show_stopped()
        self._show_backend(None)
        actions = [("Reload", self.load_pair)]
        safer = profiles.safer_than(death.profile, bool(self.gpu)) if death.during_load else None
        if safer is not None:
            why = f"the {death.profile.name} profile crashed ({death.how}) while {death.activity}"
            actions.insert(0, (f"Reload with the {safer.name} profile",
                               lambda: self.load_pair(profile=safer, why=why)))
        message = death.message()
        if safer is not None:
            message += (f" This happened {'during the load' if death.activity.startswith('loading') else 'at the first decode'}"
                        f": the {safer.name} profile ({safer.description}) may avoid it.")
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
        self.speculation_pane.clear()
        last = next((i for i in range(len(conv.messages) - 1, -1, -1) if conv.messages[i].cycles), None)
        if last is not None:
            self.replay_message(last, step=None)
        else:
            self.replay.clear()
        self.settings.conversation = conv.id
        self._save_settings()

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

    # ------------------------------------------------------------------ generating

    def _update_controls(self) -> None:
        busy = self.generating or self.loading
        self.send_button.setEnabled(not busy)
        self.document.summarise_button.setEnabled(not busy and bool(self.document.text().strip()))
        self.stop_button.setEnabled(self.generating)
        self.load_button.setEnabled(not busy)
        self.conversations.set_generating(self.generating)

    def _request(self, conv: Conversation, **extra) -> GenerationRequest:
        return GenerationRequest(conversation_id=conv.id, messages=conv.history(),
                                 mode=self.mode_combo.currentData(), k=self.k_spin.value(),
                                 temperature=self.temperature.value(), top_p=self.top_p.value(),
                                 max_tokens=self.max_tokens.value(), **extra)

    def _can_generate(self) -> bool:
        if self.generating:
            return False
        if self.loading:
            self.show_error("The models are still loading.")
            return False
        if not self.loaded:
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
        self.conversations.save(conv)  # the question survives a crash; only the answer being written can be lost
        self.input.clear()
        self._begin(conv, self._request(conv), kind="chat", restore=text)

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
        from ..engine.prompts import document_message  # a string template, no model involved

        conv.messages.append(Message("user", document_message(text), display=f"Summarise {name} "
                                     f"({len(text.split()):,} words)"))
        self.conversations.title_from_document(conv, name)
        self.conversations.save(conv)
        self.document_toggle.setChecked(True)
        self._begin(conv, self._request(conv, document=text), kind="summary")

    def _begin(self, conv: Conversation, request: GenerationRequest, kind: str, restore: str = "") -> None:
        self.banner.hide()
        self.generating = True
        self._update_controls()
        self._live = LiveAnswer(conv, kind, restore)
        self.replay.clear("Generating…")
        self.document.highlight([])
        self.transcript.show_messages(conv.messages)
        self.transcript.begin_answer("writing…")
        self.speculation_pane.clear()
        self.engine.generate(request)

    def stop(self) -> None:
        if self.generating:
            self.engine.stop()
            self.stop_button.setEnabled(False)
            self.replay_label.setText("Stopping after this target pass…")
        elif self.loading:
            self.cancel_load()

    def _on_stage(self, stage: str) -> None:
        self.document.show_progress(f"Summarising in parts: {stage}…")
        self.statusBar().showMessage(f"Summarising in parts: {stage}")

    def _on_batch(self, events: list) -> None:
        live = self._live
        if live is None:
            return
        live.events.extend(events)
        # The speculation view is the live one, every frame. The Markdown answer and the stats
        # panel are re-rendered less often: each costs the UI thread more than a frame of tokens.
        self.speculation_pane.add_events(events)
        if self._due(live.answer_clock, ANSWER_UPDATE_MS):
            self._show_live_answer()
        if self._due(live.stats_clock, STATS_UPDATE_MS):
            self._show_live_stats()

    @staticmethod
    def _due(clock: QElapsedTimer, interval_ms: int) -> bool:
        if clock.isValid() and clock.elapsed() < interval_ms:
            return False
        clock.start()
        return True

    def _show_live_answer(self) -> None:
        if self._live is not None:
            self.transcript.update_answer(answer_so_far(self._live.events))

    def _show_live_stats(self) -> None:
        live = self._live
        if live is None or live.snapshot is None:
            return
        self.speculation_pane.show_snapshot(live.snapshot)

    def _on_finished(self, result) -> None:
        # Cycles still waiting for the next frame go first: live.events must be complete.
        # The answer itself is drawn below, whole, with the conversation.
        self.engine.batcher.flush()
        live, self._live = self._live, None
        self.generating = False
        self.document.show_progress("")
        self.statusBar().clearMessage()
        conv = self.conversations.conversation(result.conversation_id) or (live and live.conversation)
        if conv is None:
            self._update_controls()
            return
        records = cycle_records(with_stages(result.cycles, live.events if live else []))
        note = result.note
        if result.finish == "stopped" and not note:
            note = "Stopped; the answer so far is kept."
        text = result.text
        display = ""
        if result.part_summaries:
            n = len(result.part_summaries)
            note = (note + " " if note else "") + f"Summarised in {n} parts, then combined."
            # The whole document no longer fits the context: later turns see the summary instead.
            user = conv.messages[-1] if conv.messages and conv.messages[-1].role == "user" else None
            if user is not None:
                user.content = f"Summarise the document {conv.document_name or ''} (too long to include here)."
            if result.finish == "stopped":
                display = "**Part summaries so far**\n\n" + text
        conv.messages.append(Message("assistant", text, display=display, cycles=records,
                                     stats=answer_stats(result.snapshot), mode=result.mode,
                                     finish=result.finish, note=note))
        self.conversations.save(conv)
        self._save_settings()
        if conv is self.current:
            self.transcript.show_messages(conv.messages)
            if live and live.kind == "summary":
                self._highlight_copies(conv, result.cycles)
            self.replay_message(len(conv.messages) - 1, step=None)
        self._update_controls()
        self.generationFinished.emit()

    def _highlight_copies(self, conv: Conversation, cycles) -> None:
        copies = ["".join(c.drafted_text[:c.n_accepted]) for c in cycles if c.source == "lookup" and c.n_accepted]
        self.document.highlight(summarise.copied_spans(self.document.text(), copies))

    def _on_failed(self, message: str) -> None:
        self.engine.batcher.flush()
        live, self._live = self._live, None
        self.generating = False
        self.document.show_progress("")
        self.statusBar().clearMessage()
        if live is not None:
            conv = live.conversation
            # The question goes back to the box so nothing typed is lost; the conversation is unchanged.
            if conv.messages and conv.messages[-1].role == "user":
                conv.messages.pop()
                self.conversations.save(conv)
            if live.restore and not self.input.toPlainText().strip():
                self.input.setPlainText(live.restore)
            if conv is self.current:
                self.transcript.show_messages(conv.messages)
        self.replay_label.setText("")
        self.show_error(message)
        self._update_controls()
        self.generationFinished.emit()

    # ------------------------------------------------------------------ replay

    def replay_message(self, index: int, step: int | None = 0) -> None:
        """Load an answer's cycle records into the replay bar; step 0 starts before the first cycle."""
        if self.generating or self.current is None or not (0 <= index < len(self.current.messages)):
            return
        self.replay.load(self.current, index, step, self.settings.plain_tokens_per_s.get(self.settings.target))

    # ------------------------------------------------------------------ errors and closing

    def show_error(self, message: str, actions=()) -> None:
        self.banner.show_message(message, actions=actions)

    def _keep_partial_answer(self, note: str) -> None:
        """Store the answer being written as it stands after the last cycle received."""
        live, self._live = self._live, None
        conv = live.conversation
        conv.messages.append(Message("assistant", "".join(e.cycle.text for e in live.events),
                                     cycles=cycle_records(live.events),
                                     stats=answer_stats(live.snapshot) if live.snapshot else {},
                                     mode=self.mode_combo.currentData(), finish="stopped", note=note))
        self.conversations.save(conv)

    def closeEvent(self, event) -> None:
        if self._live is not None:
            # Closing mid-generation: keep the partial answer, as Stop would.
            self.engine.stop()
            self._keep_partial_answer("Stopped when the window closed; the answer so far is kept.")
        self.settings.geometry = bytes(self.saveGeometry().toHex()).decode()
        self._save_settings()
        self.engine.shutdown()
        super().closeEvent(event)
