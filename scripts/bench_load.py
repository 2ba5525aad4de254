"""Decoding speed on a quiet machine and while another program keeps one core busy.

A desktop app shares its cores with a browser and an editor. llama.cpp's OpenMP threads
wait for each other at a barrier after every operation; how they wait (spin, or sleep)
decides what a busy core costs. For each wait setting, a fresh process (libgomp reads its
environment once, at load) loads the pair and alternates quiet runs with runs beside a
process that spins on one core, for plain decoding and auto mode.

    SPECULUM_MODELS_DIR=~/.cache/speculum-dev/models python scripts/bench_load.py
    (add --model T --draft D, --settings today,passive,speculum,spin=N, --modes off,auto,
     --max-tokens N, --repeat N, --json)

Settings: today = libgomp's default (GOMP_SPINCOUNT=300000; Speculum's again since its threads follow the cores);
passive = OMP_WAIT_POLICY=passive; speculum = what engine/llama/cpu_settings.py sets; spin=N = GOMP_SPINCOUNT=N.
Each as Speculum runs it, its thread count following other programs (engine/llama/contention.py);
with "/fixed" after it (speculum/fixed), on all cores whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = "Write a Python function that parses a CSV file and returns the average of each numeric column."


FIXED = "/fixed"  # a setting's suffix: the thread count kept at all cores, not following other programs


def environment(setting: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if setting.endswith(FIXED):
        env["SPECULUM_BENCH_FIXED_THREADS"] = "1"
        setting = setting[:-len(FIXED)]
    if setting == "today":
        env["GOMP_SPINCOUNT"] = "300000"  # libgomp's own default when nothing is set
    elif setting == "passive":
        env["OMP_WAIT_POLICY"] = "passive"
    elif setting.startswith("spin="):
        env["GOMP_SPINCOUNT"] = setting.split("=", 1)[1]
    elif setting != "speculum":
        raise SystemExit(f"unknown setting {setting!r}")
    return env


def busy_core() -> subprocess.Popen:
    """Another program keeping one core busy, as a browser tab or a compile would."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def measure(args) -> dict:
    """In the fresh process: load once, then alternate quiet and busy runs per mode."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "app"))
    from speculum.engine.llama import cpu_settings
    from speculum.engine.loading import load_decoder
    from speculum.engine.settings import LoadOptions
    from speculum.engine.prompts import build_messages

    from speculum.engine.llama.native import default_threads

    fixed = os.environ.get("SPECULUM_BENCH_FIXED_THREADS") == "1"
    decoder = load_decoder(args.model, args.draft, LoadOptions(n_ctx=2048, n_threads=default_threads() if fixed else None))
    prompt = decoder.target.tokenize(decoder.target.apply_chat_template(build_messages(PROMPT)))

    def run(mode: str) -> float:
        start = time.perf_counter()
        n = sum(len(c.emitted) for c in decoder.generate(prompt, max_tokens=args.max_tokens, policy=mode))
        return n / (time.perf_counter() - start)

    out = {"threads": cpu_settings.in_effect(), "modes": {}}
    for mode in args.modes.split(","):
        run(mode)  # warm-up: the prompt cached, auto mode's measurements settled
        quiet, busy = [], []
        for _ in range(args.repeat):
            quiet.append(run(mode))
            hog = busy_core()
            time.sleep(0.3)
            try:
                busy.append(run(mode))
            finally:
                hog.kill()
                hog.wait()
        out["modes"][mode] = {"quiet": statistics.median(quiet), "busy": statistics.median(busy),
                              "quiet_runs": quiet, "busy_runs": busy}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model")
    parser.add_argument("--draft")
    parser.add_argument("--settings", default="today,passive,speculum")
    parser.add_argument("--modes", default="off,auto")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the fresh process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args)))
        return 0
    if not args.model:
        from demo_pair import demo_pair

        args.model, args.draft = demo_pair(None, args.draft)
    results = {}
    for setting in args.settings.split(","):
        cmd = [sys.executable, __file__, "--measure", "--model", args.model, "--modes", args.modes,
               "--max-tokens", str(args.max_tokens), "--repeat", str(args.repeat)]
        if args.draft:
            cmd += ["--draft", args.draft]
        done = subprocess.run(cmd, env=environment(setting), capture_output=True, text=True)
        if done.returncode:
            print(done.stderr, file=sys.stderr)
            return 1
        results[setting] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  measured {setting}", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{os.path.basename(args.model)}, {args.max_tokens} tokens, median of {args.repeat}; busy = "
          "another process spinning on one core")
    print(f"{'setting':<12} {'mode':<5} {'quiet tok/s':>11} {'busy tok/s':>10} {'busy/quiet':>10} "
          f"{'quiet vs today':>14}  GOMP_SPINCOUNT / OMP_WAIT_POLICY")
    for setting, r in results.items():
        for mode, m in r["modes"].items():
            today = results.get("today", {}).get("modes", {}).get(mode, {}).get("quiet")
            t = r["threads"]
            print(f"{setting:<12} {mode:<5} {m['quiet']:>11.2f} {m['busy']:>10.2f} {m['busy'] / m['quiet']:>10.2f} "
                  f"{(m['quiet'] / today if today else float('nan')):>14.3f}  "
                  f"{t.get('GOMP_SPINCOUNT') or '-'} / {t.get('OMP_WAIT_POLICY') or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
