"""The engine in its own process: a native crash there leaves the window, the conversation
and the answer so far, and Reload brings the engine back.

Crashes are real segmentation faults, injected into the engine process alone through its
test-only switch (``engine_process.CRASH_SWITCH``) at named points.
"""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from speculum import paths, yielding
from speculum.engine.llama import profiles
from speculum.engine.settings import LoadOptions
from speculum.engine_process import CRASH_SWITCH, MID_GENERATION_CYCLE, EngineProcess, describe_exit
from speculum.protocol import (Batch, CycleEvent, Failed, Finished, Generate, Load, Loaded, LoadFailed,
                               LoadRequest, Measuring, ProfileChosen, Ready, SetPlainRate, StageChanged)
from speculum.ui.worker import FRAME_MS, CycleBatcher

from live_window import GENERATE_MS, LOAD_MS, send, start_answer

SEGV = "SIGSEGV"


def test_exit_codes_are_named_in_words():
    assert describe_exit(-signal.SIGSEGV) == "signal SIGSEGV (Segmentation fault)"
    assert describe_exit(-signal.SIGKILL).startswith("signal SIGKILL")
    assert describe_exit(0xC0000005) == "access violation (exit code 0xC0000005)"
    assert describe_exit(3) == "exit code 3"


def test_a_crash_in_the_engine_process_is_reported_with_its_signal(smollm_path, monkeypatch, data_dirs):
    monkeypatch.setenv(CRASH_SWITCH, "load")
    events, exits, done = [], [], threading.Event()

    def on_exit(code):
        exits.append(code)
        done.set()

    engine = EngineProcess(events.append, on_exit)
    engine.send(Load(LoadRequest(str(smollm_path), options=LoadOptions(n_ctx=512))))
    assert done.wait(120), "the engine process should have crashed during the load"
    assert exits == [-signal.SIGSEGV]
    kinds = [type(e) for e in events]
    assert kinds[0] is Ready and ProfileChosen in kinds and Loaded not in kinds
    assert os.getpid() != engine.pid  # this test process is still here to say so


def _engine_settings() -> dict:
    """The CPU settings the engine process reports as in effect when it starts."""
    ready = threading.Event()
    seen = []
    engine = EngineProcess(lambda event: (seen.append(event), ready.set()), lambda code: None)
    try:
        assert ready.wait(60)
    finally:
        engine.end()
    assert isinstance(seen[0], Ready)
    return seen[0].cpu_settings


def test_the_engine_process_waits_for_threads_as_speculum_sets_it_before_llama_cpp_loads(data_dirs, monkeypatch):
    from speculum.engine.llama import cpu_settings

    for name in (*cpu_settings.USER_SETTINGS, cpu_settings.TILED_MATMUL, cpu_settings.TILED_MIN_ROWS):
        monkeypatch.delenv(name, raising=False)  # this test process applied them to itself
    setting = _engine_settings()
    assert setting["GOMP_SPINCOUNT"] == str(cpu_settings.SPIN_COUNT) and setting["source"] == "Speculum"
    # llama.cpp here runs on libgomp: its count for more threads than cores (the server's and the
    # window's serving threads) follows GOMP_SPINCOUNT only under the active policy
    assert cpu_settings.llama_cpp_uses_libgomp() is True
    assert setting["OMP_WAIT_POLICY"] == "active"
    assert setting["set_before_libgomp_loaded"] is True
    assert setting["libgomp_loaded"] is True  # llama.cpp's OpenMP runtime, which reads it, is loaded
    # ggml's tiled matmul in verification passes as this CPU runs them faster: with AVX-512, else
    # not; in prompt chunks either way (this build, the README's, says from how many rows)
    pays = cpu_settings.tiled_matmul_pays(cpu_settings.cpu_flags())
    assert cpu_settings.tiled_in_passes(setting) is pays and setting["tiled_source"] == "Speculum"
    assert cpu_settings.build_has_tiled_rows() and cpu_settings.tiled_matmul_on(setting)
    if not pays:
        assert setting[cpu_settings.TILED_MIN_ROWS] == str(cpu_settings.PROMPT_CHUNK_ROWS)


