"""Issue 49's truths of the window: one plain speed, an honest Stop while a document is read,
highlights that survive a restart, replay at the answer's own pace, and the small truths
(prompt counts, parts, Off mode, the API's model name, titles, Open…, the live view after a
restart). The real window on the real SmolLM2 engine where decoding is involved."""

from __future__ import annotations

import json
import re
import time

import pytest
from PySide6.QtCore import Qt, QUrl

from speculum import paths
from speculum.conversations import Conversation, ConversationStore, Message
from speculum.engine.cycle import PolicyReport
from speculum.engine.stats import Stats
from speculum.protocol import PlainBasis, snapshot_of
from speculum.ui.speculation.stats import StatsPanel

from test_gui_parts import cycle, timed
from live_window import GENERATE_MS, send
from test_gui_window import COPY_PROMPT

PLAIN_FIGURE = re.compile(r"plain (\d+\.\d) tok/s")


def value(panel: StatsPanel, row: str) -> str:
    """A row's text as read (its phrases are glued with no-break spaces)."""
    return panel.value(row).replace("\u00a0", " ").replace("\u2060", "")


def lighthouse(paragraphs: int | None = None) -> str:
    text = paths.resource("samples/lighthouse.md").read_text(encoding="utf-8")
    return "\n\n".join(text.split("\n\n")[:paragraphs]) if paragraphs else text


# -- 1: one plain speed ---------------------------------------------------------------------------

def test_the_panel_shows_one_plain_speed_labelled_with_where_it_comes_from(qtbot):
    # The Policy row said "plain 4.9 tok/s" (its cost model's) while the speedup's tooltip divided
    # by "plain decoding … 17 s ago (8.7 tok/s)": two plain speeds on one panel.
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.resize(420, panel.sizeHint().height())
    panel.show()
    report = PolicyReport("lookup", 3, mode="auto", plain_tokens_per_s=4.9, expected_tokens_per_s=13.0,
                          expected_tokens_per_pass=2.65, expected_speedup=2.65)
    stats, plain = Stats(), PlainBasis(8.7, age_s=17.0)
    for i in range(3):
        c = timed(cycle(i, "lookup", [1, 2, 3], 3, [1, 2, 3, 4]), 0.25, report)
        stats.add(c)
        plain.observe(c)
    panel.show_snapshot(snapshot_of(stats, c, plain))
    shown = panel.readout.as_text() + "\n" + "\n".join(panel.readout.tips.values())
    assert set(PLAIN_FIGURE.findall(shown)) | set(re.findall(r"\((\d+\.\d) tok/s\)", shown)) == {"8.7"}, shown
    assert "plain 8.7 tok/s measured 17 s ago" in value(panel, panel.SPEEDUP)
    assert value(panel, panel.SPEEDUP).startswith(f"{12 / 0.75 / 8.7:.2f}×  (measured)")
    # The policy's own estimate is a ratio, not a second plain speed.
    assert "2.65× expected" in value(panel, panel.POLICY) and "tok/s" not in value(panel, panel.POLICY)
    # Its own plain steps, once it has some, are the figure: the same one in the row and the tooltip.
    for i in (3, 4):
        c = timed(cycle(i, "none", [], 0, [5]), 0.1, report)
        stats.add(c)
        plain.observe(c)
    panel.show_snapshot(snapshot_of(stats, c, plain))
    assert "plain 10.0 tok/s in this answer" in value(panel, panel.SPEEDUP)
    assert "(10.0 tok/s)" in panel.readout.tips[panel.SPEEDUP]
    # Nothing measured at all: the cost model's figure, said to be one.
    first = Stats()
    first.add(timed(cycle(0, "lookup", [1, 2], 2, [1, 2, 3]), 0.1, report))
    estimate = snapshot_of(first, timed(cycle(0, "lookup", [1, 2], 2, [1, 2, 3]), 0.1, report), PlainBasis(None))
    assert (estimate.plain_rate, estimate.plain_from) == (4.9, "cost model estimate")


