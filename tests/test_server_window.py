"""The window's Serve switch: its engine process serves the OpenAI API, and API clients'
answers show live in the speculation view and stats."""

from __future__ import annotations

import socket
import threading

import httpx
import openai

from speculum.ui import look
from speculum.ui.speculation.tokenview import KIND
from live_window import GENERATE_MS, LOAD_MS, send


def kinds_shown(view) -> set[str]:
    """The token kinds of every run of text in a speculation view or legend."""
    kinds, block = set(), view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            kinds.add(it.fragment().charFormat().property(KIND))
            it += 1
        block = block.next()
    return kinds - {None}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_switch_serves_the_loaded_model_and_shows_requests_live(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup")
    port = _free_port()
    w.model_bar.serve_panel.port.setValue(port)
    with qtbot.waitSignal(w.engine.worker.serving, timeout=LOAD_MS):
        w.model_bar.serve_panel.switch.click()
    base = f"http://127.0.0.1:{port}/v1"
    assert w.model_bar.serve_panel.url.text() == f"127.0.0.1:{port}" and w.model_bar.serve_panel.copy.isVisible()
    assert base in w.model_bar.serve_panel.url.toolTip()
    assert base in w.model_bar.serve_panel.example() and "curl" in w.model_bar.serve_panel.example()

    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    assert model == smollm_path.stem
    replies = []
    caller = threading.Thread(target=lambda: replies.append(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Copy: the quick brown fox."}], max_tokens=16,
        temperature=0)))
    caller.start()
    qtbot.waitUntil(lambda: bool(replies), timeout=GENERATE_MS)
    caller.join()
    qtbot.waitUntil(lambda: w.speculation_pane.replay.label.text().startswith("Answered an API request"), timeout=GENERATE_MS)
    assert "— API request —" in w.speculation_pane.speculation.toPlainText()
    assert w.speculation_pane.stats.value(w.speculation_pane.stats.RATE) != "—"  # the stats panel shows the API request's numbers
    assert look.PREDICTED not in kinds_shown(w.speculation_pane.speculation.legend)
    # Counted, and logged with its size and speed.
    assert w.model_bar.serve_panel.url.text() == f"127.0.0.1:{port} · 1 request"
    tokens = replies[0].usage.completion_tokens
    assert f"  127.0.0.1  {tokens} tokens, " in w.model_bar.serve_panel.log[0] and w.model_bar.serve_panel.log[0].endswith(" tok/s")
    assert w.model_bar.serve_panel.log[0] in w.model_bar.serve_panel.url.toolTip()

    # A request with a prediction: its accepted drafts have their own colour, named in the legend.
    answer = replies[0].choices[0].message.content
    predicted = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Copy: the quick brown fox."}], max_tokens=16,
        temperature=0, prediction={"type": "content", "content": answer})
    assert predicted.choices[0].message.content == answer
    qtbot.waitUntil(lambda: look.PREDICTED in kinds_shown(w.speculation_pane.speculation), timeout=GENERATE_MS)
    assert look.PREDICTED in kinds_shown(w.speculation_pane.speculation.legend)
    # A client that leaves mid-answer ends its request without a "finished": the window still
    # learns that llama.cpp is done with it, and stops giving way.
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Write a long story."}],
                                            max_tokens=400, stream=True)
    next(iter(stream))
    stream.close()
    qtbot.waitUntil(lambda: not w.engine._decoding and not w.engine.giving_way, timeout=30_000)
    # The window still answers its own questions between API requests.
    assert send(qtbot, w, "Say hello.").content.strip()

    with qtbot.waitSignal(w.engine.worker.serving, timeout=LOAD_MS):
        w.model_bar.serve_panel.switch.click()
    assert not w.model_bar.serve_panel.url.isVisible()
    try:
        httpx.get(base + "/models", timeout=5)
        raise AssertionError("the server should have stopped")
    except httpx.TransportError:
        pass


def test_a_crash_keeps_its_banner_the_partial_answer_replays_and_reload_serves_again(qtbot, open_window, smollm_path,
                                                                                     monkeypatch):
    from PySide6.QtCore import Qt

    from speculum.engine_process import CRASH_SWITCH

    monkeypatch.setenv(CRASH_SWITCH, "mid_generation")
    w = open_window(smollm_path, mode="off", max_tokens=32)
    port = _free_port()
    w.model_bar.serve_panel.port.setValue(port)
    with qtbot.waitSignal(w.engine.worker.serving, timeout=LOAD_MS):
        w.model_bar.serve_panel.switch.click()
    with qtbot.waitSignal(w.engineDied, timeout=GENERATE_MS):
        w.send("Count from one to twenty in words.")
    banner = w.chat.banner.text()
    assert f"serves the API again on port {port}" in banner and not w.model_bar.serve_panel.switch.isChecked()
    kept = w.current.messages[-1]
    assert kept.role == "assistant" and kept.content.strip()
    assert w.speculation_pane.replay.bar.isEnabled() and w.speculation_pane.replay.bar.slider.maximum() == 2 * len(kept.cycles)
    # Send before Reload: the crash's banner and its Reload stay; what was typed stays too.
    w.chat.input.setPlainText("Another question")
    qtbot.keyClick(w.chat.input, Qt.Key_Return)
    assert w.chat.banner.text() == banner and w.chat.banner.action_labels() == ["Reload"]
    assert w.chat.input.toPlainText() == "Another question"
    assert all(m.content.strip() for m in w.current.messages)  # no empty turn

    monkeypatch.delenv(CRASH_SWITCH)
    with qtbot.waitSignal(w.engine.worker.serving, timeout=LOAD_MS):
        w.chat.banner.trigger("Reload")
    assert w.model_bar.serve_panel.switch.isChecked() and w.model_bar.serve_panel.base_url == f"http://127.0.0.1:{port}/v1"
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).status_code == 200
    assert not w.chat.banner.isVisible()


def test_serving_needs_a_loaded_model(qtbot, open_window):
    w = open_window()
    w.model_bar.serve_panel.switch.click()
    assert not w.model_bar.serve_panel.switch.isChecked()
    assert "Load a model first" in w.chat.banner.text()
