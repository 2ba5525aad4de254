"""Issue 49, the window a new user keeps: the toolbar serving at 1280 pixels after a crash, the
modes a loaded pair allows, code shown as an editor shows it, the panes' sizes and the live view
enlarged, the Models dialog's recommendation and Retry, the first start without a model, and a
visible focus on every Tab stop. The real window and engine (SmolLM2) where decoding is involved."""

from __future__ import annotations

import shutil

import httpx
import pytest
from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtGui import QColor, QGuiApplication
from PySide6.QtWidgets import QApplication, QLabel, QToolButton, QVBoxLayout, QWidget

from live_window import GENERATE_MS, LOAD_MS, send
from speculum.conversations import Message
from speculum.engine.vocabulary import Mode
from speculum.ui.chat.codeblocks import code_blocks_in
from speculum.ui.chat.transcript import Transcript
from speculum.ui.focusring import RING

LONG_LINE = "    result = compute(" + ", ".join(f"argument_number_{i}" for i in range(14)) + ")"
CODE_TEXT = f"def f(x):\n{LONG_LINE}\n    return result"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- 7: code blocks --------------------------------------------------------------------------


def _code_view(qtbot, answer: str, blocks: int = 1) -> Transcript:
    view = Transcript()
    qtbot.addWidget(view)
    view.resize(520, 360)
    view.show()
    view.show_messages([Message("user", "Show me"), Message("assistant", answer)])
    qtbot.waitUntil(lambda: sum(v.isVisible() for v in view.code_blocks.shown) == blocks, timeout=5_000)
    return view


def test_a_long_code_line_scrolls_inside_its_own_block_and_copy_stays_in_sight(qtbot):
    # A long line wrapped to column 0; then it was kept whole but the whole transcript, prose and
    # all, scrolled sideways to show it. Now each block scrolls on its own, as in an editor.
    long_line = "    total = " + " + ".join(f"value_{i:03d}" for i in range(24))
    long_line = (long_line + "  # " + "x" * 300)[:300]
    code = f"def f():\n{long_line}\n    return total"
    view = _code_view(qtbot, f"Here:\n\n```python\n{code}\n```\n\nA long prose line " + "word " * 60)
    assert len(long_line) == 300 and code_blocks_in(view.document()) == [(code, "python")]
    (block,) = view.code_blocks.shown
    editor = block.editor
    line = editor.document().findBlockByNumber(1)
    assert line.text() == long_line and line.layout().lineCount() == 1  # one visual line, not wrapped
    assert editor.horizontalScrollBar().maximum() > 0 and editor.horizontalScrollBar().isVisible()
    assert editor.verticalScrollBar().maximum() == 0  # every line shown: the block is as tall as its code
    assert view.horizontalScrollBar().maximum() == 0  # the transcript itself never scrolls sideways
    prose = view.document().lastBlock()
    assert prose.layout().lineCount() > 1  # prose wraps at the view's width
    # The block lies in the transcript's width, over the room its object keeps, under "Here:".
    assert 0 <= block.x() and block.geometry().right() < view.viewport().width()
    here = view.document().findBlock(view.toPlainText().index("Here:"))
    here_rect = view.document().documentLayout().blockBoundingRect(here)
    assert block.y() >= here_rect.bottom() - view.verticalScrollBar().value()
    # Its head names the language, with Copy at its right end.
    button = block.copy_button
    assert block.language.text() == "python" and block.language.textFormat() == Qt.PlainText
    assert block.width() - button.geometry().right() < 12 and button.geometry().bottom() < editor.y() + 2
    # Scrolled to the line's end, the transcript has not moved and Copy is still in sight.
    editor.horizontalScrollBar().setValue(editor.horizontalScrollBar().maximum())
    assert view.horizontalScrollBar().value() == 0
    corner = button.mapTo(view.viewport(), QPoint(button.width() - 1, 0))
    assert button.isVisible() and view.viewport().rect().contains(corner)
    QGuiApplication.clipboard().clear()
    qtbot.mouseClick(button, Qt.LeftButton)
    assert QGuiApplication.clipboard().text() == code  # the code exactly, indentation and all
    assert button.text() == "Copied"
    qtbot.waitUntil(lambda: button.text() == "Copy", timeout=5_000)
    # Copying the transcript's text (and its selection) gives the code as written too.
    assert code in view.toPlainText()
    view.selectAll()
    assert code in view.createMimeDataFromSelection().text()