# -- 2 and 12: a Stop while a document is read --------------------------------------------------

def test_stop_while_a_document_is_read_says_so_and_summarise_again_takes_its_place(qtbot, open_window, smollm_path):
    # It left "Part summaries so far / Part 1:" with nothing under it, "Summarised in 1 parts, then
    # combined", "0.0 tok/s (0 tokens in 0.0 s)", a Replay of an empty answer, and Summarise
    # again added a second question under the empty answer.
    w = open_window(smollm_path, mode="lookup", max_tokens=12, n_ctx=1024)
    document = lighthouse() * 4  # longer than the context: summarised in parts
    w.chat.document.set_document(document, "long.md")
    bar = []  # the reading bar as the window showed it
    w.engine.worker.promptProgress.connect(lambda read, total: bar.append(w.chat.prompt_progress.text()))
    # Stop once the engine has read its first chunk (from the reader thread: while it reads on).
    w.engine.worker.promptProgress.connect(lambda read, total: read and w.engine.stop(), Qt.DirectConnection)
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS):
        w.summarise()
    messages = w.current.messages
    assert [m.role for m in messages] == ["user", "assistant"]
    stopped = messages[-1]
    match = re.fullmatch(r"Stopped while reading part 1 of (\d+) \(([\d,]+) of ([\d,]+) tokens read; "
                         r"Summarise resumes\)", stopped.note)
    assert match, stopped.note
    read, total = match.group(2), match.group(3)
    assert bar[-1] == f"Reading the prompt… {read} / {total} tokens"  # the bar's own last numbers
    assert int(read.replace(",", "")) < int(total.replace(",", ""))
    assert stopped.content == "" and stopped.cycles == [] and stopped.stats == {}
    text = w.chat.transcript.toPlainText()
    assert "Part summaries so far" not in text and "Summarised in" not in text and "tok/s" not in text
    assert stopped.note in text and "Replay" not in text
    stats = w.speculation_pane.stats
    assert stats.value(stats.RATE) == "—" and not w.speculation_pane.replay.bar.isEnabled()

    # Summarise again: the retry replaces the stopped reading (one question, one answer).
    w.engine.worker.promptProgress.disconnect()
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS * 2):
        w.summarise()
    messages = w.current.messages
    assert [m.role for m in messages] == ["user", "assistant"], [m.shown for m in messages]
    answer = messages[-1]
    assert answer.content.strip() and answer.cycles and not answer.unwritten
    # 12: totals over parts, said so in the note and over the stats panel.
    parts = int(match.group(1))
    assert f"Summarised in {parts} parts, then combined; its numbers are totals over the parts and the combining step" \
        in answer.note
    assert stats.title() == f"Speculation stats · totals over {parts} parts and the combining step"
    # 12: every part's prompt is read whole: processed and reused add up to its size, as its bar said.
    for record in (c for c in answer.cycles if c["index"] == 0):
        decoded, size, reused = record["prompt"]
        assert decoded + reused == size, record["stage"]
    assert answer.stats["prompt_tokens"] + answer.stats["prompt_reused"] == answer.stats["prompt_total"]
    first = next(c for c in answer.cycles if c["index"] == 0)
    assert first["prompt"][2] >= int(read.replace(",", ""))  # what was read before the Stop is not read again