def test_the_tiled_matmul_is_on_only_where_the_cpu_has_avx512(tmp_path, monkeypatch):
    from speculum.engine.llama import cpu_settings

    def flags(line):
        cpuinfo = tmp_path / "cpuinfo"
        cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\n{line}\n\nprocessor\t: 1\n")
        return cpu_settings._linux_flags(cpuinfo)

    pays = cpu_settings.tiled_matmul_pays
    assert pays(flags("flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512vl"))
    assert not pays(flags("flags\t\t: fpu sse2 avx avx2 fma avx_vnni"))  # most laptops
    assert not pays(flags("Features\t: fp asimd"))  # ARM: no tiled path
    assert not pays(cpu_settings._linux_flags(tmp_path / "absent"))  # unreadable: off, as before
    # macOS: sysctl's names (an Intel Mac with AVX-512; Apple silicon prints none)
    assert pays(cpu_settings._darwin_flags(lambda: "FPU SSE4.2 AVX1.0\nBMI1 AVX2 AVX512F AVX512CD\n"))
    assert not pays(cpu_settings._darwin_flags(lambda: "FPU SSE4.2 AVX1.0\nBMI1 AVX2\n"))
    assert not pays(cpu_settings._darwin_flags(lambda: ""))
    # Windows: the one feature asked for
    assert pays(cpu_settings._windows_flags(lambda feature: feature == cpu_settings.PF_AVX512F_INSTRUCTIONS_AVAILABLE))
    assert not pays(cpu_settings._windows_flags(lambda feature: 0))
    # apply() sets it by the CPU when the user did not: in passes with AVX-512, else in prompt
    # chunks only, or not at all with a build that cannot say from how many rows
    for avx512, rows in ((True, True), (False, True), (False, False)):
        monkeypatch.setattr(cpu_settings, "_in_effect", {})
        monkeypatch.setattr(cpu_settings, "cpu_flags", lambda: {"avx2", "avx512f"} if avx512 else {"avx2"})
        monkeypatch.setattr(cpu_settings, "build_has_tiled_rows", lambda: rows)
        environ: dict = {}
        setting = cpu_settings.apply(environ)
        assert cpu_settings.tiled_in_passes(setting) is cpu_settings.tiled_in_passes(environ) is avx512
        assert cpu_settings.tiled_matmul_on(setting) is (avx512 or rows)
        assert environ.get(cpu_settings.TILED_MIN_ROWS) == (None if avx512 or not rows else "65")


@pytest.mark.parametrize("needed, expected", [(b"libgomp.so.1", "active"), (b"libomp.so", "")])
def test_the_active_wait_policy_is_set_only_for_libgomp(tmp_path, monkeypatch, needed, expected):
    # LLVM's and Intel's OpenMP read `active` as spin forever: the collapse under load again
    from importlib.machinery import ModuleSpec

    from speculum.engine.llama import cpu_settings

    package = tmp_path / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "lib" / "libggml-cpu.so").write_bytes(b"\x7fELF" + needed + b"\0")
    spec = ModuleSpec("llama_cpp", None, origin=str(package / "__init__.py"))
    monkeypatch.setattr(cpu_settings.importlib.util, "find_spec", lambda name: spec)
    monkeypatch.setattr(cpu_settings, "_in_effect", {})
    environ: dict = {}
    setting = cpu_settings.apply(environ)
    assert environ.get("OMP_WAIT_POLICY", "") == expected == setting["OMP_WAIT_POLICY"]
    assert environ["GOMP_SPINCOUNT"] == str(cpu_settings.SPIN_COUNT)


def test_a_users_own_tiled_matmul_setting_is_kept(data_dirs, monkeypatch):
    from speculum.engine.llama import cpu_settings

    monkeypatch.setenv(cpu_settings.TILED_MATMUL, "1")
    setting = _engine_settings()
    assert setting[cpu_settings.TILED_MATMUL] == "1" and setting["tiled_source"] == "the user's environment"
    assert cpu_settings.tiled_matmul_on(setting)


