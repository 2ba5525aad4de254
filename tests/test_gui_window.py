"""The real window driven with pytest-qt on a real small model (SmolLM2-135M, CPU).

Generations are kept short; each test loads its own window over private data folders.
"""

from __future__ import annotations

import json
import shutil

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from speculum import paths
from speculum.conversations import ConversationStore
from speculum.ui import look
from speculum.ui.mainwindow import MainWindow
from speculum.ui.settings import Settings
from speculum.ui.speculation.stats import prompt_read
from live_window import GENERATE_MS, LOAD_MS, send

COPY_PROMPT = ("Copy this text exactly, twice:\nThe quick brown fox jumps over the lazy dog. "
               "Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump.")


def test_answer_fills_transcript_and_speculation_view(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup", k=4)
    assert w.windowTitle().startswith("Speculum")
    assert w.load_status.backend_label.text().startswith("Backend: CPU")
    answer = send(qtbot, w, COPY_PROMPT)

    assert answer.role == "assistant" and answer.content.strip()
    assert "quick brown fox" in w.chat.transcript.toPlainText()
    runs = w.speculation_pane.speculation.runs()
    kinds = {kind for _, kind, _ in runs}
    assert {look.ACCEPTED, look.REJECTED} <= kinds
    for text, kind, fmt in runs:
        if kind == look.REJECTED:
            assert fmt.fontStrikeOut()
            assert fmt.background().color() == QColor(look.COLOURS[look.REJECTED][1])
        if kind == look.ACCEPTED:
            assert not fmt.fontStrikeOut()
            assert fmt.background().color() == QColor(look.COLOURS[look.ACCEPTED][1])
    # Hovering a token names its cycle, draft position, drafter and probability.
    doc_text = w.speculation_pane.speculation.toPlainText()
    accepted = next(t for t, k, _ in runs if k == look.ACCEPTED)
    token = w.speculation_pane.speculation.token_at(doc_text.index(accepted))
    assert token is not None
    assert "Cycle" in token[2] and "draft position" in token[2] and "prompt lookup" in token[2] and "p = " in token[2]
    # The stats panel was filled live.
    assert "%" in w.speculation_pane.stats.value(w.speculation_pane.stats.ACCEPTANCE)
    assert w.speculation_pane.stats.value(w.speculation_pane.stats.RATE) != "—"
    assert w.speculation_pane.stats.value(w.speculation_pane.stats.POLICY).startswith("prompt lookup, k = ")
    assert w.speculation_pane.stats.bars.rates and len(w.speculation_pane.stats.chart.points) > 1


def test_no_limit_by_default_and_continue_writes_on_in_the_same_answer(qtbot, open_window, smollm_path):
    from PySide6.QtCore import QUrl

    fresh = open_window(max_tokens=Settings().max_tokens)
    assert fresh.generation_form.max_tokens.text() == "Until the end"  # not 256: no answer is cut unless the user asks
    assert fresh.generation_form.request(fresh.current, "off").max_tokens == 0
    fresh.close()

    w = open_window(smollm_path, mode="lookup", max_tokens=12)
    answer = send(qtbot, w, COPY_PROMPT)
    assert answer.finish == "max_tokens" and answer.stats["tokens"] == 12
    assert "Stopped at 12 tokens — Continue" in w.chat.transcript.toPlainText()
    first_text, first_cycles = answer.content, len(answer.cycles)
    results = []
    w.engine.worker.finished.connect(results.append, Qt.DirectConnection)
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS):
        w.chat.transcript.anchorClicked.emit(QUrl("continue:1"))  # the Continue link
    grown = w.current.messages[-1]
    assert len(w.current.messages) == 2  # the same answer, grown in place
    assert grown.content.startswith(first_text) and len(grown.content) > len(first_text)
    assert len(grown.cycles) > first_cycles and [c["index"] for c in grown.cycles] == list(range(len(grown.cycles)))
    assert grown.stats["tokens"] == sum(len(c["emitted"]) for c in grown.cycles) > 12
    # The KV cache held the prompt and the answer so far: only the last token is read (by the first pass).
    assert (results[0].snapshot.prompt_tokens, results[0].snapshot.prompt_reused) == (1, results[0].snapshot.prompt_total - 1)
    assert w.chat.transcript.toPlainText().count("Assistant") == 1
    assert w.speculation_pane.replay.bar.slider.maximum() == 2 * len(grown.cycles)


