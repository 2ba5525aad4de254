"""Writing answers: a question, a document or a Continue sent to the engine, the answer shown as
it comes, and kept in its conversation however it ends (finished, stopped, failed, cut by a crash).

The window lays out the panes and loads the models; this holds the answer being written
(``LiveAnswer``) and reaches the panes through the window's public parts.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from ...conversations import Conversation, Message
from ...engine.vocabulary import Finish
from .answer import (AnswerKind, LiveAnswer, cycle_records, document_copies, document_question, extend_answer,
                     finished_answer, stages_scope, with_stages)
from ...protocol import GenerationRequest

# While generating (the speculation view updates every frame, see worker.FRAME_MS):
ANSWER_UPDATE_MS = 200  # the Markdown answer
STATS_UPDATE_MS = 1000  # the stats panel's numbers, bars and chart: a meter, read once a second
# Where llama.cpp fills every core, the Markdown answer is redrawn with the stats (see
# worker.Engine._on_loaded): the speculation view still shows each token within a frame.
ANSWER_UPDATE_CORES_FULL_MS = STATS_UPDATE_MS


class Answering(QObject):
    finished = Signal()  # a finished answer is rendered and saved (or the window showed why not)

    def __init__(self, window):
        super().__init__(window)
        self.w = window
        self.live: LiveAnswer | None = None
        self.generating = False
        worker = window.engine.worker
        worker.finished.connect(self._on_finished)
        worker.failed.connect(self._on_failed)
        worker.stageChanged.connect(self._on_stage)
        worker.promptProgress.connect(self._on_prompt_progress)
        window.engine.batcher.batchReady.connect(self._on_batch)

    def _request(self, conv: Conversation, **extra) -> GenerationRequest:
        return self.w.generation_form.request(conv, self.w.model_bar.mode_combo.currentData(), **extra)

    def send(self, text: str) -> None:
        text = text.strip()
        if not text or not self.w.can_generate():
            return
        conv = self.w.current
        conv.messages.append(Message("user", text))
        self.w.conversations.title_from_question(conv, text)
        self.w.chat.input.clear()
        self._begin(conv, self._request(conv), AnswerKind.CHAT, text)
        # Saved once the engine has the request: the first token does not wait for the disk, and
        # the question still survives a crash (only the answer being written can be lost).
        self.w.conversations.save(conv)

    def summarise(self) -> None:
        document = self.w.chat.document
        text = document.text()
        if not text.strip():
            self.w.show_error("The document is empty: paste text or open a file first.")
            return
        if not self.w.can_generate():
            return
        conv = self.w.current
        conv.document, conv.document_name, conv.document_copies = text, document.name, []
        name = document.name or "the pasted document"
        messages = conv.messages
        if len(messages) >= 2 and messages[-1].unwritten and messages[-2].role == "user" and messages[-2].display:
            del messages[-2:]  # a retry after a Stop while the document was read takes its place
        messages.append(document_question(text, name))
        self.w.conversations.title_from_document(conv, name)
        self.w.model_bar.document_toggle.setChecked(True)
        self._begin(conv, self._request(conv, document=text), AnswerKind.SUMMARY)
        self.w.conversations.save(conv)  # after the request, as in send

    def continue_answer(self, index: int) -> None:
        """Write on from the last answer, stopped at the user's token limit: the same answer grows
        (its tokens follow the prompt again, so the engine reads nothing twice)."""
        conv = self.w.current
        if conv is None or index != len(conv.messages) - 1 or conv.messages[index].finish != Finish.MAX_TOKENS:
            return
        if not self.w.can_generate():
            return
        request = self._request(conv)
        request.messages = conv.history(before=index)
        request.continues = [t for record in conv.messages[index].cycles for t in record.get("emitted", [])]
        self._begin(conv, request, AnswerKind.CHAT, continues=index)

    def _begin(self, conv: Conversation, request: GenerationRequest, kind: AnswerKind, restore: str = "",
               continues: int | None = None) -> None:
        w = self.w
        w.chat.banner.hide()
        self.generating = True
        w.update_controls()
        before = conv.messages[continues].content if continues is not None else ""
        self.live = LiveAnswer(conv, kind, restore, continues, before)
        w.speculation_pane.replay.clear("Generating…")
        w.chat.begin_answer(conv.messages if continues is None else conv.messages[:continues])
        if before:
            w.chat.transcript.update_answer(before)
        w.speculation_pane.clear()
        w.engine.generate(request)

    def stop(self) -> None:
        self.w.engine.stop()
        self.w.chat.stop_button.setEnabled(False)
        self.w.speculation_pane.replay.label.setText("Stopping after this target pass…")

    def _on_stage(self, stage: str) -> None:
        self.w.chat.document.show_progress(f"Summarising in parts: {stage}…")
        self.w.statusBar().showMessage(f"Summarising in parts: {stage}")

    def _on_prompt_progress(self, read: int, total: int) -> None:
        if self.live is not None:
            self.w.chat.show_prompt_progress(read, total)

    def _on_batch(self, events: list) -> None:
        live = self.live
        if live is None:
            return
        self.w.chat.prompt_read()
        live.events.extend(events)
        # The speculation view is the live one, every frame. The Markdown answer and the stats
        # panel are re-rendered less often: each costs the UI thread more than a frame of tokens.
        self.w.speculation_pane.add_events(events)
        if live.answer_due(ANSWER_UPDATE_CORES_FULL_MS if self.w.engine.cores_full else ANSWER_UPDATE_MS):
            self.w.chat.transcript.update_answer(live.text)
        if live.stats_due(STATS_UPDATE_MS):
            self.w.speculation_pane.show_snapshot(live.snapshot, stages_scope(live.events))

    def _on_finished(self, result) -> None:
        w = self.w
        live = self.end()  # the answer itself is drawn below, whole, with the conversation
        conv = w.conversations.conversation(result.conversation_id) or (live and live.conversation)
        if conv is None:
            w.update_controls()
            return
        staged = with_stages(result.cycles, live.events if live else [])
        summary = live is not None and live.kind is AnswerKind.SUMMARY
        if live is not None and live.continues is not None:
            index = live.continues
            done = finished_answer(conv, result, [])
            extend_answer(conv.messages[index], result.text, staged, done.finish, done.note)
            staged = None  # replayed from the whole answer's records
        else:
            index = len(conv.messages)
            conv.messages.append(finished_answer(conv, result, cycle_records(staged), document=summary))
        if summary:  # kept with the conversation: highlighted again when it is opened
            conv.document_copies = document_copies(conv.document, result.cycles)
        w.conversations.save(conv)
        w.save_settings()
        if conv is w.current:
            w.chat.transcript.show_messages(conv.messages)
            if summary:
                w.chat.document.highlight(conv.document_copies)
            if conv.messages[index].cycles:
                w.replay_message(index, step=None, staged=staged)
            else:  # stopped before it wrote anything: no numbers, nothing to replay
                w.speculation_pane.clear()
                w.speculation_pane.replay.clear()
        w.update_controls()
        self.finished.emit()

    def end(self) -> LiveAnswer | None:
        """The answer stops being written: the one that was, with the cycles still waiting for a frame."""
        self.w.engine.batcher.flush()
        live, self.live = self.live, None
        self.generating = False
        self.w.chat.document.show_progress("")
        self.w.chat.prompt_progress.hide()
        self.w.statusBar().clearMessage()
        return live

    def _on_failed(self, message: str) -> None:
        w = self.w
        live = self.end()
        if live is not None:
            conv = live.conversation
            # The question goes back to the box so nothing typed is lost; the conversation is unchanged.
            if live.continues is None and conv.messages and conv.messages[-1].role == "user":
                conv.messages.pop()
                w.conversations.save(conv)
            w.chat.restore_question(live.restore)
            if conv is w.current:
                w.chat.transcript.show_messages(conv.messages)
        w.replay_last()  # the previous answer's stats and view, as they were before Send
        w.show_error(message)
        w.update_controls()
        self.finished.emit()

    def keep_partial(self, note: str) -> bool:
        """The answer being written ends unfinished (a crash, the window closing): keep what came.
        True when there was one."""
        live = self.end()
        if live is None:
            return False
        if live.keep_partial(self.w.model_bar.mode_combo.currentData(), note):
            self.w.conversations.save(live.conversation)
        return True