def test_the_tiled_matmul_switch_reads_as_ggml_reads_it():
    from speculum.engine.llama.cpu_settings import TILED_MATMUL, tiled_matmul_on

    assert tiled_matmul_on({})  # unset: ggml's default is on
    for value, on in (("0", False), ("1", True), ("00", False), (" 2", True), ("off", False), ("", False)):
        assert tiled_matmul_on({TILED_MATMUL: value}) is on, value
    from speculum.engine.llama.cpu_settings import TILED_MIN_ROWS, tiled_in_passes

    # Speculum's build: from how many rows (ggml's own 8 when unset or not a positive number)
    for rows, in_passes in ((None, True), ("65", False), ("64", True), ("8", True), ("0", True), ("x", True)):
        assert tiled_in_passes({TILED_MATMUL: "1", TILED_MIN_ROWS: rows}) is in_passes, rows
    assert not tiled_in_passes({TILED_MATMUL: "0"})


def test_the_row_switch_reads_as_ggml_reads_it_and_only_q4_k_on_x86_keeps_repacked_weights():
    from speculum.engine.llama.cpu_settings import ROW_INVARIANT, keeps_repacked_weights, rows_invariant_asked

    assert not rows_invariant_asked({})
    for value, on in (("0", False), ("1", True), ("00", False), ("2", True), ("x", False), ("", False),
                      (" 1", False), ("sgemm-one,gemv-sb", True), ("tiled", True)):
        assert rows_invariant_asked({ROW_INVARIANT: value}) is on, value
    # Q4_K's repacked gemv rounds as its gemm does under the switch (x86 only): the rest go plain
    assert keeps_repacked_weights("Q4_K_M", "x86_64") and keeps_repacked_weights("Q4_K_S", "AMD64")
    assert not keeps_repacked_weights("Q4_0", "x86_64") and not keeps_repacked_weights("IQ4_NL", "x86_64")
    assert not keeps_repacked_weights("Q4_K_M", "arm64") and not keeps_repacked_weights("unknown", "x86_64")


def test_after_loading_the_engine_measures_costs_while_idle_and_gives_way_to_a_request(smollm_path, data_dirs):
    from speculum.protocol import GenerationRequest

    events, finished = [], threading.Event()

    def on_event(event):
        events.append(event)
        if isinstance(event, (Finished, Failed)):
            finished.set()

    engine = EngineProcess(on_event, lambda code: None)
    try:
        engine.send(Load(LoadRequest(str(smollm_path), options=LoadOptions(n_ctx=512))))
        # Sent at once: the idle calibration must give way to it, not run first to the end.
        engine.send(Generate(GenerationRequest("c", [{"role": "user", "content": "Hi."}], max_tokens=4)))
        assert finished.wait(120)
        reports = [e for e in events if not isinstance(e, Measuring)]  # the idle measurement goes on after it
        assert isinstance(reports[-1], Finished), reports[-1]
        # Loaded again with the window idle: the measured curve is saved for this pair.
        finished.clear()
        engine.send(Load(LoadRequest(str(smollm_path), options=LoadOptions(n_ctx=512))))
        stores = paths.data_dir() / "policy"
        for _ in range(600):
            saved = [json.loads(f.read_text()) for f in stores.glob("*.json")] if stores.is_dir() else []
            if saved and len(saved[0]["costs"]["verify_s"]) >= 6:
                break
            threading.Event().wait(0.2)
        assert saved and len(saved[0]["costs"]["verify_s"]) >= 6, saved
    finally:
        engine.end()


