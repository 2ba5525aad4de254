"""The engine's first measurement of this machine gives way to the user: it waits while they
type in the input box, and "Later" puts it off (real window, real engine on SmolLM2)."""

from __future__ import annotations

import json
import time

from PySide6.QtCore import Qt

from speculum import paths

from live_window import LOAD_MS, send


def measured_sizes() -> int:
    """Pass sizes whose cost the auto policy has saved on disk (6 or more: measured)."""
    stores = paths.data_dir() / "policy"
    saved = [json.loads(f.read_text()) for f in stores.glob("*.json")] if stores.is_dir() else []
    return max((len(s["costs"]["verify_s"]) for s in saved), default=0)


def test_measuring_waits_while_the_user_types_and_starts_after_a_quiet_spell(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, load=False, mode="auto")  # fresh data: nothing measured here yet
    w.engine.typing_quiet_s = 5.0
    reports = []  # (measuring?, still typing?) as the engine's reports arrive
    typing = [True]
    w.engine.worker.measuring.connect(lambda on: reports.append((on, typing[0])), Qt.DirectConnection)
    qtbot.keyClicks(w.chat.input, "Wh")  # typing while the models load
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()
    until = time.monotonic() + 8
    while time.monotonic() < until:  # a keystroke every 0.3 s, for 8 s after the load
        qtbot.keyClicks(w.chat.input, "a")
        qtbot.wait(300)
    typing[0] = False
    assert not [on for on, _ in reports if on], "the engine measured while the user typed"
    assert not w.load_status.measuring.isVisible()
    # The typing paused: after its quiet spell the measurement runs, and says so.
    qtbot.waitUntil(lambda: (True, False) in reports, timeout=LOAD_MS)
    qtbot.waitUntil(lambda: w.load_status.measuring.isVisible() or (False, False) in reports, timeout=LOAD_MS)
    assert w.chat.input.toPlainText().startswith("Whaaa")  # nothing typed was lost
    qtbot.waitUntil(lambda: (False, False) in reports, timeout=LOAD_MS)
    qtbot.waitUntil(lambda: measured_sizes() >= 6, timeout=LOAD_MS)


def test_later_puts_the_measuring_off_for_this_session(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, load=False, mode="auto")
    status = w.load_status
    assert "Auto mode" in status.measuring.toolTip() and "estimates" in status.later.toolTip()
    reports, offered = [], []

    def later(on: bool) -> None:  # after the window's own slot: the user picks Later at once
        reports.append(on)
        if on and not offered:
            offered.append((status.measuring.isVisible(), status.later.isVisible()))
            session = [a for a in status.later.menu().actions() if a.text() == "Not again this session"]
            session[0].trigger()

    w.engine.worker.measuring.connect(later)
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()
    qtbot.waitUntil(lambda: reports[-2:] == [True, False] if reports else False, timeout=LOAD_MS)
    assert offered == [(True, True)]  # "Later" sits beside "Measuring this machine…"
    assert status.measuring.isHidden() and status.later.isHidden()
    assert measured_sizes() < 6  # put off, not finished
    # A fresh engine (Load again) and an answer: still not measured while the window is open.
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()
    send(qtbot, w, "Say hello.")
    qtbot.wait(3000)
    assert reports == [True, False] and measured_sizes() < 6