def test_the_first_measurement_of_this_machine_shows_quietly(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, load=False, mode="auto")
    assert w.load_status.measuring.isHidden()
    shown = []  # (measuring, the caption shown) as each report reached the window
    w.engine.worker.measuring.connect(lambda on: shown.append((on, w.load_status.measuring.isVisible())))
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()
    qtbot.waitUntil(lambda: bool(shown), timeout=LOAD_MS)  # fresh data: nothing measured here yet
    assert shown[0] == (True, True) and w.load_status.measuring.text() == "Measuring this machine…"
    assert not w.chat.banner.isVisible()  # a caption in the status bar, not a message
    send(qtbot, w, "Say hello.")  # a request stops it at once (it goes on later, when idle)
    assert (False, False) in shown


def test_enter_sends_and_shift_enter_breaks_the_line(qtbot, open_window):
    w = open_window()
    sent = []
    w.chat.input.submitted.connect(sent.append)
    qtbot.keyClicks(w.chat.input, "first line")
    qtbot.keyClick(w.chat.input, Qt.Key_Return, Qt.ShiftModifier)
    qtbot.keyClicks(w.chat.input, "second")
    assert w.chat.input.toPlainText() == "first line\nsecond" and not sent
    qtbot.keyClick(w.chat.input, Qt.Key_Return)
    assert sent == ["first line\nsecond"]


def test_stop_keeps_the_partial_answer(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="off", max_tokens=1024)
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS):
        w.chat.input.setPlainText("Write a long story about a lighthouse keeper and the sea.")
        qtbot.keyClick(w.chat.input, Qt.Key_Return)
        qtbot.waitUntil(lambda: len(w.speculation_pane.speculation.runs()) >= 8, timeout=GENERATE_MS)
        assert w.chat.stop_button.isEnabled()
        w.chat.document.editor.setPlainText("A document pasted while the answer is being written.")
        assert not w.chat.document.summarise_button.isEnabled()  # one generation at a time
        qtbot.keyClick(w.chat.input, Qt.Key_Escape)
    answer = w.current.messages[-1]
    assert answer.finish == "stopped"
    assert answer.content.strip() and answer.stats["tokens"] < 1024
    assert answer.content.strip()[:20] in w.chat.transcript.toPlainText()
    assert "stopped" in w.chat.transcript.toPlainText()
    assert w.chat.send_button.isEnabled() and not w.chat.stop_button.isEnabled()