def test_fast_cycles_share_pipe_messages_and_arrive_in_order(smollm_path, data_dirs):
    from speculum.protocol import GenerationRequest

    events, finished = [], threading.Event()

    def on_event(event):
        events.append(event)
        if isinstance(event, (Finished, Failed, LoadFailed)):
            finished.set()

    engine = EngineProcess(on_event, lambda code: finished.set())
    try:
        engine.send(Load(LoadRequest(str(smollm_path), options=LoadOptions(n_ctx=512))))
        engine.send(Generate(GenerationRequest("c1", [{"role": "user", "content": "Count from one to thirty."}],
                                               mode="off", max_tokens=64)))
        assert finished.wait(300)
        before = engine.messages
    finally:
        engine.end()
    cycles = [e.cycle for e in events if isinstance(e, CycleEvent)]
    reports = [e for e in events if not isinstance(e, Measuring)]  # the idle measurement goes on after it
    assert isinstance(reports[-1], Finished) and [c.index for c in cycles] == list(range(len(cycles)))
    assert cycles[-1].finish  # the last one arrives too, before "finished"
    assert before <= len(events)


def test_cycles_closer_than_the_batch_interval_travel_together():
    from types import SimpleNamespace as NS

    from speculum.engine_process import CYCLE_BATCH_S, Outbox

    now, sent = [0.0], []
    box = Outbox(sent.append, clock=lambda: now[0])
    cycle = lambda i, finish=None: CycleEvent(NS(index=i, finish=finish), None)  # noqa: E731
    box.report(Loaded("facts", None))
    now[0] += CYCLE_BATCH_S / 4
    box.report(cycle(0))  # an answer's first cycle goes at once
    for i in range(1, 5):  # fast cycles wait until one comes a batch interval after the last message
        now[0] += CYCLE_BATCH_S / 4
        box.report(cycle(i))
    now[0] += 10 * CYCLE_BATCH_S  # a slow cycle goes at once
    box.report(cycle(5))
    now[0] += CYCLE_BATCH_S / 4
    box.report(cycle(6))  # held ...
    box.report(StageChanged("Part 2"))  # ... and sent ahead of any other report, in order
    now[0] += CYCLE_BATCH_S / 4
    box.report(cycle(7, finish="eog"))  # the last cycle never waits
    flat = [e for m in sent for e in (m.events if isinstance(m, Batch) else [m])]
    assert [type(e) for e in flat] == [Loaded] + [CycleEvent] * 7 + [StageChanged, CycleEvent]
    assert [e.cycle.index for e in flat if isinstance(e, CycleEvent)] == list(range(8))
    # loaded; cycle 0; cycles 1-4 once an interval has passed; slow cycle 5; cycle 6 with the
    # stage; the last
    assert [type(m) for m in sent] == [Loaded, CycleEvent, Batch, CycleEvent, Batch, CycleEvent]
    assert [e.cycle.index for e in sent[2].events] == [1, 2, 3, 4]


def _crash_window(open_window, monkeypatch, smollm_path, point, **settings):
    monkeypatch.setenv(CRASH_SWITCH, point)
    return open_window(smollm_path, load=False, mode="off", max_tokens=32, **settings)


def test_crash_mid_generation_keeps_the_partial_answer_and_reload_answers_again(
        qtbot, open_window, monkeypatch, smollm_path):
    w = _crash_window(open_window, monkeypatch, smollm_path, "mid_generation")
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()
    old_pid = w.engine.pid
    with qtbot.waitSignal(w.engineDied, timeout=GENERATE_MS):
        w.send("Count from one to twenty in words.")
    assert w.isVisible()
    assert SEGV in w.chat.banner.text() and "generating an answer" in w.chat.banner.text()
    assert w.chat.banner.action_labels() == ["Reload"]  # not a load problem: no safer profile offered
    assert not w.generating and not w.loaded and w.chat.send_button.isEnabled()
    # The conversation file holds the question and the answer up to the last cycle received.
    saved = json.loads((paths.data_dir() / "conversations" / f"{w.current.id}.json").read_text())
    question, answer = saved["messages"][-2:]
    assert question["role"] == "user" and "Count from one" in question["content"]
    assert answer["role"] == "assistant" and answer["content"].strip() and SEGV in answer["note"]
    assert 1 <= len(answer["cycles"]) <= MID_GENERATION_CYCLE
    assert answer["content"] == "".join(c["text"] for c in answer["cycles"])

    monkeypatch.delenv(CRASH_SWITCH)
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.chat.banner.trigger("Reload")
    assert w.engine.pid != old_pid
    answer = send(qtbot, w, "Say hello.")
    assert answer.role == "assistant" and answer.content.strip() and answer.finish != "stopped"