def test_an_up_and_down_wheel_over_code_scrolls_the_transcript_a_sideways_one_the_code(qtbot):
    from PySide6.QtCore import QPointF
    from PySide6.QtGui import QWheelEvent

    code = "\n".join(f"line_{i} = {'y' * 200}" for i in range(6))
    view = Transcript()
    qtbot.addWidget(view)
    view.resize(520, 360)
    view.show()
    view.show_messages([Message("assistant", "Intro\n\n" + "para\n\n" * 30 + f"```\n{code}\n```\n\n" + "end\n\n" * 30)])
    view.verticalScrollBar().setValue(view.verticalScrollBar().maximum() // 2)  # the block in the middle
    qtbot.waitUntil(lambda: bool(view.code_blocks.shown), timeout=5_000)
    editor = view.code_blocks.shown[0].editor
    qtbot.waitUntil(editor.isVisible, timeout=5_000)

    def wheel(dx, dy, modifiers=Qt.NoModifier):
        at = QPointF(editor.viewport().rect().center())
        QApplication.sendEvent(editor.viewport(), QWheelEvent(
            at, QPointF(editor.viewport().mapToGlobal(at.toPoint())), QPoint(), QPoint(dx, dy), Qt.NoButton,
            modifiers, Qt.NoScrollPhase, False))

    before = view.verticalScrollBar().value()
    wheel(0, -120)
    assert view.verticalScrollBar().value() > before and editor.horizontalScrollBar().value() == 0
    wheel(-120, 0)
    assert editor.horizontalScrollBar().value() > 0 and view.horizontalScrollBar().value() == 0


def test_code_blocks_stay_text_each_copies_its_own_and_hostile_markup_stays_escaped(qtbot):
    hostile = '<img src="/dev/zero"><b>bold?</b>'
    answer = (f"First:\n\n```\ny = 2\n```\n\nThen {hostile}\n\n```<img src=x>\n{hostile}\n```\n\n"
              "![pic](/dev/zero)")
    view = _code_view(qtbot, answer, blocks=2)
    assert code_blocks_in(view.document()) == [("y = 2", "code"), (hostile, "<img")]  # the info string's first word
    shown = view.code_blocks.shown
    assert [v.language.text() for v in shown] == ["code", "<img"]
    assert all(v.language.textFormat() == Qt.PlainText for v in shown)
    assert [v.editor.toPlainText() for v in shown] == ["y = 2", hostile]  # markup shown as the characters it is
    text = view.toPlainText()
    assert "<b>bold?</b>" in text and "![pic](/dev/zero)" in text
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            assert not it.fragment().charFormat().isImageFormat()
            it += 1
        block = block.next()
    copied = []
    for button in view.code_blocks.copy_buttons:
        button.click()
        copied.append(QGuiApplication.clipboard().text())
    assert copied == ["y = 2", hostile]


def test_an_answer_that_opens_with_code_gets_its_block_and_inline_code_alone_stays_prose(qtbot):
    # The answer's first block merges into the transcript's own and loses its fence: found by its font.
    view = _code_view(qtbot, "```python\nprint(1)\n```\n\nThen call it:\n\n`main()`\n\nDone.")
    assert code_blocks_in(view.document()) == [("print(1)", "python")]
    assert "main()" in view.toPlainText().splitlines()
    empty = _code_view(qtbot, "```\n```\n\nNothing in the fence.", blocks=0)  # Qt makes no block of it
    assert code_blocks_in(empty.document()) == [] and "Nothing in the fence." in empty.toPlainText()


def test_a_live_answer_rendered_in_pieces_gets_one_block_per_code_block(qtbot):
    view = Transcript()
    qtbot.addWidget(view)
    view.show()
    text = f"Intro.\n\n```python\n{CODE_TEXT}\n```\n\nAfter.\n\n```\nz = 3\n```\n\nEnd."
    view.begin_answer()
    for end in range(1, len(text) + 1, 7):
        view.update_answer(text[:end])
    view.update_answer(text)
    assert code_blocks_in(view.document()) == [(CODE_TEXT, "python"), ("z = 3", "code")]
    answer = view.answer_text()  # the code as written, in its place
    assert answer.startswith("Intro.") and answer.endswith("End.")
    assert answer.index("Intro.") < answer.index(CODE_TEXT) < answer.index("After.") < answer.index("z = 3")


# ---- 8: panes, the live view enlarged, no scroll bar for a pixel --------------------------------


def test_a_pane_a_pixel_short_does_not_scroll(qtbot):
    from speculum.ui.panes import Scrolling

    pane = QWidget()
    layout = QVBoxLayout(pane)
    for i in range(8):
        layout.addWidget(QLabel(f"line {i}"))
    area = Scrolling(pane)
    qtbot.addWidget(area)
    area.resize(300, pane.minimumSizeHint().height() - 1)
    area.show()
    qtbot.waitExposed(area)
    assert not area.verticalScrollBar().isVisible() and pane.height() == area.height()
    area.resize(300, pane.minimumSizeHint().height() // 2)  # truly short: it scrolls
    qtbot.waitUntil(lambda: area.verticalScrollBar().isVisible(), timeout=2_000)


def test_the_speculation_pane_fits_a_1366x768_screen_without_a_scroll_bar(qtbot, open_window):
    from speculum.ui.panes import first_geometry

    w = open_window()
    w.resize(first_geometry(QRect(0, 0, 1366, 768)).size())  # the window a 1366x768 screen gets
    right = w.centralWidget().widget(2)  # the speculation pane's column
    qtbot.waitUntil(lambda: right.height() > 600, timeout=5_000)
    assert not right.verticalScrollBar().isVisible(), (right.height(), right.widget().minimumSizeHint().height())
    assert right.widget().height() == right.height()


def _cut_off(column) -> list:
    """The right column's widgets (those seen) that are not wholly inside its viewport, or that
    the layout gave less height than they need; empty when the pane fits."""
    pane, box = column.widget(), QRect(QPoint(0, 0), column.viewport().size())
    cut = []
    for child in pane.findChildren(QWidget):
        if not child.isVisible():
            continue
        rect = QRect(child.mapTo(column.viewport(), QPoint(0, 0)), child.size())
        parent = child.parentWidget()
        laid_out = parent.layout() is not None and parent.layout().indexOf(child) >= 0
        need = child.minimumHeight() or child.minimumSizeHint().height()
        if not box.contains(rect) or (laid_out and child.height() < need):
            cut.append((type(child).__name__, child.objectName(), rect, need))
    return cut


@pytest.mark.parametrize("screen", [QRect(0, 0, 1280, 720), None], ids=["first-start-window", "window-1280x720"])
def test_the_right_pane_fits_at_1280x720_nothing_cut_off_and_no_scroll(qtbot, open_window, screen):
    # At 1280x720 the speculation pane needed ~60 px more than its column had: it scrolled, and
    # the stats' chart sat below the column's bottom edge.
    from speculum.engine.cycle import PolicyReport
    from speculum.protocol import StatsSnapshot
    from speculum.ui.panes import first_geometry
    from speculum.ui.speculation.replaycontroller import describe_step
    from speculum.ui.chat.answer import StagedCycle

    from test_gui_parts import cycle

    w = open_window()
    w.resize(first_geometry(screen).size() if screen is not None else QSize(1280, 720))
    pane = w.speculation_pane
    # Every row as full as it gets: four Policy lines, two Prompt lines, 15 bars, a long caption.
    pane.show_snapshot(StatsSnapshot(
        acceptance_rate=1.0, acceptance_by_position=[1.0] * 15, tokens_per_s=40.2, tokens_per_pass=7.5, tokens=30,
        seconds=0.7, drafted=26, speedup=2.54, plain_rate=15.8, plain_from="measured 1 s ago",
        policy=PolicyReport("lookup", 15, mode=Mode.AUTO, expected_tokens_per_pass=15.92, expected_speedup=3.58,
                            learning=True),
        prompt_tokens=17, prompt_total=114, prompt_reused=97), "totals over 3 parts and the combining step")
    staged = [StagedCycle(cycle(i, "lookup", list(range(15)), 12, list(range(13))), "Part 2 of 5") for i in range(120)]
    pane.replay.label.setText(describe_step(staged, 2 * 117 + 2))
    right = w.panes.columns[2]
    qtbot.waitUntil(lambda: abs(right.height() - (w.centralWidget().height())) <= 2, timeout=5_000)
    qtbot.wait(50)  # the column's own resize handling has run
    assert not right.verticalScrollBar().isVisible() and not right.horizontalScrollBar().isVisible()
    assert pane.width() <= right.viewport().width() and pane.height() <= right.viewport().height()
    assert _cut_off(right) == []
    assert pane.stats.chart.height() >= pane.stats.chart.minimumHeight() > 40  # a chart, not a line


def test_pane_sizes_are_kept_and_the_live_view_opens_large(qtbot, open_window):
    w = open_window()
    w.resize(1366, 768)
    qtbot.waitUntil(lambda: w.panes.sizes()[2] > 0, timeout=5_000)
    ring_on_input = lambda: w.focus_ring.isVisible() and w.focus_ring.geometry().contains(  # noqa: E731
        QRect(w.chat.input.mapTo(w, QPoint(0, 0)), w.chat.input.size()))
    w.activateWindow()
    w.chat.input.setFocus()
    qtbot.waitUntil(ring_on_input, timeout=5_000)
    sizes = w.panes.sizes()
    w.panes.setSizes([sizes[0], sizes[1] - 200, sizes[2] + 200])
    wanted = w.panes.sizes()
    qtbot.waitUntil(ring_on_input, timeout=5_000)  # the ring moved with its widget
    view = w.speculation_pane.speculation
    small = view.height()
    # Enlarged: the speculation pane takes the window, its stats make way for the view.
    w.speculation_pane.enlarge_button.click()
    qtbot.waitUntil(lambda: view.height() > 2.5 * small, timeout=5_000)
    assert not w.panes.columns[0].isVisible() and not w.chat.isVisible()
    assert view.width() > 0.8 * w.width() and w.enlarge_action.isChecked()
    w.enlarge_action.trigger()  # F11 again: back as it was
    qtbot.waitUntil(lambda: w.chat.isVisible() and w.panes.sizes() == wanted, timeout=5_000)
    assert not w.speculation_pane.enlarge_button.isChecked()
    w.close()
    from speculum.ui.mainwindow import MainWindow
    from speculum.ui.settings import Settings

    again = MainWindow(settings=Settings.load(), autoload=False)
    qtbot.addWidget(again)
    again.resize(1366, 768)
    again.show()
    qtbot.waitUntil(lambda: all(abs(a - b) <= 2 for a, b in zip(again.panes.sizes(), wanted)), timeout=5_000)
    again.close()


# ---- 9: the Models dialog ----------------------------------------------------------------------


def test_the_recommendation_names_its_rule_and_slow_pairs_read_below_one(qtbot, tmp_path, smollm_path):
    from speculum.models import catalog
    from speculum.models.hardware import Machine
    from speculum.models.library import Library
    from speculum.ui.library.models_dialog import ModelsDialog

    pairs = catalog.load()
    cpu = Machine(int(64e9))  # no GPU: pairs above 8 GB fit in RAM, but a CPU writes them slowly
    d = ModelsDialog(library=Library(tmp_path / "models", pairs=pairs), machine=cpu, pairs=pairs,
                     plain_rates={str(smollm_path): 5.0})
    qtbot.addWidget(d)
    best = d.recommended()
    row = next(r for r in range(d.catalog_table.rowCount()) if d.catalog_table.item(r, 0).text() == "★")
    tip = d.catalog_table.item(row, 1).toolTip()
    rule = d.recommendation().rule
    assert rule in tip and rule in d.machine_label.text() and best.name in d.machine_label.text()
    assert "the most capable pair that fits" not in tip or "GPU" in tip or "tok/s" in tip
    fitting_larger = [p for p in pairs if p.source is None and p.memory_bytes > best.memory_bytes
                      and d.catalog_table.item(next(r for r in range(d.catalog_table.rowCount())
                                                    if d.catalog_table.item(r, 1).text() == p.name), 5)
                      .text().startswith("✓")]
    if fitting_larger:  # the tooltip says why a larger pair that fits was passed over
        assert "GPU" in rule or "tok/s" in rule
    speeds = [d.catalog_table.item(r, 7).text() for r in range(d.catalog_table.rowCount())]
    assert "< 1 tok/s" in speeds and "~0 tok/s" not in speeds


def test_a_failed_download_offers_retry_and_retry_finishes_it(qtbot, tmp_path, hub):
    import json
    from pathlib import Path

    from hubserver import make_gguf
    from speculum.models import catalog
    from speculum.models.hardware import Machine
    from speculum.models.library import Library
    from speculum.ui.library.downloadrow import DownloadState
    from speculum.ui.library.models_dialog import ModelsDialog

    target, draft = make_gguf(2 << 20, 1, "target"), make_gguf(1 << 20, 2, "draft")
    hub.add_bytes("test-org/Target-GGUF", "target-Q4_K_M.gguf", target)
    raw = json.loads(Path(catalog.paths.resource("catalog.json")).read_text())
    raw["pairs"].append({
        "id": "test-pair", "name": "Test pair", "family": "qwen2", "good_at": ["code"], "memory_gb": 1.0,
        "target": {"name": "T", "repo": "test-org/Target-GGUF", "quantization": "Q4_K_M", "params_b": 1,
                   "files": [{"path": "target-Q4_K_M.gguf", "size": len(target), "sha256": None}]},
        "draft": {"name": "D", "repo": "test-org/Draft-GGUF", "quantization": "Q4_K_M", "params_b": 0.5,
                  "files": [{"path": "draft-Q4_K_M.gguf", "size": len(draft), "sha256": None}]}})
    (tmp_path / "catalog.json").write_text(json.dumps(raw))
    pairs = catalog.load(tmp_path / "catalog.json")
    d = ModelsDialog(library=Library(tmp_path / "models", pairs=pairs), machine=Machine(int(16e9)), pairs=pairs,
                     plain_rates={})
    qtbot.addWidget(d)
    d.show()
    row = d.download_pair(next(p for p in pairs if p.id == "test-pair"))  # its draft is not on the Hub yet
    qtbot.waitUntil(lambda: row.state is DownloadState.FAILED, timeout=10_000)
    assert row.retry_button.isVisible() and not row.cancel_button.isVisible()
    hub.add_bytes("test-org/Draft-GGUF", "draft-Q4_K_M.gguf", draft)
    row.retry_button.click()
    qtbot.waitUntil(lambda: row.state is DownloadState.DONE, timeout=20_000)
    assert not row.retry_button.isVisible() and row.use_button.isVisible()
    assert [p.catalog_id for p in d.library.pairs()] == ["test-pair"]
    d.done(0)


def test_download_states_come_from_the_downloads_outcome_not_its_words(qtbot):
    from speculum.models.download import DownloadCancelled, DownloadPaused
    from speculum.ui.library.downloadrow import DownloadRow, DownloadState, DownloadWorker

    def job(error):
        def run(progress, cancel):
            raise error
        return run

    outcomes = []
    for error in (DownloadCancelled("whatever words"), DownloadPaused("cancelled, says the text"),
                  RuntimeError("the job was cancelled by the disk")):
        worker = DownloadWorker(job(error))
        worker.failed.connect(lambda state, message: outcomes.append(state))
        worker.run()
    assert outcomes == [DownloadState.CANCELLED, DownloadState.PAUSED, DownloadState.FAILED]
    row = DownloadRow("x", job(None))
    qtbot.addWidget(row)
    row.show_failed(DownloadState.FAILED, "The download was cancelled by the server")  # words do not decide
    assert row.state is DownloadState.FAILED and row.retry_button.isVisibleTo(row)


# ---- 10: the first start without a model -------------------------------------------------------


def test_an_empty_models_folder_opens_on_how_to_get_a_model(qtbot, open_window, tmp_path, monkeypatch, smollm_path):
    from speculum.ui import mainwindow
    from speculum.ui.library.getmodel import DEMO_COMMAND

    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(tmp_path / "empty"))
    w = open_window()
    step = w.get_model
    assert step.isVisible() and step.command.text() == DEMO_COMMAND
    assert "install-demo" in DEMO_COMMAND and step.models_button.isVisible() and step.open_button.isVisible()
    assert not w.model_bar.load_button.isEnabled()  # nothing to load
    step.copy_button.click()
    assert QGuiApplication.clipboard().text() == DEMO_COMMAND and step.copy_button.text() == "Copied"
    qtbot.waitUntil(lambda: step.copy_button.text() == "Copy", timeout=5_000)
    w.send("Hello")
    assert "no model yet" in w.chat.banner.text()
    # Open… takes a GGUF from anywhere and loads it: the step goes.
    monkeypatch.setattr(mainwindow, "pick_model_file", lambda parent: str(smollm_path))
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        step.open_button.click()
    assert not step.isVisible() and w.model_bar.target_combo.currentData() == str(smollm_path)


# ---- 4: the toolbar serving at 1280 pixels, after a crash and Reload -----------------------------


def _in_sight(widget, bar) -> bool:
    at = widget.mapTo(bar, QPoint(0, 0))
    return widget.isVisible() and at.x() >= 0 and at.x() + widget.width() <= bar.width()


def test_the_toolbar_shows_serving_at_1280_pixels_after_a_crash_and_reload(qtbot, open_window, smollm_path,
                                                                          monkeypatch):
    from speculum.engine_process import CRASH_SWITCH

    monkeypatch.setenv(CRASH_SWITCH, "mid_generation")
    w = open_window(smollm_path, mode="off", max_tokens=32)
    w.resize(1280, 720)
    bar, panel = w.model_bar, w.model_bar.serve_panel
    qtbot.waitUntil(lambda: bar.width() == 1280, timeout=5_000)
    widths = [bar.target_combo.width(), bar.draft_combo.width()]
    port = _free_port()
    panel.port.setValue(port)
    with qtbot.waitSignal(w.engine.worker.serving, timeout=LOAD_MS):
        panel.switch.click()
    with qtbot.waitSignal(w.engineDied, timeout=GENERATE_MS):
        w.send("Count from one to twenty in words.")
    monkeypatch.delenv(CRASH_SWITCH)
    with qtbot.waitSignal(w.engine.worker.serving, timeout=LOAD_MS):
        w.chat.banner.trigger("Reload")
    for _ in range(2):  # requests answered: their count joins the address
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=GENERATE_MS / 1000, json={
            "model": panel.model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert reply.status_code == 200
    qtbot.waitUntil(lambda: panel.answered == 2, timeout=GENERATE_MS)
    qtbot.waitUntil(lambda: all(_in_sight(x, bar) for x in (panel.switch, panel.url, panel.copy)), timeout=5_000)
    assert not bar.findChild(QToolButton, "qt_toolbar_ext_button").isVisible()  # nothing in the "»" menu
    assert panel.switch.isChecked() and panel.url.text() == f"127.0.0.1:{port} · 2 requests"
    assert panel.url.width() >= panel.url.sizeHint().width()  # its text whole, not cut off
    assert f"http://127.0.0.1:{port}/v1" in panel.url.toolTip() and panel.model_id in panel.url.toolTip()
    for combo, before in zip((bar.target_combo, bar.draft_combo), widths):  # the names keep their room
        assert combo.width() >= 0.85 * before, (combo.width(), before)


# ---- 5: Draft model mode needs a draft model ----------------------------------------------------


def test_draft_model_mode_is_offered_only_with_a_draft_model_loaded(qtbot, open_window, smollm_path, tmp_path):
    w = open_window(smollm_path, None, mode="draft", max_tokens=8)
    bar = w.model_bar
    index = bar.mode_combo.findData(Mode.DRAFT)
    assert not bar.mode_combo.model().item(index).isEnabled()
    assert "No draft model is loaded" in bar.mode_combo.itemData(index, Qt.ToolTipRole)
    assert bar.mode_combo.currentData() == Mode.AUTO  # the saved "draft" could not stand
    assert bar.draft_combo.findData(str(smollm_path)) < 0  # a model is never offered as its own draft
    twin = tmp_path / "SmolLM2-135M-twin.gguf"
    try:
        twin.symlink_to(smollm_path)
    except OSError:
        shutil.copy(smollm_path, twin)
    w.set_pair(str(smollm_path), str(twin), load=False)
    assert not bar.mode_combo.model().item(index).isEnabled()  # picked, not loaded: Send would still fail
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()
    assert bar.mode_combo.model().item(index).isEnabled() and bar.mode_combo.itemData(index, Qt.ToolTipRole) is None
    bar.mode_combo.setCurrentIndex(index)
    answer = send(qtbot, w, "Say hello.")
    assert answer.role == "assistant" and answer.mode == Mode.DRAFT and answer.content.strip()


# ---- 11: the keyboard ---------------------------------------------------------------------------


def test_tab_walks_the_window_in_layout_order_with_a_visible_focus_on_every_stop(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup", max_tokens=8)
    send(qtbot, w, "Say hello.")  # an answer: the replay controls are stops too
    w.activateWindow()
    w.chat.input.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is w.chat.input, timeout=5_000)
    regions = {"toolbar": w.model_bar, "sidebar": w.panes.columns[0], "centre": w.panes.columns[1],
               "speculation": w.panes.columns[2], "status bar": w.load_status}
    seen = []
    for _ in range(80):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Tab)
        focus = QApplication.focusWidget()
        if focus is w.chat.input:
            break
        seen.append(focus)
        ring = w.focus_ring
        assert ring.isVisible() and ring.geometry().contains(QRect(focus.mapTo(w, QPoint(0, 0)), focus.size())), focus
        image = w.grab().toImage()
        edge = QColor(image.pixel(ring.geometry().left() + 1, ring.geometry().center().y()))
        assert edge.blue() > 170 and edge.red() < 120, (focus, edge.name())  # the ring is drawn, in sight
    regions_seen = []
    for focus in seen:
        region = next((name for name, area in regions.items() if area.isAncestorOf(focus)), focus)
        if not regions_seen or regions_seen[-1] != region:
            regions_seen.append(region)
    # Left to right, top to bottom (the status bar's Postpone while this machine is measured, at the bottom).
    assert [r for r in regions_seen if r != "status bar"] == ["centre", "speculation", "toolbar", "sidebar", "centre"]
    if "status bar" in regions_seen:
        assert regions_seen.index("status bar") == 2
    replay = w.speculation_pane.replay.bar
    assert replay.play in seen and w.model_bar.serve_panel.switch in seen
    assert w.model_bar.widgetForAction(w.model_bar.document_toggle) in seen
    assert RING.name() == "#2f6fdf"


def test_a_model_got_through_the_models_dialog_ends_the_first_step(qtbot, open_window, tmp_path, monkeypatch,
                                                                   smollm_path):
    from speculum.ui.library.models_dialog import ModelsDialog

    folder = tmp_path / "models"
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(folder))
    w = open_window()
    assert w.get_model.isVisible() and w.model_bar.target_combo.count() == 0
    w.get_model.models_button.click()
    dialog = w.findChild(ModelsDialog)
    qtbot.waitUntil(lambda: dialog.isVisible(), timeout=10_000)
    folder.mkdir(exist_ok=True)
    shutil.copy(smollm_path, folder / "SmolLM2-copy.gguf")  # as a download would leave it
    dialog.reject()  # closed without "Use this pair": the picker still looks again
    qtbot.waitUntil(lambda: not w.get_model.isVisible(), timeout=5_000)
    assert w.model_bar.target_combo.currentData() == str(folder / "SmolLM2-copy.gguf")
    assert w.model_bar.load_button.isEnabled()