def test_second_turn_reuses_the_cache(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup", max_tokens=24)
    first = send(qtbot, w, "Name three colours of the rainbow.")
    second = send(qtbot, w, "Now name two more.")
    assert len(w.current.messages) == 4
    # Turn two decodes only what is new: far fewer tokens than its whole prompt, which holds turn one.
    assert second.stats["prompt_total"] > first.stats["prompt_total"]
    assert second.stats["prompt_tokens"] < second.stats["prompt_total"] - first.stats["prompt_total"] + 8
    assert "reused from the cache" in w.speculation_pane.stats.value(w.speculation_pane.stats.PROMPT)


def test_the_window_fits_a_small_laptop_screen(qtbot, open_window):
    # 1366x768 at 125% scale: 1093x614 logical pixels, about 560 under a title bar and a task
    # bar. The side panes asked for 650 pixels, the window could not be shorter than 714, and
    # the input box went off the screen's bottom.
    from PySide6.QtCore import QPoint

    w = open_window()
    w.resize(1093, 560)
    qtbot.waitUntil(lambda: w.height() == 560, timeout=5_000)
    bottom = w.chat.send_button.mapTo(w, QPoint(0, w.chat.send_button.height())).y()
    assert bottom <= w.height() - w.statusBar().height(), bottom
    assert w.chat.input.visibleRegion().boundingRect().height() >= 40
    area = w.speculation_pane.parentWidget().parentWidget()  # its scroll area (pane, viewport, area)
    qtbot.waitUntil(lambda: area.verticalScrollBar().isVisible(), timeout=5_000)  # what does not fit scrolls
    w.resize(1280, 760)  # where it fits, nothing scrolls (sized by its preferred height, the stats did)
    qtbot.waitUntil(lambda: w.height() == 760, timeout=5_000)
    qtbot.waitUntil(lambda: not area.verticalScrollBar().isVisible(), timeout=5_000)
    assert w.speculation_pane.height() == area.height()
    # The stats' values keep room for their longest one-line texts.
    readout = w.speculation_pane.stats.readout
    width = readout.width() - readout._name_width()
    assert readout.fontMetrics().horizontalAdvance("— (no plain step measured yet)") <= width, width


FIRST_START = """
import json
from PySide6.QtCore import QRect
from PySide6.QtWidgets import QApplication
from speculum.ui.mainwindow import MainWindow
app = QApplication([])
w = MainWindow(autoload=False)
w.show()
app.processEvents()
screen = w.screen().availableGeometry()
def rect(widget):
    return list(QRect(widget.mapToGlobal(widget.rect().topLeft()), widget.size()).getRect())
print(json.dumps({"screen": list(screen.getRect()), "window": list(w.frameGeometry().getRect()),
                  **{name: rect(widget) for name, widget in (("send", w.chat.send_button), ("stop", w.chat.stop_button),
                                                             ("input", w.chat.input), ("status", w.statusBar()))}}))
w.close()
"""


@pytest.mark.parametrize("width,height", [(1366, 768), (1280, 720)])
def test_the_first_window_fits_the_screen_it_opens_on(data_dirs, tmp_path, width, height):
    # A 1366x768 screen with no saved size got a 1440x900 window: Send, Stop, the input box and
    # the status bar off its bottom. A fresh start on a screen of that size, in its own process.
    import os
    import subprocess
    import sys

    screens = tmp_path / "screens.json"
    screens.write_text(json.dumps({"screens": [{"name": "laptop", "x": 0, "y": 0, "width": width,
                                                "height": height, "logicalDpi": 96}]}))
    env = {**os.environ, "QT_QPA_PLATFORM": f"offscreen:configfile={screens}"}
    out = subprocess.run([sys.executable, "-c", FIRST_START], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rects = json.loads(out.stdout.strip().splitlines()[-1])
    sx, sy, sw, sh = rects.pop("screen")
    assert (sw, sh) == (width, height)
    for name, (x, y, w, h) in rects.items():
        assert w > 0 and h > 0 and sx <= x and sy <= y and x + w <= sx + sw and y + h <= sy + sh, (name, rects)
    assert rects["window"][3] <= height - 40  # room left for a title bar


def test_serve_api_stays_in_the_toolbar_of_a_1280_pixel_window(qtbot, open_window, smollm_path, tmp_path):
    # Sized to their longest names, the model pickers pushed the Serve switch into the toolbar's
    # overflow menu once it served (the URL and Copy beside it): the switch to stop it hidden.
    long = tmp_path / "Meta-Llama-3.1-70B-Instruct-abliterated-Q4_K_M-imatrix-calibrated.gguf"
    draft = tmp_path / "Meta-Llama-3.2-1B-Instruct-abliterated-Q4_K_M-imatrix-calibrated.gguf"
    for name in (long, draft):
        try:
            name.symlink_to(smollm_path)
        except OSError:  # Windows without the symlink privilege
            shutil.copy(smollm_path, name)
    w = open_window(long, draft, load=False)
    w.resize(1280, 800)
    for serving in (False, True):
        if serving:
            w.model_bar.serve_panel.show_serving("http://127.0.0.1:65535/v1", "model")
        qtbot.waitUntil(lambda: w.model_bar.serve_panel.switch.isVisible(), timeout=5_000)
        assert w.model_bar.serve_panel.copy.isVisible() == serving
    for combo in (w.model_bar.target_combo, w.model_bar.draft_combo):  # a long name elided in its middle: its start and end in sight
        shown = combo.shown_text()
        assert "…" in shown and shown.startswith("Meta-Llama") and shown.endswith("library)"), shown
        assert combo.currentData().replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".gguf") in combo.toolTip()  # whole on hover
    w.resize(1920, 800)  # room to spare: the pickers widen
    qtbot.waitUntil(lambda: w.model_bar.target_combo.width() > 1.3 * w.model_bar.target_combo.minimumSizeHint().width(), timeout=5_000)


def test_replay_steps_through_cycles(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup", max_tokens=32)
    send(qtbot, w, COPY_PROMPT)
    cycles = w.current.messages[-1].cycles
    drafted = next(i for i, c in enumerate(cycles) if c["drafted"])
    bar = w.speculation_pane.replay.bar
    assert bar.isEnabled() and bar.slider.maximum() == 2 * len(cycles)

    bar.set_step(0)
    assert w.speculation_pane.speculation.runs() == []
    bar.set_step(2 * drafted + 1)  # that cycle's draft proposed, not yet verified
    kinds = [k for _, k, _ in w.speculation_pane.speculation.runs()]
    assert kinds[-len(cycles[drafted]["drafted"]):] == [look.PROPOSED] * len(cycles[drafted]["drafted"])
    assert "proposed" in w.speculation_pane.replay.label.text()
    # The Policy row names the choice being proposed, not the cycle before's.
    for i in (0, drafted, len(cycles) - 1):
        bar.set_step(2 * i + 1)
        policy = cycles[i]["policy"]
        first = w.speculation_pane.stats.value(w.speculation_pane.stats.POLICY).splitlines()[0]
        assert first == f"{look.DRAFTERS[policy['source']]}, k = {policy['k']}", (i, first, policy)
    bar.set_step(2 * drafted + 2)  # verified: accepted and struck
    kinds = [k for _, k, _ in w.speculation_pane.speculation.runs()]
    assert look.PROPOSED not in kinds
    assert f"Cycle {drafted + 1} of {len(cycles)}" in w.speculation_pane.replay.label.text()
    assert "accepted" in w.speculation_pane.replay.label.text()
    # The transcript rewinds too: the answer as it stood after half the cycles, no further.
    half = len(cycles) // 2
    bar.set_step(2 * half)
    answer = w.current.messages[-1].content
    so_far = "".join(c["text"] for c in cycles[:half])
    assert "replaying" in w.chat.transcript.toPlainText()
    assert w.chat.transcript.answer_text().split() == so_far.split() != answer.split()
    qtbot.keyClick(w.chat.input, Qt.Key_Escape)  # Esc: back to the final answer
    assert bar.step == 2 * len(cycles) and "replaying" not in w.chat.transcript.toPlainText()
    assert answer.strip()[:20] in w.chat.transcript.toPlainText()

    bar.set_step(0)
    bar.play.click()
    qtbot.waitUntil(lambda: bar.step == 2 * len(cycles) and not bar.play.isChecked(), timeout=60_000)
    live_kinds = [k for _, k, _ in w.speculation_pane.speculation.runs()]
    assert look.ACCEPTED in live_kinds and look.PROPOSED not in live_kinds
    # At the last step the whole conversation is back, with its Replay link.
    assert "replaying" not in w.chat.transcript.toPlainText() and "Replay" in w.chat.transcript.toPlainText()
    # The stats panel follows the replay.
    assert w.speculation_pane.stats.chart.points


def test_conversation_survives_closing_and_reopening(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup", max_tokens=24)
    answer = send(qtbot, w, "Say hello to the lighthouse keeper.")
    conv_id = w.current.id
    w.rename_conversation(conv_id, "Keeper greeting")
    other = w.new_conversation()
    w.rename_conversation(other.id, "To delete")
    w.delete_conversation(other.id, confirm=False)
    w.close()
    assert (paths.data_dir() / "conversations" / f"{conv_id}.json").is_file()

    again = open_window()
    titles = [again.conversations.view.item(i).text() for i in range(again.conversations.view.count())]
    assert titles == ["Keeper greeting"]
    assert again.current.id == conv_id
    assert answer.content.strip()[:20] in again.chat.transcript.toPlainText()
    restored = again.current.messages[-1]
    assert [c["emitted"] for c in restored.cycles] == [c["emitted"] for c in answer.cycles] and restored.mode == "lookup"
    # Replay works from the saved cycle records.
    assert again.speculation_pane.replay.bar.isEnabled() and again.speculation_pane.replay.bar.slider.maximum() == 2 * len(answer.cycles)
    again.speculation_pane.replay.bar.set_step(2)
    assert again.speculation_pane.speculation.runs()
    # Settings came back too.
    assert again.model_bar.mode_combo.currentData() == "lookup" and again.generation_form.max_tokens.value() == 24
    assert again.model_bar.target_combo.currentData() == str(smollm_path)


def test_closing_mid_generation_keeps_the_partial_answer(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup", max_tokens=1024)
    w.chat.input.setPlainText("Write a long story about a lighthouse keeper and the sea.")
    qtbot.keyClick(w.chat.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: w.speculation_pane.stats.value(w.speculation_pane.stats.RATE) != "—", timeout=GENERATE_MS)
    conv_id = w.current.id
    w.close()

    again = open_window()
    assert again.current.id == conv_id
    kept = again.current.messages[-1]
    assert kept.role == "assistant" and kept.finish == "stopped" and kept.content.strip()
    # Saved like any answer: its numbers and its cycles, so replay works after the restart.
    assert kept.stats["tokens"] > 0 and kept.cycles
    assert again.speculation_pane.replay.bar.isEnabled() and again.speculation_pane.replay.bar.slider.maximum() == 2 * len(kept.cycles)


def test_summarise_highlights_copied_spans(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup", max_tokens=40, n_ctx=2048)
    document = "\n\n".join(paths.resource("samples/lighthouse.md").read_text(encoding="utf-8").split("\n\n")[:3])
    w.model_bar.document_toggle.setChecked(True)
    w.chat.document.set_document(document, "lighthouse.md")
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS):
        qtbot.mouseClick(w.chat.document.summarise_button, Qt.LeftButton)
    answer = w.current.messages[-1]
    assert answer.role == "assistant" and answer.content.strip()
    assert w.current.messages[-2].shown.startswith("Summarise lighthouse.md")
    spans = w.chat.document.highlighted()
    assert spans, "accepted lookup drafts should be found in the document"
    assert all(span.strip() and span in document.replace("\n", "\u2029") for span in spans)
    assert "copied into the answer" in w.chat.document.caption.text()


def test_reading_a_document_shows_tokens_read(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="auto", max_tokens=8, n_ctx=2048)
    document = paths.resource("samples/lighthouse.md").read_text(encoding="utf-8")
    w.chat.document.set_document(document, "lighthouse.md")
    seen = []
    # After the window's own slot: what the bar showed for each report.
    headers = []  # the answer's header line as the transcript showed it at each report
    w.engine.worker.promptProgress.connect(
        lambda read, total: (seen.append((read, total, w.chat.prompt_progress.isVisible(),
                                          w.chat.prompt_progress.text())),
                             headers.append(w.chat.transcript.toPlainText().splitlines()[-1])))
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS):
        w.summarise()
    total = seen[-1][1]
    assert total > 256 and seen[-1][0] == total
    shown = [text for read, _, visible, text in seen if visible]
    assert shown and shown[0] == f"Reading the prompt… 0 / {total:,} tokens"
    assert not w.chat.prompt_progress.isVisible()  # gone once the answer is written
    # The answer's header says what is happening: reading, then writing (not "writing…" for both).
    assert headers[0] == "Assistant · reading the prompt…" and headers[-1] == "Assistant · writing…", headers
    assert "reading the prompt" not in w.chat.transcript.toPlainText()


def test_long_document_is_summarised_in_parts_with_one_set_of_numbers(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup", max_tokens=16, n_ctx=512)
    document = paths.resource("samples/lighthouse.md").read_text(encoding="utf-8") * 2
    w.chat.document.set_document(document, "long.md")
    seen = []  # stage changes and prompt reads, in order
    w.engine.worker.stageChanged.connect(lambda stage: seen.append(("stage", stage)))
    w.engine.worker.promptProgress.connect(lambda read, total: seen.append(("read", read)))
    totals = {}  # each stage's prompt size, as the engine reported reading it
    w.engine.worker.promptProgress.connect(lambda read, total: totals.update({stages_seen()[-1]: total}))
    stages_seen = lambda: [s for kind, s in seen if kind == "stage"] or [""]  # noqa: E731
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS * 2):
        w.summarise()
        qtbot.waitUntil(lambda: w.chat.document.progress.isVisible(), timeout=GENERATE_MS)
        assert "Part 1 of" in w.chat.document.progress.text()
        part_2 = lambda: any(kind == "stage" and s.startswith("Part 2") for kind, s in seen)  # noqa: E731
        qtbot.waitUntil(lambda: part_2() or not w.generating, timeout=GENERATE_MS)
        if w.generating:  # part 1's text stays on screen while part 2 is written
            qtbot.waitUntil(lambda: "Part 2 of" in w.chat.transcript.toPlainText() or not w.generating, timeout=GENERATE_MS)
            if w.generating:
                assert "Part 1 of" in w.chat.transcript.toPlainText()
    assert not w.chat.banner.isVisible(), w.chat.banner.text()
    stages = [s for kind, s in seen if kind == "stage"]
    parts = [s for s in stages if s.startswith("Part")]
    assert len(parts) >= 2 and stages[-1].startswith("Combining")
    # Each part's prompt is read under its own name: a stage is named before its prompt is read.
    kinds = [kind for kind, _ in seen]
    assert all(kinds[i - 1] == "stage" for i, (kind, read) in enumerate(seen) if kind == "read" and read == 0)
    answer = w.current.messages[-1]
    assert f"Summarised in {len(parts)} parts" in answer.note
    assert "— Part 1 of" in w.speculation_pane.speculation.toPlainText() and "— Combining —" in w.speculation_pane.speculation.toPlainText()
    # One set of numbers for the whole answer: header, stats panel, chart and replay agree.
    tokens = sum(len(c["emitted"]) for c in answer.cycles)
    assert answer.stats["tokens"] == tokens
    header = f"{answer.stats['tokens_per_s']:.1f} tok/s"
    assert header in w.chat.transcript.toPlainText()
    assert w.speculation_pane.stats.value(w.speculation_pane.stats.RATE).startswith(f"{answer.stats['tokens_per_s']:.1f}  ({tokens} tokens")
    times = [t for t, _ in w.speculation_pane.stats.chart.points]
    assert times == sorted(times) and len(times) == len(answer.cycles)  # one line, not one per part
    bar = w.speculation_pane.replay.bar
    assert bar.slider.maximum() == 2 * len(answer.cycles)
    part2 = next(i for i, c in enumerate(answer.cycles) if c.get("stage", "").startswith("Part 2"))
    bar.set_step(2 * part2 + 2)
    assert w.speculation_pane.replay.label.text().startswith(f"Part 2 of {len(parts)} · Cycle {part2 + 1} of {len(answer.cycles)}")
    bar.set_step(bar.slider.maximum())
    assert w.speculation_pane.stats.value(w.speculation_pane.stats.RATE).startswith(f"{answer.stats['tokens_per_s']:.1f}  ({tokens} tokens")
    # Replaying a part shows that part's own prompt; the final answer, all its prompts together.
    stats = w.speculation_pane.stats
    whole = prompt_read(answer.stats["prompt_tokens"], answer.stats["prompt_total"], answer.stats["prompt_reused"])
    assert stats.value(stats.PROMPT) == whole
    firsts = [i for i, c in enumerate(answer.cycles) if c["index"] == 0]  # where each part begins
    counts = [answer.cycles[i]["prompt"] for i in firsts]
    assert len(firsts) > len(parts) and sum(c[1] for c in counts) == answer.stats["prompt_total"]
    for i, (read, total, reused) in zip(firsts, counts):
        stage = answer.cycles[i]["stage"]
        if stage.startswith("Part") and stage in totals:  # the count its reading bar showed
            assert total == totals[stage] and read + reused == total, (stage, totals)
        bar.set_step(2 * i + 2)  # the part's first cycle verified
        assert stats.value(stats.PROMPT) == f"{stage}: {prompt_read(read, total, reused)}"
    assert len({c[1] for c in counts[:len(parts)]}) > 1  # the parts' prompts differ: not one count for all
    # The same once the conversation is read back from its file.
    again = next(c for c in ConversationStore().load_all() if c.id == w.current.id)
    w.speculation_pane.replay.load(again, len(again.messages) - 1, 2 * firsts[1] + 2, None)
    assert stats.value(stats.PROMPT) == f"{answer.cycles[firsts[1]]['stage']}: {prompt_read(*counts[1])}"


def test_missing_model_file_shows_a_message(qtbot, open_window, tmp_path):
    w = open_window(tmp_path / "nowhere.gguf", load=False)
    with qtbot.waitSignal(w.loadFailed, timeout=LOAD_MS):
        w.load_pair()
    assert "not found" in w.chat.banner.text() and "nowhere.gguf" in w.chat.banner.text()
    assert w.load_status.model_label.text() == "No model loaded"
    w.send("hello?")
    assert "No model is loaded" in w.chat.banner.text()


def test_incompatible_pair_shows_a_message(qtbot, open_window, qwen_target_path, gemma_path):
    w = open_window(qwen_target_path, gemma_path, load=False)
    with qtbot.waitSignal(w.loadFailed, timeout=LOAD_MS):
        w.load_pair()
    assert "cannot speculate" in w.chat.banner.text()


def test_model_load_failure_shows_a_message(qtbot, open_window, smollm_path, tmp_path):
    # A well-formed GGUF whose architecture llama.cpp does not know: the header checks pass, the load fails.
    broken = tmp_path / "unknown-arch.gguf"
    shutil.copy(smollm_path, broken)
    data = bytearray(broken.read_bytes()[: 1 << 16])
    key = b"general.architecture"
    at = data.index(key) + len(key) + 4 + 8  # value type, string length
    assert data[at:at + 5] == b"llama"
    with open(broken, "r+b") as f:
        f.seek(at)
        f.write(b"llamz")
    w = open_window(broken, load=False)
    with qtbot.waitSignal(w.loadFailed, timeout=LOAD_MS):
        w.load_pair()
    assert "could not load" in w.chat.banner.text() and "unknown-arch.gguf" in w.chat.banner.text()


def test_context_full_shows_a_message_and_keeps_the_question(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="off", n_ctx=128)
    question = "Please read all of this. " * 60
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS):
        w.send(question)
    assert "context holds" in w.chat.banner.text()
    assert w.current.messages == []
    assert w.chat.input.toPlainText() == question.strip()


def test_mtp_mode_is_offered_only_with_an_mtp_head_and_errors_name_the_windows_controls(qtbot, open_window,
                                                                                          smollm_path):
    w = open_window(smollm_path, mode="lookup", max_tokens=8)
    mtp = w.model_bar.mode_combo.findData("mtp")
    assert not w.model_bar.mode_combo.model().item(mtp).isEnabled()  # SmolLM2 has no NextN layers
    assert "no multi-token prediction" in w.model_bar.mode_combo.itemData(mtp, Qt.ToolTipRole)
    send(qtbot, w, "Say hello.")
    rate, steps = w.speculation_pane.stats.value(w.speculation_pane.stats.RATE), w.speculation_pane.replay.bar.slider.maximum()
    w.model_bar.mode_combo.setCurrentIndex(w.model_bar.mode_combo.findData("draft"))
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS):
        w.send("hello")
    message = w.chat.banner.text()
    assert "needs a draft model" in message and "Prompt lookup" in message and "--" not in message, message
    # The failed Send kept the previous answer's numbers and its replay.
    assert w.speculation_pane.stats.value(w.speculation_pane.stats.RATE) == rate != "—"
    assert w.speculation_pane.replay.bar.isEnabled() and w.speculation_pane.replay.bar.slider.maximum() == steps


def test_loading_can_be_cancelled(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, load=False)
    assert w.model_bar.models_button is not None
    # Cancel as soon as loading reports progress, the way the Cancel button would.
    w.engine.worker.loadProgress.connect(lambda *_: w.engine.cancel_load(), Qt.DirectConnection)
    assert w.load_status.cancel_button.isHidden()
    with qtbot.waitSignal(w.loadFailed, timeout=LOAD_MS):
        w.load_pair()
        assert w.load_status.load_progress.isVisible() and w.load_status.cancel_button.isVisible()
    assert "cancelled" in w.chat.banner.text()
    assert not w.loaded and w.load_status.load_progress.isHidden()


def test_settings_file_is_json_with_the_chosen_values(qtbot, open_window):
    w = open_window()
    w.generation_form.temperature.setValue(0.7)
    w.model_bar.mode_combo.setCurrentIndex(w.model_bar.mode_combo.findData("off"))
    saved = json.loads(Settings.path().read_text())
    assert saved["temperature"] == 0.7 and saved["mode"] == "off"


def test_documents_open_by_drop_and_unsupported_files_say_why(qtbot, open_window, tmp_path):
    from PySide6.QtCore import QMimeData, QPointF, QUrl
    from PySide6.QtGui import QDropEvent

    w = open_window()
    note = tmp_path / "notes.md"
    note.write_text("# Notes\n\nThe keepers wrote the weather in the log.", encoding="utf-8")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(note))])
    with qtbot.waitSignal(w.chat.document.documentOpened, timeout=10_000):  # read off the UI thread
        w.chat.document.dropEvent(QDropEvent(QPointF(5, 5), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))
    assert w.chat.document.text().startswith("# Notes") and w.chat.document.name == "notes.md"
    assert w.chat.document.summarise_button.isEnabled()
    odd = tmp_path / "notes.docx"
    odd.write_text("x")
    with qtbot.waitSignal(w.chat.document.error, timeout=10_000):
        w.chat.document.open_path(odd)
    assert "Speculum reads" in w.chat.banner.text() and "notes.docx" in w.chat.banner.text()


def test_a_pair_chosen_in_the_models_dialog_is_loaded(qtbot, open_window, smollm_path):
    w = open_window()
    assert w.model_bar.models_button.isEnabled()  # the library dialog is part of this build
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w._on_pair_ready(str(smollm_path), "")
    assert w.model_bar.target_combo.currentData() == str(smollm_path) and w.model_bar.draft_combo.currentData() == ""
    assert "no draft model" in w.load_status.model_label.text()


def test_run_app_opens_the_window_and_quits_cleanly(qtbot, data_dirs):
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from speculum.ui.app import run_app

    seen = []

    def close_windows():
        for widget in QApplication.topLevelWidgets():
            if isinstance(widget, MainWindow) and widget.isVisible():
                seen.append(widget.windowTitle())
                widget.close()

    QTimer.singleShot(300, close_windows)
    assert run_app(None) == 0
    assert seen and seen[0].startswith("Speculum")