def test_prompt_counts_and_the_reading_bar_name_the_same_total(qtbot, open_window, smollm_path):
    # "Prompt processed" was one short (processed + reused = total - 1) and the bar said /3,559
    # where the stats said of 3,560.
    w = open_window(smollm_path, mode="off", max_tokens=4, n_ctx=2048)
    bar = []
    w.engine.worker.promptProgress.connect(lambda read, total: bar.append((read, total)))
    answer = send(qtbot, w, "Describe the lighthouse in one sentence:\n\n" + lighthouse(4))
    stats = answer.stats
    assert bar[-1] == (stats["prompt_total"], stats["prompt_total"])
    assert stats["prompt_tokens"] + stats["prompt_reused"] == stats["prompt_total"]
    panel = w.speculation_pane.stats
    assert value(panel, panel.PROMPT).startswith(f"{stats['prompt_total']:,} of {stats['prompt_total']:,} tokens")
    # 12: Off mode is plain decoding, not "Speedup 1.00× (measured)".
    assert value(panel, panel.SPEEDUP).startswith("— plain decoding"), value(panel, panel.SPEEDUP)
    assert "1.00×" not in panel.readout.as_text()


# -- 3: highlights survive a restart ------------------------------------------------------------

def test_copied_passages_are_highlighted_again_after_a_restart(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup", max_tokens=40, n_ctx=2048)
    document = lighthouse(3)
    w.model_bar.document_toggle.setChecked(True)
    w.chat.document.set_document(document, "lighthouse.md")
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS):
        qtbot.mouseClick(w.chat.document.summarise_button, Qt.LeftButton)
    spans, caption = w.chat.document.highlighted(), w.chat.document.caption.text()
    assert spans and "spans" in caption and "copied" in caption
    conv_id = w.current.id
    w.close()

    again = open_window()
    assert again.current.id == conv_id
    assert again.chat.document.highlighted() == spans
    assert again.chat.document.caption.text() == caption


def test_a_conversation_saved_before_highlights_were_kept_still_loads(data_dirs):
    store = ConversationStore()
    store.folder.mkdir(parents=True)
    old = {"id": "old1", "title": "Summary of notes.md", "created": 1.0, "updated": 2.0, "document": "abc def",
           "document_name": "notes.md",
           "messages": [{"role": "user", "content": "Summarise"}, {"role": "assistant", "content": "A summary."}]}
    (store.folder / "old1.json").write_text(json.dumps(old))
    hostile = {**old, "id": "bad1", "document_copies": [[0, 3], [5, 99], [4, 2], [1, 2, 3]]}
    (store.folder / "bad1.json").write_text(json.dumps(hostile))
    loaded = {c.id: c for c in store.load_all()}
    assert loaded["old1"].document_copies == [] and loaded["old1"].messages[-1].content == "A summary."
    assert loaded["bad1"].document_copies == [[0, 3]]  # spans outside the document are left out
    kept = Conversation(document="abc", document_copies=[[0, 2]])
    store.save(kept)
    assert next(c for c in store.load_all() if c.id == kept.id).document_copies == [[0, 2]]


# -- 6: replay at the answer's own pace ---------------------------------------------------------

def test_replay_plays_at_the_answers_own_pace(qtbot, open_window, smollm_path):
    # "1×" played about 1.3 cycles a second where the answer ran at 8.7, "4×" was slower than
    # real time, and the Replay link showed an empty answer at cycle 0 and waited.
    w = open_window(smollm_path, mode="lookup", max_tokens=64)
    answer = send(qtbot, w, COPY_PROMPT)
    cycles = answer.cycles
    recorded = sum(c["draft_s"] + c["verify_s"] + c["overhead_s"] for c in cycles)
    bar = w.speculation_pane.replay.bar
    for speed, factor in (("1×", 1.0), ("4×", 4.0)):
        bar.speed.setCurrentText(speed)
        began = time.monotonic()
        w.chat.transcript.anchorClicked.emit(QUrl(f"replay:{len(w.current.messages) - 1}"))  # the Replay link
        assert bar.play.isChecked()  # it plays, from the start
        qtbot.waitUntil(lambda: bar.at_end and not bar.play.isChecked(), timeout=60_000)
        took = time.monotonic() - began
        assert recorded / factor * 0.9 <= took <= recorded / factor + 1.5, (speed, took, recorded)
    assert bar.due[-1] == pytest.approx(recorded)  # each step when it came, as recorded
    for i, c in enumerate(cycles):
        assert bar.due[2 * i + 2] - bar.due[2 * i] == pytest.approx(c["draft_s"] + c["verify_s"] + c["overhead_s"])
    assert answer.content.strip()[:20] in w.chat.transcript.toPlainText()