def test_crash_during_load_offers_the_safe_profile_which_is_then_remembered(
        qtbot, open_window, monkeypatch, smollm_path):
    w = _crash_window(open_window, monkeypatch, smollm_path, "load")
    with qtbot.waitSignal(w.engineDied, timeout=LOAD_MS):
        w.load_pair()
    assert SEGV in w.chat.banner.text() and "loading the models" in w.chat.banner.text()
    assert w.load_status.model_label.text().startswith("No model loaded") and w.load_status.load_progress.isHidden()
    assert w.chat.banner.action_labels() == ["Reload with the safe profile", "Reload"]

    monkeypatch.delenv(CRASH_SWITCH)
    profiles_seen = []
    w.engine.worker.profileChosen.connect(lambda name, why: profiles_seen.append((name, why)))
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.chat.banner.trigger("Reload with the safe profile")
    assert profiles_seen[-1][0] == "safe"
    send(qtbot, w, "Say hello.")
    # Loaded and decoded with the safe profile: this machine remembers it, the CLI reads it too.
    profile, why = profiles.remembered()
    assert profile.name == "safe" and SEGV in why and "loading the models" in why

    w2 = open_window(smollm_path, load=False)
    seen2 = []
    w2.engine.worker.profileChosen.connect(lambda name, why: seen2.append(name))
    with qtbot.waitSignal(w2.modelsLoaded, timeout=LOAD_MS):
        w2.load_pair()
    assert seen2 == ["safe"]
    assert w2.load_status.backend_label.text().endswith("· safe profile")
    assert "remembered because" in w2.load_status.backend_label.toolTip()


def test_crash_at_the_first_decode_offers_the_safe_profile(qtbot, open_window, monkeypatch, smollm_path):
    w = _crash_window(open_window, monkeypatch, smollm_path, "first_decode")
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()
    with qtbot.waitSignal(w.engineDied, timeout=GENERATE_MS):
        w.send("Say hello.")
    assert SEGV in w.chat.banner.text()
    assert w.chat.banner.action_labels()[0] == "Reload with the safe profile"
    assert "at the first decode" in w.chat.banner.text()
    # Nothing was decoded: the question is kept, and no empty answer (the banner says why).
    assert w.current.messages[-1].content == "Say hello." and w.current.messages[-1].role == "user"
    monkeypatch.delenv(CRASH_SWITCH)
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.chat.banner.trigger("Reload")
    assert send(qtbot, w, "Say hello.").content.strip()


def test_stop_reaches_the_engine_process_within_a_pass(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="off", max_tokens=400)
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS):
        start_answer(qtbot, w, "Write a long story about a lighthouse keeper.")
        w.stop()
    answer = w.current.messages[-1]
    assert answer.finish == "stopped"
    assert len(answer.cycles) < 200  # far short of max_tokens: it stopped, it did not run out


