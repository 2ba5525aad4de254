"""Text from models, files and saved state shown literally, never loading what it names.

An image in a model's answer or a model name made of HTML used to make Qt open the file it
named (``/dev/zero`` read until the app aborted). Here every such path is a named pipe
watched from another process (tests/traps.py): the tests see any open without reading
/dev/zero or hanging.
"""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QEvent, QPoint, QUrl, Qt
from PySide6.QtGui import QHelpEvent, QTextDocument
from PySide6.QtWidgets import QApplication, QTextEdit, QToolTip

from ggufgen import write_gguf
from speculum import paths
from speculum.conversations import Conversation, ConversationStore, Message
from speculum.engine.cycle import Cycle
from speculum.ui.chat.answer import StagedCycle
from speculum.ui.chat.transcript import Transcript
from traps import FileTrap


@pytest.fixture
def trap(tmp_path):
    t = FileTrap(tmp_path)
    yield t
    t.close()


def hostile_answer(path) -> str:
    return (f"Here is the chart: ![x]({path})\n\nAnd inline <img src=\"{path}\"> too, "
            f"a share ![](//host/share/a.png), a [link](http://example.com \"<img src='{path}'>\").\n\n"
            "```\n![kept](as-code)\n```\n\nInline `![span](code)` and indented:\n\n    a = 1\n    ![b](code)\n")


def settle(widget) -> None:
    """Lay out and paint, as showing the window would, each to its end: every text view's whole
    document laid out (each image in it asked for its size), then the widget painted. An open
    of a trap blocks until the watcher answers, so by the return any open is in its log."""
    QApplication.processEvents()
    views = widget.findChildren(QTextEdit) + ([widget] if isinstance(widget, QTextEdit) else [])
    for view in views:
        view.document().documentLayout().documentSize()  # (lays out what is not laid out yet)
    widget.grab()
    QApplication.processEvents()


def no_images(document) -> bool:
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            if it.fragment().charFormat().isImageFormat():
                return False
            it += 1
        block = block.next()
    return True


def test_an_answer_with_images_and_html_loads_nothing_and_shows_them_as_text(qtbot, trap):
    view = Transcript()
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    answer = hostile_answer(trap.path)

    view.show_messages([Message("user", "draw it"), Message("assistant", answer)])
    settle(view)
    view.begin_answer()
    view.update_answer(answer)  # the live path renders in pieces
    settle(view)
    view.loadResource(QTextDocument.ImageResource, QUrl.fromLocalFile(str(trap.path)))

    assert trap.opened == 0
    shown = view.toPlainText()
    assert f"![x]({trap.path})" in shown
    assert f"<img src=\"{trap.path}\">" in shown
    assert "![](//host/share/a.png)" in shown
    for code in ("![kept](as-code)", "![span](code)", "![b](code)"):
        assert code in shown  # code shows as written, no escape added
    assert no_images(view.document())


def test_a_replay_link_that_is_not_a_number_is_ignored(qtbot):
    view = Transcript()
    qtbot.addWidget(view)
    asked = []
    view.replayRequested.connect(asked.append)
    for url in ("replay:abc", "replay:", "replay:-1", "replay:1e9", "replay:٣", "http://x/replay:2", "replay:2"):
        view.anchorClicked.emit(QUrl(url))
    assert asked == [2]


@pytest.fixture
def window(qtbot, data_dirs, monkeypatch):
    from speculum.ui.mainwindow import MainWindow

    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(data_dirs / "models"))
    paths.set_aside_notices.clear()
    made = []

    def open_(**kwargs):
        w = MainWindow(autoload=False, **kwargs)
        qtbot.addWidget(w)
        w.show()
        made.append(w)
        return w

    yield open_
    for w in made:
        w.close()