def test_replay_pace_is_each_cycles_draft_then_verify_time():
    from speculum.protocol import replay_pace

    c = timed(cycle(0, "lookup", [1, 2], 1, [1, 9]), 0.3)
    c.draft_s, c.verify_s, c.overhead_s = 0.05, 0.2, 0.01
    assert replay_pace([c, c]) == pytest.approx([0.06, 0.2, 0.06, 0.2])


# -- 12: the small truths -----------------------------------------------------------------------

def test_five_chats_that_begin_alike_get_five_titles(qtbot, data_dirs):
    from speculum.ui.chat.conversationlist import ConversationList

    view = ConversationList(ConversationStore())
    qtbot.addWidget(view)
    titles = []
    for _ in range(5):
        conv = view.create()
        view.title_from_question(conv, "Write a haiku about the sea")
        titles.append(conv.title)
    assert titles == ["Write a haiku about the sea"] + [f"Write a haiku about the sea ({n})" for n in range(2, 6)]
    listed = {view.view.item(i).text() for i in range(view.view.count())}
    assert set(titles) <= listed
    conv = view.create()
    view.title_from_document(conv, "notes.md")
    other = view.create()
    view.title_from_document(other, "notes.md")
    assert (conv.title, other.title) == ("Summary of notes.md", "Summary of notes.md (2)")


def test_open_starts_in_the_users_documents_then_where_the_last_one_came_from(qtbot, monkeypatch, tmp_path):
    from PySide6.QtCore import QStandardPaths
    from PySide6.QtWidgets import QFileDialog

    from speculum.ui.chat.document import DocumentPane

    asked = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *args: (asked.append(args[2]), ("", ""))[1])
    pane = DocumentPane()
    qtbot.addWidget(pane)
    pane.choose_file()
    documents = QStandardPaths.writableLocation(QStandardPaths.DocumentsLocation)
    assert asked[-1] and asked[-1] == documents  # not "" (the folder the app was launched from)
    notes = tmp_path / "papers" / "notes.md"
    notes.parent.mkdir()
    notes.write_text("# Notes\n\nSome text.")
    with qtbot.waitSignal(pane.documentOpened, timeout=10_000):
        pane.open_path(notes)
    pane.choose_file()
    assert asked[-1] == str(notes.parent)


def test_a_crash_while_loading_is_told_by_the_activity_not_its_words():
    from speculum.engine.llama import profiles
    from speculum.ui.library.loadstatus import crash_offer
    from speculum.ui.worker import Activity, EngineDeath

    loading = EngineDeath("signal SIGSEGV (Segmentation fault)", Activity.LOADING, True, profiles.STANDARD)
    message, safer, why = crash_offer(loading, False)
    assert "while loading the models" in loading.message() and "during the load" in message
    assert safer is not None and why.endswith("while loading the models")
    first_decode = EngineDeath("signal SIGSEGV (Segmentation fault)", Activity.GENERATING, True, profiles.STANDARD)
    assert "at the first decode" in crash_offer(first_decode, False)[0]
    assert {a.words for a in Activity} == {"idle", "loading the models", "generating an answer",
                                           "summarising a document", "checking an answer against plain decoding"}


