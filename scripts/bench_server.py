"""`speculum serve` against a bare engine loop, and Predicted Outputs on a code edit.

One process loads the pair and serves it on 127.0.0.1; the requests come from a separate
client process (as from an editor), streaming. Rows, run alternately so both see the same
machine load:

- overhead: one chat request through the server vs the same prompt in a bare
  ``Decoder.generate`` loop in the server's process and vs ``speculum generate --json`` (the
  command line, a process of its own, its own tok/s), in plain decoding (mode off: all do the
  same passes, so the ratio is the server's cost alone) and in the run's mode (auto: the
  policy's own draws make two runs differ by more than the server does);
- edit: rename a variable through a 100-line file (resources/bench/edit_inventory.py.txt),
  with plain decoding (mode off), without a prediction, with the original file as the
  prediction, and with unrelated text as the prediction: tokens/s and accepted/rejected
  prediction tokens.

Every rate is decoding alone: tokens after the first over the time after the first, so a
row that reads its prompt afresh (the first edit after the chat rows) is not charged for it.
Ratios are taken within each round (rows a few seconds apart) and their median reported;
the order of the rows compared turns from round to round.
The edit's physical limit is the oracle of `speculum bench`: on this edit's output, with a
verify curve, what a drafter that knew in advance how much of the file would be accepted
could reach over plain decoding. Two curves: the policy's cost model, and the edit rows' own
passes (median time per pass size, at the edit's context length, in this run).

    SPECULUM_MODELS_DIR=~/.cache/speculum-dev/models python scripts/bench_server.py
    (add --target T --draft D, --mode auto, --max-tokens N, --repeat N, --json; --overhead-only
    runs the two plain-decoding chat rows alone, for more rounds in the same time; --structured
    runs only a JSON-schema extraction and a required tool call, speculative vs plain constrained)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EDIT_FILE = REPO / "resources" / "bench" / "edit_inventory.py.txt"
UNRELATED = REPO / "resources" / "bench" / "lighthouse-report.txt"
CHAT = "Write a Python function that parses a CSV file and returns the average of each numeric column."


def client(url: str, body: dict) -> dict:
    """In the client process: one streaming request; tokens, seconds, usage, Speculum's numbers."""
    import httpx

    start = time.perf_counter()
    first = None
    usage, numbers, pieces = {}, {}, []
    with httpx.stream("POST", url + "/chat/completions", json={**body, "stream": True,
                      "stream_options": {"include_usage": True}}, timeout=3600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                pieces.append((delta.get("content") or "")
                              + "".join(c["function"].get("arguments") or "" for c in delta.get("tool_calls") or []))
                first = first or (time.perf_counter() if pieces[-1] else None)
            usage = chunk.get("usage") or usage
            numbers = chunk.get("speculum") or numbers
    seconds = time.perf_counter() - start
    # Decoding alone: from the first token on (the prompt may or may not be cached already).
    return {"seconds": seconds, "decode_s": time.perf_counter() - (first or start),
            "tokens": usage.get("completion_tokens", 0), "usage": usage,
            "speculum": numbers, "text": "".join(pieces)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--overhead-only", action="store_true", help="only the server-overhead rows in plain decoding")
    parser.add_argument("--structured", action="store_true",
                        help="only a JSON-schema extraction and a required tool call: speculative vs plain constrained")
    parser.add_argument("--client", nargs=2, metavar=("URL", "BODY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        print(json.dumps(client(args.client[0], json.loads(args.client[1]))))
        return 0

    sys.path.insert(0, str(REPO / "app"))
    import socket

    import uvicorn

    from speculum.bench import curve_from_passes, oracle_speedup, timed_pass, verify_curve
    from speculum.engine.prompts import build_messages
    from speculum.engine.loading import load_decoder
    from speculum.engine.settings import LoadOptions
    from speculum.server.app import create_app
    from speculum.protocol import CycleEvent
    from speculum.server.service import ServedModel

    from demo_pair import demo_pair

    target, draft = demo_pair(args.target, args.draft)
    decoder = load_decoder(target, draft, LoadOptions(n_ctx=4096))
    served = ServedModel(decoder, "bench", mode=args.mode)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(served), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/v1"
    if args.structured:
        try:
            return structured(args, served, url)
        finally:
            server.should_exit = True

    passes = []  # (tokens in the pass, seconds) of the edit rows' cycles: the live verify curve

    def through_server(messages, prediction=None, mode=args.mode) -> dict:
        served.on_event = (lambda event: passes.append(timed_pass(event.cycle)) if isinstance(event, CycleEvent)
                           else None) if messages is edit else None
        body = {"model": "bench", "messages": messages, "max_tokens": args.max_tokens, "temperature": 0}
        if prediction is not None:
            body["prediction"] = {"type": "content", "content": prediction}
        served.mode = mode  # requests run one after another: the mode is this request's
        out = subprocess.run([sys.executable, __file__, "--client", url, json.dumps(body)],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    def bare_loop(messages, mode=args.mode) -> dict:
        prompt = decoder.target.tokenize(decoder.target.apply_chat_template(messages))
        start = time.perf_counter()
        n, first = 0, None
        generation = decoder.generate(prompt, max_tokens=args.max_tokens, policy=mode)
        for cycle in generation:
            first = first or time.perf_counter()
            n += len(cycle.emitted)
        end = time.perf_counter()
        return {"seconds": end - start, "decode_s": end - first, "tokens": n,
                "speculum": {"tokens_per_s": generation.stats.tokens_per_s}}

    def generate_command(mode="off") -> dict:
        # What a user runs: its own process, its own clock (decoding alone, the prompt apart),
        # with the models the server holds.
        out = subprocess.run([sys.executable, "-c", "import sys; from speculum.cli import main; sys.exit(main())",
                              "generate", "--target", target, "--mode", mode, "--max-tokens", str(args.max_tokens),
                              "--ctx", "4096", "--json", *(["--draft", draft] if draft else []), CHAT],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(REPO / "app")})
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        return {"tokens": summary["tokens"], "text": summary["text"],
                "speculum": {"tokens_per_s": summary["tokens_per_s"]}}

    # Tokens after the first over the time after it: decoding, whether or not the prompt was
    # cached; `speculum generate` reports its own.
    def rate(r: dict) -> float:
        return (r["tokens"] - 1) / r["decode_s"] if "decode_s" in r else r["speculum"]["tokens_per_s"]
    chat = build_messages(CHAT)
    source = EDIT_FILE.read_text(encoding="utf-8")
    edit = build_messages("Rename the variable `total` to `running_sum` everywhere in this file. Answer with "
                          f"the whole file and nothing else.\n\n```python\n{source}```")
    unrelated = UNRELATED.read_text(encoding="utf-8")[: len(source)]
    # Rows compared with each other run in one group, one after another.
    groups = [
        [("generate loop (chat, off)", lambda: bare_loop(chat, mode="off")),
         ("server, streaming (chat, off)", lambda: through_server(chat, mode="off")),
         ("speculum generate (chat, off)", lambda: generate_command(mode="off"))],
        [("generate loop (chat)", lambda: bare_loop(chat)), ("server, streaming (chat)", lambda: through_server(chat))],
        [("edit, plain decoding (off)", lambda: through_server(edit, mode="off")),
         ("edit, no prediction", lambda: through_server(edit)),
         ("edit, file as prediction", lambda: through_server(edit, source)),
         ("edit, unrelated prediction", lambda: through_server(edit, unrelated))]]
    if args.overhead_only:
        groups = groups[:1]
    rows = {name: [] for group in groups for name, _ in group}
    bare_loop(chat), through_server(chat)  # warm-up: prompts cached, policy settled
    if not args.overhead_only:
        through_server(edit)
    for i in range(args.repeat):
        print(f"  round {i + 1} of {args.repeat}", file=sys.stderr)
        # The order turns round by round, so that whatever favours a place in the order (a
        # machine warming up or slowing down between runs) falls on each row alike.
        for group in groups:
            for name, run in group[i % len(group):] + group[:i % len(group)]:
                rows[name].append(run())
    server.should_exit = True
    table = []
    for name, runs in rows.items():
        details = [r.get("usage", {}).get("completion_tokens_details") or {} for r in runs]
        table.append({"row": name, "tokens_per_s": round(statistics.median(rate(r) for r in runs), 2),
                      "runs": [round(rate(r), 2) for r in runs], "tokens": runs[-1]["tokens"],
                      "accepted_prediction_tokens": details[-1].get("accepted_prediction_tokens"),
                      "rejected_prediction_tokens": details[-1].get("rejected_prediction_tokens"),
                      "acceptance_rate": runs[-1].get("speculum", {}).get("acceptance_rate")})
    def paired(a: str, b: str, measure=rate) -> float:
        """The median of each round's ratio: rows of one round share its load."""
        return statistics.median(measure(x) / measure(y) for x, y in zip(rows[a], rows[b]))

    ratios = {"server / generate loop (off)": paired("server, streaming (chat, off)", "generate loop (chat, off)"),
              # The same by the engine's own clock (its cycles' time): what the server costs the
              # decoding itself, without the time the tokens take to reach the client.
              "engine in the server / generate loop (off)": paired(
                  "server, streaming (chat, off)", "generate loop (chat, off)",
                  measure=lambda r: r["speculum"]["tokens_per_s"]),
              # The issue's own yardstick: the command line's tok/s for the same request.
              "server / speculum generate (off)": paired("server, streaming (chat, off)", "speculum generate (chat, off)"),
              "engine in the server / speculum generate (off)": paired(
                  "server, streaming (chat, off)", "speculum generate (chat, off)",
                  measure=lambda r: r["speculum"]["tokens_per_s"])}
    same = rows["speculum generate (chat, off)"][-1]["text"] == rows["server, streaming (chat, off)"][-1]["text"]
    print(f"  server and speculum generate wrote the same text: {same}", file=sys.stderr)
    if not args.overhead_only:
        ratios.update({
            f"server / generate loop ({args.mode})": paired("server, streaming (chat)", "generate loop (chat)"),
            "file prediction / none": paired("edit, file as prediction", "edit, no prediction"),
            "file prediction / plain decoding": paired("edit, file as prediction", "edit, plain decoding (off)"),
            "no prediction / plain decoding": paired("edit, no prediction", "edit, plain decoding (off)"),
            "unrelated prediction / none": paired("edit, unrelated prediction", "edit, no prediction")})
    if not args.overhead_only:
        prompt = decoder.target.tokenize(decoder.target.apply_chat_template(edit))
        output = decoder.target.tokenize(rows["edit, file as prediction"][-1]["text"], parse_special=False)
        # Two curves: the policy's cost model (what it chose by), and the edit's own passes as
        # they ran at this context length (what this machine allows this request).
        for name, curve in (("policy's curve", verify_curve(decoder)), ("the edit's passes", curve_from_passes(passes))):
            if curve is not None:
                oracle = oracle_speedup(prompt, output, curve)
                ratios[f"physical limit of the edit (oracle, {name}) / plain decoding"] = oracle
                ratios[f"file prediction / physical limit ({name})"] = ratios["file prediction / plain decoding"] / oracle
    if args.json:
        print(json.dumps({"target": Path(target).name, "mode": args.mode, "rows": table,
                          "ratios": {k: round(v, 3) for k, v in ratios.items()}}, indent=1))
        return 0
    print(f"{Path(target).name}, {args.mode} mode, {args.max_tokens} max tokens, median of {args.repeat}")
    print(f"{'':<28} {'tok/s':>7} {'tokens':>6} {'accepted':>9} {'rejected':>9}  runs")
    for r in table:
        print(f"{r['row']:<28} {r['tokens_per_s']:>7.2f} {r['tokens']:>6} {str(r['accepted_prediction_tokens']):>9} "
              f"{str(r['rejected_prediction_tokens']):>9}  {r['runs']}")
    for name, value in ratios.items():
        print(f"{name}: {value:.3f}")
    return 0


def structured(args, served, url) -> int:
    """Constrained answers through the server: bench_grammar's invoice extraction as a
    ``json_schema`` response_format, and the same fields as a required call of a tool. Each
    round runs plain constrained decoding (mode off) and speculation (draft, and --mode) one
    after another; rates are the engine's own (decoding, the prompt apart)."""
    from bench_grammar import WORKLOADS

    schema, ask, max_tokens = WORKLOADS["invoice"]
    tool = {"type": "function", "function": {"name": "record_invoice", "description": "Record an invoice.",
                                             "parameters": schema}}
    requests = {
        "json_schema extraction": {"messages": [{"role": "user", "content": ask}], "response_format": {
            "type": "json_schema", "json_schema": {"name": "invoice", "strict": True, "schema": schema}}},
        "tool call (required)": {"messages": [{"role": "user", "content": ask.replace("Extract this invoice as JSON",
                                                                                          "Record this invoice")}],
                                 "tools": [tool], "tool_choice": "required"}}
    modes = list(dict.fromkeys(["off", "draft", args.mode]))
    runs: dict[tuple[str, str], list[dict]] = {}

    def through_server(body: dict, mode: str) -> dict:
        served.mode = mode
        body = {"model": "bench", "max_tokens": max_tokens, "temperature": 0, **body}
        out = subprocess.run([sys.executable, __file__, "--client", url, json.dumps(body)],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    for body in requests.values():
        through_server(body, "off")  # warm-up: prompts read once
    for i in range(args.repeat):
        print(f"  round {i + 1} of {args.repeat}", file=sys.stderr)
        for name, body in requests.items():
            for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
                runs.setdefault((name, mode), []).append(through_server(body, mode))
    rows = []
    for (name, mode), results in runs.items():
        plain = runs[(name, "off")]
        rate = [r["speculum"]["tokens_per_s"] for r in results]
        numbers = results[-1]["speculum"]
        rows.append({"request": name, "mode": mode, "tokens_per_s": round(statistics.median(rate), 2),
                     "ratio_to_plain": round(statistics.median(r / p["speculum"]["tokens_per_s"]
                                                               for r, p in zip(rate, plain)), 3),
                     "acceptance_rate": numbers.get("acceptance_rate"),
                     "tokens_per_pass": numbers.get("tokens_per_pass"), "tokens": results[-1]["tokens"],
                     "valid_json": _is_json(results[-1]["text"]),
                     "same_as_plain": results[-1]["text"] == plain[-1]["text"]})
    if args.json:
        print(json.dumps({"repeat": args.repeat, "rows": rows}, indent=1))
        return 0
    print(f"{'request':<24}{'mode':<7}{'tok/s':>7}{'x plain':>9}{'accepted':>10}{'tok/pass':>10}{'tokens':>8}"
          "  json  same")
    for r in rows:
        acc = "" if r["acceptance_rate"] is None or r["mode"] == "off" else f"{100 * r['acceptance_rate']:.0f}%"
        print(f"{r['request']:<24}{r['mode']:<7}{r['tokens_per_s']:>7.2f}{r['ratio_to_plain']:>9.2f}{acc:>10}"
              f"{r['tokens_per_pass']:>10.2f}{r['tokens']:>8}  {r['valid_json']!s:<5} {r['same_as_plain']}")
    return 0


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    sys.exit(main())