def _thread_policies(pid: int) -> set[int]:
    return {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def test_while_llama_cpp_fills_every_core_the_window_waits_for_one_and_the_engine_never_does(
        qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="off", max_tokens=400)
    cores_full = w.engine.cores_full  # the target decodes on the CPU, a thread on every core
    with qtbot.waitSignal(w.generationFinished, timeout=GENERATE_MS):
        start_answer(qtbot, w, "Write a long story about a lighthouse keeper.")
        giving_way = w.engine.giving_way
        if yielding.supported():
            window_policies, engine_policies = _thread_policies(os.getpid()), _thread_policies(w.engine.pid)
        w.stop()
    assert giving_way == (cores_full and yielding.supported())
    # Frames as far apart as still reads as live where each one is decoding lost.
    assert w.engine.batcher.frame_ms == (CycleBatcher.MAX_FRAME_MS if cores_full else FRAME_MS)
    assert not w.engine.giving_way
    if yielding.supported():
        # Every thread of the window (UI, pipe reader, Qt's own) waited; none of the engine's did.
        assert window_policies == {os.SCHED_BATCH if cores_full else os.SCHED_OTHER}
        assert engine_policies == {os.SCHED_OTHER}
        assert _thread_policies(os.getpid()) == {os.SCHED_OTHER}  # and the window is back once it ends


def test_loading_other_models_ends_the_old_engine_process(qtbot, open_window, smollm_path):
    w = open_window(smollm_path)
    first = w.engine._process.process
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()
    assert w.engine.pid != first.pid
    assert not first.is_alive() and first.exitcode == 0  # it quit when asked, and its memory went with it
    w.close()
    assert not w.engine.is_alive()


def test_the_window_process_never_loads_llama_cpp(smollm_path, tmp_path):
    """A native crash must end the engine process only: the window's own process holds no llama.cpp."""
    import subprocess
    import sys

    script = f'''
import os, sys, time
from PySide6.QtWidgets import QApplication
from speculum.ui.mainwindow import MainWindow
from speculum.ui.settings import Settings

if __name__ == "__main__":
    app = QApplication([])
    w = MainWindow(settings=Settings(n_ctx=512), autoload=False)
    w.set_pair({str(smollm_path)!r}, None, load=False)
    w.load_pair()
    end = time.time() + 120
    while not w.loaded and not w.chat.banner.text() and time.time() < end:
        app.processEvents(); time.sleep(0.01)
    print(w.loaded, "llama_cpp" in sys.modules)
    w.close()
'''
    path = tmp_path / "window.py"
    path.write_text(script)
    env = {**os.environ, "SPECULUM_DATA_DIR": str(tmp_path / "data"), "SPECULUM_CONFIG_DIR": str(tmp_path / "config"),
           "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env)
    assert out.stdout.split() == ["True", "False"], out.stderr


def test_tuning_decides_by_the_passes_the_tiled_path_changes():
    from speculum.engine.llama import tuning

    def passes(on8, on16, off8, off16):
        return {"1": {"1": 0.03, "8": on8, "16": on16}, "0": {"1": 0.03, "8": off8, "16": off16}}

    assert tuning.decide(passes(0.13, 0.15, 0.13, 0.19)) == "1"  # 16 tokens far cheaper with it
    assert tuning.decide(passes(0.20, 0.22, 0.14, 0.16)) == "0"  # an AVX2 machine's story
    assert tuning.decide(passes(0.13, 0.16, 0.13, 0.165)) is None  # within 5%: no difference


def test_a_target_more_than_twice_the_size_measures_the_tiled_matmul_again(data_dirs, monkeypatch):
    import time

    from speculum.engine.llama import cpu_settings, tuning

    assert tuning.needs_measuring(None, 10)
    small = {"tiled": "0", "model": "small.gguf", "model_bytes": 100}
    assert not tuning.needs_measuring(small, 150) and not tuning.needs_measuring(small, 200)
    assert tuning.needs_measuring(small, 201)
    assert tuning.needs_measuring({"tiled": "1", "model": "old.gguf"}, 1)  # kept before sizes were
    # One as large measured already: no child started (one takes seconds to start).
    monkeypatch.delenv(tuning.OFF_SWITCH, raising=False)
    model = data_dirs / "same-size.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 64)
    cpu_settings.remember({**small, "model_bytes": model.stat().st_size})
    start = time.monotonic()
    assert tuning.measure_and_remember(model, 2, lambda: False) is None
    assert time.monotonic() - start < 0.2 and cpu_settings.remembered()["model"] == "small.gguf"


def test_idle_after_a_load_the_engine_measures_the_tiled_matmul_and_the_next_engine_uses_it(
        smollm_path, data_dirs, monkeypatch):
    from speculum.engine.llama import cpu_settings, tuning

    monkeypatch.delenv(tuning.OFF_SWITCH, raising=False)
    # (this process may have loaded llama.cpp, which set it here: not the user's setting)
    monkeypatch.delenv(cpu_settings.TILED_MATMUL, raising=False)
    engine = EngineProcess(lambda event: None, lambda code: None)
    file = paths.data_dir() / cpu_settings.TUNING_FILE
    try:
        engine.send(Load(LoadRequest(str(smollm_path), options=LoadOptions(n_ctx=512))))
        # The window's next command (its plain rate) comes at once: idle work stops for it, then
        # goes on (it once ran only right after a load, so this command ended it for good).
        engine.send(SetPlainRate(30.0))
        for _ in range(900):  # children time both settings, twice each, after the idle calibration
            if file.is_file():
                break
            threading.Event().wait(0.2)
    finally:
        engine.end()
    entry = cpu_settings.remembered()
    assert entry is not None and entry["model"] == smollm_path.name, file.read_text() if file.is_file() else None
    assert entry["model_bytes"] == smollm_path.stat().st_size
    assert entry["tiled"] in ("1", "0") and set(entry["passes"]) == {"1", "0"}
    assert all(0 < entry["passes"][s]["1"] < entry["passes"][s]["16"] for s in ("1", "0"))
    # The next engine starts with what was measured, and says so
    setting = _engine_settings()
    assert cpu_settings.tiled_in_passes(setting) is (entry["tiled"] == "1")
    assert setting["tiled_source"] == "a measurement on this machine"
    # ... unless the user set it
    other = "0" if entry["tiled"] == "1" else "1"
    monkeypatch.setenv(cpu_settings.TILED_MATMUL, other)
    setting = _engine_settings()
    assert setting[cpu_settings.TILED_MATMUL] == other and setting["tiled_source"] == "the user's environment"
    # A damaged file is set aside: the CPU's rule again, and measured anew next time
    monkeypatch.delenv(cpu_settings.TILED_MATMUL)
    file.write_text("{ not json")
    setting = _engine_settings()
    assert setting["tiled_source"] == "Speculum" and not file.exists()


def test_a_request_stops_the_tuning_children_at_once(smollm_path, data_dirs):
    import time

    from speculum.engine.llama import cpu_settings, tuning

    start = time.monotonic()
    assert tuning.measure(smollm_path, 2, lambda: time.monotonic() - start > 0.5) is None
    assert time.monotonic() - start < 5  # the child was killed, not waited for
    assert cpu_settings.remembered() is None


def test_speculum_tune_measures_now_and_the_doctor_names_the_measurement(smollm_path, data_dirs, monkeypatch):
    import subprocess
    import sys

    from speculum.engine.llama import cpu_settings

    monkeypatch.delenv(cpu_settings.TILED_MATMUL, raising=False)
    proc = subprocess.run([sys.executable, "-m", "speculum.cli", "tune", "--target", str(smollm_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(proc.stdout)
    assert entry == cpu_settings.remembered() and entry["tiled"] in ("1", "0")
    setting = " ".join(f"{k}={v}" for k, v in cpu_settings.tiled_environment(entry["tiled"]).items())
    assert f"{setting} from the next start" in proc.stderr
    doctor = subprocess.run([sys.executable, "-m", "speculum.cli", "doctor"], capture_output=True, text=True, timeout=120)
    row = doctor.stdout.split("Tiled matmul")[1].splitlines()[0]
    assert "set by a measurement on this machine" in row and smollm_path.name in row, row
    # a model that cannot be timed: one sentence, exit 2
    bad = data_dirs / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    proc = subprocess.run([sys.executable, "-m", "speculum.cli", "tune", "--target", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("speculum: The measurement failed")


def test_a_model_whose_timing_fails_is_not_measured_again_at_every_idle_moment(data_dirs, monkeypatch):
    import time

    from speculum.engine.llama import cpu_settings, tuning

    monkeypatch.delenv(tuning.OFF_SWITCH, raising=False)
    bad = data_dirs / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    assert tuning.measure_and_remember(bad, 2, lambda: False) is None and cpu_settings.remembered() is None
    start = time.monotonic()
    assert tuning.measure_and_remember(bad, 2, lambda: False) is None
    assert time.monotonic() - start < 0.2  # no child started this time