def test_model_names_and_saved_drafter_names_show_as_text(qtbot, window, trap):
    from speculum.engine.backend import ModelFacts

    hostile = f'<img src="{trap.path}">'
    w = window()
    w.show_error(f"Could not load {hostile}")
    facts = ModelFacts(path="/m.gguf", name=hostile, architecture=hostile, n_parameters=1, quantization=hostile,
                       file_size=1, vocab_size=1, context_length=1, n_ctx=512, backend="CPU", n_gpu_layers=0)
    w._on_loaded(facts, None)
    cycle = Cycle(0, hostile, 2, [1, 2], ["a", "b"], 1, [1, 3], ["a", "c"], "ac")
    conv = w.current
    conv.messages += [Message("user", "q"), Message("assistant", "ac", cycles=[cycle.to_json()])]
    w.replay_message(1, step=1)  # "Cycle 1 of 1: <drafter> proposed 2 tokens"
    w.speculation_pane.speculation.append_cycles([StagedCycle(cycle)])
    settle(w)
    cursor = w.speculation_pane.speculation.textCursor()
    cursor.setPosition(0)
    spot = w.speculation_pane.speculation.cursorRect(cursor).center() + QPoint(2, 0)
    QApplication.sendEvent(w.speculation_pane.speculation.viewport(),
                           QHelpEvent(QEvent.ToolTip, spot, w.speculation_pane.speculation.viewport().mapToGlobal(spot)))
    tip = QToolTip.text()
    settle(w)

    assert trap.opened == 0
    assert w.chat.banner.label.textFormat() == Qt.PlainText and hostile in w.chat.banner.text()
    assert w.load_status.model_label.textFormat() == Qt.PlainText and hostile in w.load_status.model_label.text()
    assert w.speculation_pane.replay.label.textFormat() == Qt.PlainText and hostile in w.speculation_pane.replay.label.text()
    assert hostile not in tip and "&lt;img" in tip


def test_a_model_whose_architecture_is_html_fails_to_load_in_plain_words(qtbot, window, trap, tmp_path):
    hostile = f'<img src="{trap.path}">'
    model = write_gguf(tmp_path / "evil.gguf", {"general.architecture": hostile, "general.name": hostile},
                       [("token_embd.weight", (8, 4))])
    w = window()
    w.set_pair(str(model), None, load=False)
    with qtbot.waitSignal(w.loadFailed, timeout=60_000):
        w.load_pair()
    settle(w)
    assert trap.opened == 0
    assert w.chat.banner.isVisible() and w.chat.banner.label.textFormat() == Qt.PlainText
    assert "evil.gguf" in w.chat.banner.text() and hostile in w.chat.banner.text()


def test_the_window_opens_on_a_damaged_data_folder_and_says_what_it_set_aside(qtbot, window, data_dirs, trap):
    """Every damaged file of issue 13 point 5 at once, and an answer that names a file to load."""
    data, config, models = data_dirs / "data", data_dirs / "config", data_dirs / "models"
    folder = data / "conversations"
    folder.mkdir(parents=True)
    models.mkdir()
    config.mkdir()
    (config / "settings.json").write_text(json.dumps({"max_tokens": "512", "conversation": "hostile",
                                                      "temperature": 0.4}))
    (models / "library.json").write_text(json.dumps({"pairs": None, "models": [{"source": "x"}]}))
    (folder / "alist.json").write_text("[]")
    (folder / "strange.json").write_text(json.dumps({"id": "strange", "title": "Strange", "updated": "today",
                                                     "messages": ["hello", {"role": "user", "content": "kept"}]}))
    answer = hostile_answer(trap.path)
    cycle = Cycle(0, "lookup", 1, [1], ["x"], 1, [1, 2], ["x", "y"], "xy").to_json()
    del cycle["text"]  # written by an older version
    bad_cycle = dict(cycle, n_accepted="all")
    ConversationStore().save(Conversation(id="hostile", title="Hostile", messages=[
        Message("user", "summarise"), Message("assistant", answer, cycles=[cycle])]))
    (folder / "broken.json").write_text(json.dumps({"id": "broken", "title": "Broken", "messages": [
        {"role": "assistant", "content": "text survives", "cycles": [bad_cycle]}]}))

    w = window()  # reads settings.json itself, as at start
    settle(w)

    assert trap.opened == 0
    assert w.current.id == "hostile"
    shown = w.chat.transcript.toPlainText()
    assert f"![x]({trap.path})" in shown and f"<img src=\"{trap.path}\">" in shown
    assert w.speculation_pane.replay.bar.isEnabled()  # the older cycle record still replays
    assert w.generation_form.max_tokens.value() == 0 and w.generation_form.temperature.value() == 0.4
    titles = {w.conversations.view.item(i).text() for i in range(w.conversations.view.count())}
    assert titles == {"Hostile", "Strange", "Broken"}
    said = w.chat.banner.text()
    assert w.chat.banner.isVisible() and w.chat.banner.label.textFormat() == Qt.PlainText
    for name in ("settings.json", "library.json", "alist.json", "strange.json", "broken.json"):
        assert name in said
    assert "hostile.json" not in said
    w.open_conversation("broken")
    assert "text survives" in w.chat.transcript.toPlainText() and not w.speculation_pane.replay.bar.isEnabled()
