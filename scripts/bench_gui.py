"""Generation speed in the window against a plain engine loop, and how long the UI thread is blocked.

For each mode, the same prompt runs alternately (the order turning each time) in a plain
``Decoder.generate`` loop and in the real window (engine process, per-frame batches, live
speculation view, stats, Markdown transcript), so both see the same machine load. Speed is tokens over the wall
time from the request to the last cycle; the prompt is already cached in both after the
warm-up, so the comparison is of decoding alone. On extra runs of its own (its
100 wake-ups a second would cost the speed runs), the UI thread runs a 10 ms timer; any
late tick is time the thread was blocked. "UI CPU" is the CPU time the
UI thread used over the same wall time: on a machine whose cores all run llama.cpp, that
share is roughly what the window costs in speed. "Window CPU" counts the whole window
process (its UI thread and the thread reading the engine process's pipe); on Linux the
share of each of its threads is listed too, by name (the bench's own plain-loop decoder
lives in this process: its llama.cpp threads show as "python" ones). "Load" is the
time from pressing Load to the window being ready, engine process start included.

    SPECULUM_MODELS_DIR=~/.cache/speculum-dev/models xvfb-run -a python scripts/bench_gui.py
    (add --model PATH, --modes off,lookup, --max-tokens N, --repeat N, --undrawn, --json)

Each mode's second line gives the ratio "at equal passes": the window's time outside llama.cpp's
passes against the plain loop's, with the window's own passes on both sides. Where other work
shares the machine, how fast the passes run moves the tok/s ratio by more than the window does;
this one shows what the window itself costs.

``--undrawn`` adds a third row: the same window with its live views idle (no frame is
drawn while the answer is written), which parts what the engine process costs from what
drawing costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PROMPTS = {
    "off": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "lookup": ("Copy this text exactly, twice:\nThe quick brown fox jumps over the lazy dog. Pack my box with "
               "five dozen liquor jugs. How vexingly quick daft zebras jump. Sphinx of black quartz, judge my vow."),
    "auto": ("Copy this text exactly, twice:\nThe quick brown fox jumps over the lazy dog. Pack my box with "
             "five dozen liquor jugs. How vexingly quick daft zebras jump. Sphinx of black quartz, judge my vow."),
}
TICK_MS = 10  # fine enough for a 50 ms limit; a faster heartbeat would itself cost the UI thread CPU


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of each thread of this process, by name (Linux; empty elsewhere)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        name = names.get(int(tid), comm)
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return out


@dataclass
class Run:
    cycles: list
    seconds: float  # from the request to the last cycle
    blocked_ms: float = 0.0  # the UI thread's longest block (window runs)
    ui_cpu_share: float = 0.0  # the UI thread's CPU time over the same wall time (window runs)
    process_cpu_share: float = 0.0  # the whole window process's CPU time, likewise
    first_s: float = 0.0  # from the request to the first cycle
    threads: dict | None = None  # window runs: each thread's CPU seconds over the run, by name

    @property
    def tokens(self) -> int:
        return sum(len(c.emitted) for c in self.cycles)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def verify_ms(self) -> float:
        return 1000 * sum(c.verify_s for c in self.cycles) / len(self.cycles)

    @property
    def outside_ms(self) -> float:
        return 1000 * self.seconds / len(self.cycles) - self.verify_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="target GGUF (default: SmolLM2-135M from the models folder)")
    parser.add_argument("--draft", help="draft GGUF (for --modes draft)")
    parser.add_argument("--modes", default="off,lookup,auto")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--undrawn", action="store_true",
                        help="also run the window with its live views idle while it answers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    scratch = tempfile.mkdtemp(prefix="speculum-bench-gui-")
    os.environ["SPECULUM_DATA_DIR"] = os.path.join(scratch, "data")
    os.environ["SPECULUM_CONFIG_DIR"] = os.path.join(scratch, "config")

    import shiboken6
    from PySide6.QtCore import QElapsedTimer, QEventLoop, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from speculum import paths
    from speculum.engine.prompts import build_messages
    from speculum.engine.loading import load_decoder
    from speculum.engine.settings import LoadOptions
    from speculum.ui.mainwindow import MainWindow
    from speculum.ui.settings import Settings

    model = args.model or str(paths.models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf")
    app = QApplication.instance() or QApplication(sys.argv[:1])

    # The UI thread's heartbeat: the largest gap between ticks (TICK_MS apart) is the longest block.
    class Heartbeat:
        def __init__(self):
            self.clock = QElapsedTimer()
            self.gaps: list[float] = []
            self.timer = QTimer()
            self.timer.setTimerType(Qt.PreciseTimer)
            self.timer.setInterval(TICK_MS)
            self.timer.timeout.connect(self.tick)
            self.recording = False

        def tick(self):
            now = self.clock.nsecsElapsed() / 1e6
            if self.recording:
                self.gaps.append(now - self.last)
            self.last = now

        def start(self):
            self.gaps.clear()
            self.clock.start()
            self.last = 0.0
            self.recording = True
            self.timer.start()

        def stop(self):
            self.recording = False
            self.timer.stop()
            return max(self.gaps, default=0.0) - TICK_MS

    beat = Heartbeat()
    settings = Settings(n_ctx=2048, max_tokens=args.max_tokens, k=4)
    window = MainWindow(settings=settings, autoload=False)
    window.show()
    window.set_pair(model, args.draft, load=False)
    # As a user would: the window has been open a moment (its engine process started) before Load.
    while not window.engine.started:
        app.processEvents()
        time.sleep(0.005)
    # As after the status bar's "Later" (for the session): between the window's answers its engine
    # process measures this machine for auto mode, at full speed on every core, exactly while this
    # bench's plain loop runs: plain passes ran up to 3x slower than the window's, and the tok/s
    # ratio went from 0.8 to 2.7 between two runs of the same code.
    window.engine.postpone_measuring(None)
    load_start = time.perf_counter()
    window.load_pair()
    while not window.loaded:
        if window.chat.banner.text():
            print(window.chat.banner.text(), file=sys.stderr)
            return 2
        app.processEvents()
        time.sleep(0.005)
    load_s = time.perf_counter() - load_start
    decoder = load_decoder(model, args.draft, LoadOptions(n_ctx=2048))

    # At each cycle, in the worker thread: the wall clock, the UI thread's CPU time so far, the cycle.
    ui_clock = time.pthread_getcpuclockid(threading.get_ident())
    seen: list[tuple[float, float, object]] = []
    window.engine.worker.cycleReady.connect(
        lambda e: seen.append((time.perf_counter(), time.clock_gettime(ui_clock), e.cycle)), Qt.DirectConnection)

    done: list[int] = []
    # Connected once: disconnecting a lambda makes PySide6 6.12 delete a shared receiver and crash at exit.
    waiting = QEventLoop()
    window.generationFinished.connect(lambda: (done.append(1), waiting.quit()))

    def in_window(mode: str, prompt: str, watch: bool = False, drawn: bool = True) -> Run:
        window.engine.batcher.blockSignals(not drawn)  # undrawn: no frame is handed to the widgets
        window.model_bar.mode_combo.setCurrentIndex(window.model_bar.mode_combo.findData(mode))
        window.new_conversation()
        seen.clear()
        done.clear()
        if watch:
            beat.start()
        start, ui_start, process_start = time.perf_counter(), time.clock_gettime(ui_clock), time.process_time()
        threads_start = thread_cpu()
        window.send(prompt)
        if not done:  # the real event loop, not a polling one: the UI thread idles as in the app
            waiting.exec()
        blocked = beat.stop() if watch else 0.0
        process_cpu = time.process_time() - process_start
        threads = {k: v - threads_start.get(k, 0.0) for k, v in thread_cpu().items()}
        answer = window.current.messages[-1]
        if answer.role != "assistant":
            raise SystemExit(f"the window did not answer: {window.chat.banner.text()}")
        end, ui_end, _ = seen[-1]
        return Run([c for *_, c in seen], end - start, blocked, (ui_end - ui_start) / (end - start),
                   process_cpu / (time.perf_counter() - start), seen[0][0] - start,
                   {k: v for k, v in threads.items() if v > 0})

    def plain_loop(mode: str, prompt: str) -> Run:
        policy = mode
        if mode == "auto":
            # Auto decides from what it has learnt: two policies learning apart soon choose apart
            # (one run drafted 13% more than the other), and the ratio measured their luck, not
            # the window. Each plain run starts from what the window's engine saved after its
            # last answer, the state the window's policy is in, and saves nothing itself.
            decoder.policies.pop("auto", None)
            policy = decoder.policy_for("auto")
            policy.store = None
        start = time.perf_counter()
        # The request is text on both sides: the engine process renders and tokenizes it too.
        tokens = decoder.target.tokenize(decoder.target.apply_chat_template(build_messages(prompt)))
        first = None
        cycles = []
        # k = 4 fixed on both sides (the window setting k=4 means exactly 4): same work, window cost alone
        for cycle in decoder.generate(tokens, max_tokens=args.max_tokens, policy=policy, k=4,
                                      want_probs=True):
            first = first or time.perf_counter()
            cycles.append(cycle)
        return Run(cycles, time.perf_counter() - start, first_s=first - start)

    results = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        prompt = PROMPTS.get(mode, PROMPTS["off"])
        plain_loop(mode, prompt)  # warm-up: caches the prompt, settles the policy's measurements
        in_window(mode, prompt)
        plain, windowed, undrawn = [], [], []
        rows = [(plain, plain_loop), (windowed, in_window)]
        if args.undrawn:
            rows.append((undrawn, lambda m, p: in_window(m, p, drawn=False)))
        for i in range(args.repeat):
            # The order turns, so that whatever favours a place in it falls on every row alike.
            turn = i % len(rows)
            for runs, run in rows[turn:] + rows[:turn]:
                runs.append(run(mode, prompt))
        # The heartbeat wakes the UI thread 100 times a second: instrumentation the app does not
        # have, so it runs on runs of its own, which give the block figures and not the speed.
        watched = [in_window(mode, prompt, watch=True) for _ in range(max(2, args.repeat // 2))]
        med = lambda runs, field: statistics.median(getattr(r, field) for r in runs)  # noqa: E731
        ratios = [w.tokens_per_s / p.tokens_per_s for p, w in zip(plain, windowed)]
        wall = sum(w.seconds for w in windowed)
        by_thread: dict[str, float] = {}
        for w in windowed:
            for name, cpu in (w.threads or {}).items():
                by_thread[name] = by_thread.get(name, 0.0) + cpu / wall
        results.append({
            "mode": mode, "tokens": windowed[-1].tokens,
            "plain_tokens_per_s": round(med(plain, "tokens_per_s"), 2),
            "window_tokens_per_s": round(med(windowed, "tokens_per_s"), 2),
            "ratio_median": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
            **({"undrawn_ratio_median": round(statistics.median(
                u.tokens_per_s / p.tokens_per_s for p, u in zip(plain, undrawn)), 3),
                "undrawn_verify_ms_per_cycle": round(med(undrawn, "verify_ms"), 2),
                "undrawn_ui_cpu_share": round(med(undrawn, "ui_cpu_share"), 4)} if undrawn else {}),
            "ui_blocked_max_ms": round(max(w.blocked_ms for w in watched), 1),
            "ui_blocked_per_run_ms": [round(w.blocked_ms, 1) for w in watched],
            "ui_cpu_share": round(med(windowed, "ui_cpu_share"), 4),
            "window_process_cpu_share": round(med(windowed, "process_cpu_share"), 4),
            "window_thread_cpu_share": {name: round(share, 4) for name, share in
                                        sorted(by_thread.items(), key=lambda kv: -kv[1])},
            # Where a cycle's time went: the target's pass, and everything outside llama.cpp.
            "verify_ms_per_cycle": {"plain": round(med(plain, "verify_ms"), 2),
                                    "window": round(med(windowed, "verify_ms"), 2)},
            "outside_ms_per_cycle": {"plain": round(med(plain, "outside_ms"), 2),
                                     "window": round(med(windowed, "outside_ms"), 2)},
            # The window's ratio had the passes run as fast in it as in the plain loop: what the window
            # itself costs (its time outside the passes), apart from how busy llama.cpp's cores were.
            # On a shared machine the passes alone swing the tok/s ratio by tens of percent either way.
            "ratio_at_equal_passes": round(
                (med(windowed, "verify_ms") + med(plain, "outside_ms"))
                / (med(windowed, "verify_ms") + med(windowed, "outside_ms")), 3),
            "frame_ms": window.engine.batcher.interval_ms,
            "first_cycle_ms": {"plain": [round(1000 * p.first_s, 1) for p in plain],
                               "window": [round(1000 * w.first_s, 1) for w in windowed]},
        })
    window.close()
    decoder.target.close()
    shiboken6.delete(window)  # before the QApplication, which is a local of this function too
    if args.json:
        print(json.dumps({"model": Path(model).name, "platform": app.platformName(), "load_s": round(load_s, 3),
                          "results": results}, indent=1))
    else:
        print(f"model {Path(model).name}, Qt platform {app.platformName()}, {args.repeat} runs per mode, "
              f"{args.max_tokens} max tokens; Load to ready {load_s:.2f} s")
        print(f"{'mode':<8} {'plain tok/s':>11} {'window tok/s':>12} {'ratio':>6}  {'UI blocked max':>14} "
              f"{'UI CPU':>7} {'win CPU':>7} {'frame':>6}  {'verify ms/cycle':>15}  {'outside ms/cycle':>16}  ratios")
        for r in results:
            v, o = r["verify_ms_per_cycle"], r["outside_ms_per_cycle"]
            print(f"{r['mode']:<8} {r['plain_tokens_per_s']:>11.1f} {r['window_tokens_per_s']:>12.1f} "
                  f"{r['ratio_median']:>6.3f}  {r['ui_blocked_max_ms']:>11.1f} ms {100 * r['ui_cpu_share']:>6.1f}% "
                  f"{100 * r['window_process_cpu_share']:>6.1f}% "
                  f"{r['frame_ms']:>4} ms  {v['plain']:>6.2f} → {v['window']:<6.2f}  {o['plain']:>7.2f} → {o['window']:<6.2f}"
                  f"  {r['ratios']}")
            shares = ", ".join(f"{name} {100 * share:.1f}%" for name, share in r["window_thread_cpu_share"].items()
                               if share >= 0.001)
            print(f"{'':<8} window threads: {shares}")
            first = r["first_cycle_ms"]
            print(f"{'':<8} at equal passes: ratio {r['ratio_at_equal_passes']:.3f}; first cycle after "
                  f"{statistics.median(first['plain']):.0f} ms (plain) → {statistics.median(first['window']):.0f} ms "
                  f"(window)")
            if "undrawn_ratio_median" in r:
                print(f"{'':<8} undrawn window: ratio {r['undrawn_ratio_median']:.3f}, verify ms/cycle "
                      f"{r['undrawn_verify_ms_per_cycle']:.2f}, UI CPU {100 * r['undrawn_ui_cpu_share']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
