"""Generation speed in the window against a plain engine loop, and how long the UI thread is blocked.

For each mode, the same prompt runs alternately in a plain ``Decoder.generate`` loop and
in the real window (worker thread, per-frame batches, live speculation view, stats,
Markdown transcript), so both see the same machine load. Speed is tokens over the wall
time from the request to the last cycle; the prompt is already cached in both after the
warm-up, so the comparison is of decoding alone. The UI thread runs a 5 ms timer
throughout; any late tick is time the thread was blocked.

    SPECULUM_MODELS_DIR=~/.cache/speculum-dev/models xvfb-run -a python scripts/bench_gui.py
    (add --model PATH, --modes off,lookup, --max-tokens N, --repeat N, --json)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = {
    "off": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "lookup": ("Copy this text exactly, twice:\nThe quick brown fox jumps over the lazy dog. Pack my box with "
               "five dozen liquor jugs. How vexingly quick daft zebras jump. Sphinx of black quartz, judge my vow."),
    "auto": ("Copy this text exactly, twice:\nThe quick brown fox jumps over the lazy dog. Pack my box with "
             "five dozen liquor jugs. How vexingly quick daft zebras jump. Sphinx of black quartz, judge my vow."),
}
TICK_MS = 5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="target GGUF (default: SmolLM2-135M from the models folder)")
    parser.add_argument("--draft", help="draft GGUF (for --modes draft)")
    parser.add_argument("--modes", default="off,lookup")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    scratch = tempfile.mkdtemp(prefix="speculum-bench-gui-")
    os.environ["SPECULUM_DATA_DIR"] = os.path.join(scratch, "data")
    os.environ["SPECULUM_CONFIG_DIR"] = os.path.join(scratch, "config")

    import shiboken6
    from PySide6.QtCore import QElapsedTimer, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from speculum import paths
    from speculum.engine.prompts import build_messages
    from speculum.engine.session import LoadOptions, load_decoder
    from speculum.ui.mainwindow import MainWindow
    from speculum.ui.settings import Settings

    model = args.model or str(paths.models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf")
    app = QApplication.instance() or QApplication(sys.argv[:1])

    # The UI thread's heartbeat: the largest gap between 5 ms ticks is the longest block.
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
    window.load_pair()
    while not window.loaded:
        if window.banner.text():
            print(window.banner.text(), file=sys.stderr)
            return 2
        app.processEvents()
        time.sleep(0.005)
    decoder = load_decoder(model, args.draft, LoadOptions(n_ctx=2048))

    cycle_times: list[float] = []
    window.engine.worker.cycleReady.connect(lambda _e: cycle_times.append(time.perf_counter()),
                                            Qt.DirectConnection)

    done: list[int] = []
    # Connected once: disconnecting a lambda makes PySide6 6.12 delete a shared receiver and crash at exit.
    window.generationFinished.connect(lambda: done.append(1))

    def in_window(mode: str, prompt: str) -> tuple[float, int, float]:
        window.mode_combo.setCurrentIndex(window.mode_combo.findData(mode))
        window.new_conversation()
        cycle_times.clear()
        done.clear()
        beat.start()
        start = time.perf_counter()
        window.send(prompt)
        while not done:
            app.processEvents()
            time.sleep(0.001)
        blocked = beat.stop()
        answer = window.current.messages[-1]
        if answer.role != "assistant":
            raise SystemExit(f"the window did not answer: {window.banner.text()}")
        return answer.stats["tokens"] / (cycle_times[-1] - start), answer.stats["tokens"], blocked

    def plain_loop(mode: str, prompt: str) -> tuple[float, int]:
        tokens = decoder.target.tokenize(decoder.target.apply_chat_template(build_messages(prompt)))
        start = time.perf_counter()
        n = 0
        # k = 4 fixed on both sides (the window setting k=4 means exactly 4): same work, window cost alone
        for cycle in decoder.generate(tokens, max_tokens=args.max_tokens, policy=mode, k=4, fixed_k=True,
                                      want_probs=True):
            n += len(cycle.emitted)
        return n / (time.perf_counter() - start), n

    results = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        prompt = PROMPTS.get(mode, PROMPTS["off"])
        plain_loop(mode, prompt)  # warm-up: caches the prompt, settles the policy's measurements
        in_window(mode, prompt)
        ratios, plain_rates, window_rates, blocks = [], [], [], []
        for _ in range(args.repeat):
            p_rate, p_tokens = plain_loop(mode, prompt)
            w_rate, w_tokens, blocked = in_window(mode, prompt)
            ratios.append(w_rate / p_rate)
            plain_rates.append(p_rate)
            window_rates.append(w_rate)
            blocks.append(blocked)
        results.append({
            "mode": mode, "tokens": w_tokens, "plain_tokens_per_s": round(statistics.median(plain_rates), 2),
            "window_tokens_per_s": round(statistics.median(window_rates), 2),
            "ratio_median": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
            "ui_blocked_max_ms": round(max(blocks), 1), "ui_blocked_per_run_ms": [round(b, 1) for b in blocks],
        })
    window.close()
    decoder.target.close()
    shiboken6.delete(window)  # before the QApplication, which is a local of this function too
    if args.json:
        print(json.dumps({"model": Path(model).name, "platform": app.platformName(), "results": results}, indent=1))
    else:
        print(f"model {Path(model).name}, Qt platform {app.platformName()}, {args.repeat} runs per mode, "
              f"{args.max_tokens} max tokens")
        print(f"{'mode':<8} {'plain tok/s':>11} {'window tok/s':>12} {'ratio':>6}  {'UI blocked max':>14}  ratios")
        for r in results:
            print(f"{r['mode']:<8} {r['plain_tokens_per_s']:>11.1f} {r['window_tokens_per_s']:>12.1f} "
                  f"{r['ratio_median']:>6.3f}  {r['ui_blocked_max_ms']:>11.1f} ms  {r['ratios']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