def test_a_banners_buttons_are_tab_stops_where_they_are_seen(qtbot):
    from PySide6.QtWidgets import QLineEdit

    from speculum.ui.banner import Banner

    window = QWidget()
    layout = QVBoxLayout(window)
    above, banner, below = QLineEdit(), Banner(), QLineEdit()
    for widget in (above, banner, below):
        layout.addWidget(widget)
    qtbot.addWidget(window)
    window.show()
    banner.show_message("The engine stopped.", actions=[("Reload with the safe profile", lambda: None),
                                                        ("Reload", lambda: None)])
    above.setFocus()
    qtbot.waitUntil(lambda: above.hasFocus(), timeout=2_000)
    order = []
    for _ in range(4):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Tab)
        focus = QApplication.focusWidget()
        order.append(focus.text() if focus is not below else "below")
    assert order == ["Reload with the safe profile", "Reload", "✕", "below"]


def test_copy_buttons_are_tab_stops_right_after_the_transcript(qtbot):
    from PySide6.QtWidgets import QLineEdit

    window = QWidget()
    layout = QVBoxLayout(window)
    view, after = Transcript(), QLineEdit()
    layout.addWidget(view)
    layout.addWidget(after)
    qtbot.addWidget(window)
    window.resize(520, 420)
    window.show()
    view.show_messages([Message("user", "Two blocks"),
                        Message("assistant", "```\na = 1\n```\n\nand\n\n```\nb = 2\n```")])
    qtbot.waitUntil(lambda: len(view.code_blocks.shown) == 2, timeout=5_000)
    view.setFocus()
    qtbot.waitUntil(view.hasFocus, timeout=2_000)
    stops = []
    for _ in range(3):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Tab)
        stops.append(QApplication.focusWidget())
    assert stops == [*view.code_blocks.copy_buttons, after]
    qtbot.keyClick(stops[1], Qt.Key_Space)
    assert QGuiApplication.clipboard().text() == "b = 2"
