"""The window's RPC workers setting: the engine process puts the target on the workers, and a
worker lost mid-answer ends in one plain banner naming it, the window and the answer kept."""

from __future__ import annotations


from live_window import GENERATE_MS, LOAD_MS, send, start_answer
from rpc_workers import Worker


def test_the_window_loads_the_target_on_rpc_workers_and_answers(qtbot, open_window, smollm_path, workers):
    endpoints = ",".join(w.endpoint for w in workers)
    w = open_window(smollm_path, load=False, mode="off", rpc=endpoints)
    assert w.generation_form.rpc.text() == endpoints
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()
    assert "RPC" in w.load_status.backend_label.text()
    assert send(qtbot, w, "Say hello.").content.strip()


def test_a_malformed_worker_address_is_one_message_before_loading(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, load=False, rpc="localhost")
    w.load_pair()
    assert "localhost" in w.chat.banner.text() and not w.loading


def test_a_worker_lost_mid_answer_is_named_and_reload_is_offered(qtbot, open_window, smollm_path, workers):
    doomed = Worker()
    try:
        w = open_window(smollm_path, load=False, mode="off", max_tokens=2000,
                        rpc=f"{workers[0].endpoint},{doomed.endpoint}")
        with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
            w.load_pair()
        with qtbot.waitSignal(w.engineDied, timeout=GENERATE_MS):
            start_answer(qtbot, w, "Write a very long story about a lighthouse keeper.")
            doomed.process.kill()
    finally:
        doomed.stop()
    assert w.isVisible()
    assert f"Lost the connection to the RPC worker at {doomed.name}" in w.chat.banner.text()
    assert w.chat.banner.action_labels() == ["Reload"]  # a safer profile would not bring a worker back
    answer = w.current.messages[-1]
    assert answer.role == "assistant" and answer.content.strip()