def test_the_live_view_filled_before_it_is_shown_ends_on_whole_rows(qtbot):
    # At a restart the view was filled with the last answer before the window had its size: it
    # stopped a few pixels short of the end, a clipped row at its top and the last row cut.
    from PySide6.QtCore import QPoint

    from speculum.ui.chat.answer import StagedCycle
    from speculum.ui.speculation.tokenview import SpeculationView

    view = SpeculationView()
    qtbot.addWidget(view)
    view.append_cycles([StagedCycle(cycle(i, "lookup" if i % 3 else "none", [1, 2] if i % 3 else [],
                                          1 if i % 3 else 0, [1, 9])) for i in range(300)])
    view.resize(400, 80)
    view.show()
    qtbot.waitExposed(view)
    bar = view.verticalScrollBar()
    for height in (80, 101, 123, 150):
        view.resize(400, height)
        qtbot.waitUntil(lambda: view.height() == height, timeout=5_000)
        assert bar.maximum() > 0 and bar.value() == bar.maximum(), height  # the newest tokens in sight
        top = view.cursorRect(view.cursorForPosition(QPoint(5, 1))).top()
        assert top == 0, (height, top)  # the top row whole
        end_cursor = view.textCursor()
        end_cursor.movePosition(end_cursor.MoveOperation.End)
        assert view.cursorRect(end_cursor).bottom() < view.viewport().height(), height  # the last row whole
    bar.setValue(bar.maximum() // 2)  # scrolled up by the user: it stays there as the view resizes
    view.resize(400, 140)
    qtbot.waitUntil(lambda: view.height() == 140, timeout=5_000)
    assert bar.value() < bar.maximum()


def test_the_stats_keep_their_rows_when_the_pane_is_a_few_pixels_short(qtbot):
    # With the plain speed under the speedup, the pane needed 8 pixels more than a 1280x720
    # screen gave its column, and the layout squeezed every row: "Prompt processed" was cut.
    from speculum.ui.chat.transcript import Transcript
    from speculum.ui.panes import Scrolling
    from speculum.ui.speculation.speculationpane import SpeculationPane

    pane = SpeculationPane(Transcript())
    column = Scrolling(pane)
    qtbot.addWidget(column)
    column.resize(440, 900)
    column.show()
    qtbot.waitExposed(column)
    need = pane.minimumSizeHint().height()
    readout = pane.stats.readout
    for short in (0, 3, pane.layout().contentsMargins().bottom()):
        column.resize(440, need - short)
        qtbot.waitUntil(lambda: column.height() == need - short, timeout=5_000)
        qtbot.waitUntil(lambda: readout.height() >= readout.minimumSizeHint().height(), timeout=5_000)
        assert not column.verticalScrollBar().isVisible()


def test_a_first_token_that_came_with_the_prompt_is_no_plain_step():
    # Its row came with the prompt's last chunk: no target pass of its own, a millisecond of the
    # loop's time. Counted as a plain step it made plain decoding 892 tok/s, and the next
    # answer's speedup 0.01× "measured".
    from speculum.protocol import is_plain_step
    from speculum.runner import PlainRate

    first = cycle(0, "none", [], 0, [7])
    first.verify_s, first.overhead_s = 0.0, 0.0011
    step = timed(cycle(1, "none", [], 0, [8]), 0.1)
    assert not is_plain_step(first) and is_plain_step(step)
    rate = PlainRate()
    for c in (first, step):
        rate.observe(c)
    assert rate.tokens_per_s == pytest.approx(10.0)


def test_a_stopped_reading_of_a_document_in_one_piece_names_its_counts():
    from speculum.protocol import PartPrompt, StatsSnapshot
    from speculum.ui.chat.answer import stopped_note

    whole = StatsSnapshot(prompt_tokens=792, prompt_total=3559, prompt_reused=0)
    assert stopped_note("", whole, document=True) == "Stopped while reading (792 of 3,559 tokens read; Summarise resumes)"
    assert stopped_note("", whole) == "Stopped while reading the prompt (792 of 3,559 tokens read); nothing was written."
    part = StatsSnapshot(prompt_tokens=900, prompt_total=4000, part_prompt=PartPrompt("Part 2 of 5", 100, 700, 28))
    assert stopped_note("", part, document=True) == "Stopped while reading part 2 of 5 (128 of 700 tokens read; Summarise resumes)"
