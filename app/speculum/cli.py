"""`speculum` — the window with no arguments; `generate`, `bench`, `models`, `doctor`, `rpc-worker`."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
import sys
import threading

from . import __version__, paths
from .engine.vocabulary import Device, Mode
from .errors import SpeculumError

# Each command imports what it runs, inside it: the engine and bench modules cost ~0.23 s
# of imports (numpy, jinja2, GGUF headers; measured with -X importtime), which the window's
# start, `speculum models` and `doctor` need not pay.


def _add_model_options(p: argparse.ArgumentParser, draft: bool = True) -> None:
    p.add_argument("--target", required=True, help="target GGUF file")
    if draft:
        p.add_argument("--draft", help="draft GGUF file (same tokenizer as the target)")
    p.add_argument("--ctx", type=int, default=4096, help="context size in tokens (default 4096)")
    p.add_argument("--threads", type=int, help="CPU threads (default: all cores)")
    p.add_argument("--gpu-layers", type=int, help="target layers on the GPU (default: all when there is one)")
    p.add_argument("--draft-gpu-layers", type=int, help="draft layers on the GPU (default: all when there is one)")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                   help="flash attention (default auto: off for a target on the CPU, where verification "
                        "passes run faster without it; llama.cpp's choice elsewhere)")
    p.add_argument("--cache-ram", type=int, metavar="MIB",
                   help="memory for the KV state of recent prompts (default: a quarter of free memory, "
                        "at most 8192; 0: none)")
    p.add_argument("--no-ngram-memory", action="store_true",
                   help="do not draft from (or keep) what this machine wrote and read before")
    p.add_argument("--rpc", metavar="WORKER[,WORKER...]",
                   help="put the target's layers on these `speculum rpc-worker`s; the draft stays here. WORKER is "
                        "the pairing string a worker prints (HOST:PORT/FINGERPRINT/TOKEN: TLS, the worker's "
                        "certificate pinned, its token presented), or HOST:PORT ([IPv6]:PORT) for a worker started "
                        "with --insecure (no authentication, no encryption: loopback, or your own tunnel)")
    p.add_argument("--rpc-timeout", metavar="SECONDS", default=None,
                   help="end the request when an RPC worker stays silent this long while it owes an answer "
                        "(frozen, asleep, cut off; default 30)")
    p.add_argument("--tensor-split", metavar="P1,P2,...",
                   help="the target's share per device, as llama.cpp's: the --rpc workers in order, then local GPUs")


def _add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.AUTO.value)
    p.add_argument("-k", type=int, default=4, help="tokens drafted per cycle with --fixed-k (otherwise adapted)")
    p.add_argument("--fixed-k", action="store_true", help="draft and lookup modes draft exactly k tokens every cycle")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--max-tokens", type=int, default=256)


def _fixed_k(args) -> int | None:
    """The CLI's contract: ``-k N`` is the draft length only with ``--fixed-k``; else it adapts."""
    return args.k if args.fixed_k else None


def _load(args, progress=None):
    """The pair, loaded in this process with the engine profile this machine remembers
    (``progress(stage, fraction)`` returning False cancels)."""
    from .engine.llama import profiles
    from .engine.loading import load_decoder
    from .engine.settings import LoadOptions

    profile, why = profiles.remembered()
    if profile is not profiles.STANDARD:
        print(f"speculum: engine profile {profiles.describe(profile, why)}", file=sys.stderr)
    args.profile = profile.name
    options = LoadOptions(n_ctx=args.ctx, n_threads=args.threads, target_gpu_layers=args.gpu_layers,
                          draft_gpu_layers=getattr(args, "draft_gpu_layers", None),
                          flash_attn={"on": True, "off": False}.get(getattr(args, "flash_attn", "auto")),
                          prompt_cache_mib=_cache_ram(args), ngram_memory=not getattr(args, "no_ngram_memory", False),
                          **_rpc_options(args))
    return load_decoder(args.target, getattr(args, "draft", None), profile.apply(options), progress)


def _cache_ram(args) -> int | None:
    mib = getattr(args, "cache_ram", None)
    if mib is not None and mib < 0:
        raise SpeculumError(f"--cache-ram is a size in MiB (0 for none), not {mib}.")
    return mib


def _rpc_options(args) -> dict:
    """--rpc and --tensor-split as LoadOptions fields (checked here: a typo is one message)."""
    from .engine.rpc import client as rpc

    options: dict = {}
    if getattr(args, "rpc_timeout", None) is not None:
        rpc.set_read_timeout(args.rpc_timeout)
    if getattr(args, "rpc", None):
        options["rpc"] = rpc.parse_endpoints(args.rpc)
    if getattr(args, "tensor_split", None):
        try:
            options["tensor_split"] = tuple(float(x) for x in args.tensor_split.split(",") if x.strip())
        except ValueError:
            raise SpeculumError(f"--tensor-split takes numbers separated by commas, e.g. 3,1: '{args.tensor_split}'.")
    return options


def _attention(decoder) -> list[dict]:
    """Flash attention in effect for each model, with the devices that hold it (RPC workers named,
    each with the device it said it computes on)."""
    from .engine.rpc import client as rpc

    report = []
    for role, model in (("target", decoder.target), ("draft", decoder.draft)):
        if model is None:
            continue
        entry = {"model": role, "devices": model.facts.backend,
                 "flash_attn": {True: "on", False: "off"}.get(model.flash_attn, "llama.cpp's choice")}
        if model.facts.device == Device.RPC:  # (only a target's layers go to workers)
            entry["workers"] = rpc.workers_in_use()
            if model.output_here:
                entry["output_layer"] = "this machine"  # hidden states cross the network, not logits
        report.append(entry)
    return report


def _mode(name: str) -> Mode:
    try:
        return Mode(name)
    except ValueError:
        raise SpeculumError(f"Unknown mode {name!r}: choose from {', '.join(Mode)}.") from None


def cmd_generate(args) -> int:
    from .documents import read_document
    from .engine.prompts import build_messages
    from .engine.sampling import SamplingParams
    from .engine.stats import Stats
    from .summarise import DocumentSummary
    from .termview import PromptProgress, TerminalView

    user = sys.stdin.read() if args.prompt == "-" else args.prompt
    document = read_document(args.document) if args.document else None
    decoder = _load(args)
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.seed)
    reading = PromptProgress(sys.stderr)

    def generate(messages):
        prompt = decoder.target.tokenize(decoder.target.apply_chat_template(messages))
        return decoder.generate(prompt, max_tokens=args.max_tokens, sampling=sampling, policy=Mode(args.mode),
                                k=_fixed_k(args), on_prompt=reading, origin="cli")

    if document is None:
        generation = generate(build_messages(user, args.system))
        steps = (("", cycle, generation) for cycle in generation)
    else:  # in parts, then combined, when longer than the context: as the window does
        steps = DocumentSummary(decoder.target, document, args.max_tokens, generate, request=user)
    view = TerminalView(decoder.target, color={"always": True, "never": False}.get(args.color))
    last, text, runs, stage_now = None, [], [], ""
    try:
        for stage, cycle, generation in steps:
            if not runs or runs[-1] is not generation.stats:  # each generation (part) has its own stats
                runs.append(generation.stats)
            last = cycle
            text.append(cycle.text)
            if args.json:
                record = {"type": "cycle", **cycle.to_json()}
                if stage:
                    record["stage"] = stage
                print(json.dumps(record, ensure_ascii=False), flush=True)
            else:
                if stage != stage_now:
                    print(f"\n— {stage} —", file=view.out, flush=True)
                    stage_now = stage
                view.show(cycle)
    except KeyboardInterrupt:
        pass
    stats = Stats()
    for run in runs:  # a document in parts: all its generations, as one
        stats.merge(run)
    answer = steps.text if isinstance(steps, DocumentSummary) and steps.text else "".join(text)
    if args.json:
        summary = {"type": "summary", **stats.summary(), "mode": args.mode, "profile": args.profile,
                   "finish": last.finish if last else None, "message": last.message if last else "",
                   "text": answer, "policy": last.policy.to_json() if last and last.policy else {},
                   "attention": _attention(decoder)}
        if isinstance(steps, DocumentSummary) and steps.part_summaries:
            summary["parts"] = len(steps.part_summaries)
        print(json.dumps(summary, ensure_ascii=False))
    else:
        view.summary(stats, last.finish if last else None, last.message if last else "",
                     last.policy if last else None)
    return 0


def cmd_bench(args) -> int:
    from .bench import load_prompts, print_table, run_bench

    prompts = load_prompts(args.prompts)
    modes = [_mode(m.strip()) for m in args.modes.split(",") if m.strip()]
    decoder = _load(args)
    info: dict = {}
    results = run_bench(decoder, prompts, modes, max_tokens=args.max_tokens, repeat=args.repeat,
                        k=_fixed_k(args), progress=sys.stderr, info=info)
    info["flash_attn"] = {True: "on", False: "off"}.get(decoder.target.flash_attn, "auto")  # the target's
    info["attention"] = _attention(decoder)
    if args.json:
        print(json.dumps({"results": results, "profile": args.profile, **info}, indent=1))
    else:
        print_table(results, sys.stdout, info)
    return 0


def cmd_tune(args) -> int:
    """Time the target's verification passes with ggml's tiled matmul on and off, in child
    processes; the faster setting is remembered for this machine (engine/llama/tuning.py)."""
    from .engine.llama import tuning
    from .engine.llama.model import default_threads

    threads = args.threads or default_threads()
    if args.child:  # one setting, from the environment: the passes' seconds as JSON
        print(json.dumps(tuning.time_passes(args.target, threads)))
        return 0
    print("speculum: timing verification passes with the tiled matmul on and off (about a minute)…",
          file=sys.stderr)
    passes = tuning.measure(args.target, threads, lambda: False)
    if passes is None:
        raise SpeculumError(f"The measurement failed: the model could not be timed ({args.target}).")
    entry = tuning.remember_passes(args.target, passes)
    print(json.dumps(entry, indent=1))
    print(f"speculum: GGML_CPU_TILED_MM={entry['tiled']} from the next start ({entry['decided_by']})", file=sys.stderr)
    return 0


def cmd_doctor(args) -> int:
    from . import qtcheck
    from .engine.llama import cpu_settings, native, profiles

    try:
        from PySide6 import __version__ as qt_version
    except Exception as exc:  # Qt missing or its libraries absent: report, don't fail
        qt_version = f"unavailable ({exc})"
    gpu = native.gpu_backend()
    rows = [
        ("Speculum", __version__),
        ("Python", platform.python_version()),
        ("llama.cpp (llama-cpp-python)", native.llama_cpp_version()),
        ("Qt (PySide6)", qt_version),
        ("Compute backend", gpu or "CPU"),
        ("GPU offload", "supported" if gpu else "not supported by this llama.cpp build"),
        ("Threads", str(native.default_threads())),
        ("Thread wait", _thread_wait(cpu_settings.in_effect())),
        ("Tiled matmul", _tiled_matmul(cpu_settings.in_effect())),
        ("Flash attention", ("llama.cpp's choice (on the GPU)" if gpu else
         "off for the target (verification passes run faster without it on the CPU), "
         "llama.cpp's choice for draft models and MTP heads") +
         "; a target on RPC workers as on their device: off on CPU workers, llama.cpp's choice on GPU ones "
         "(a plain --insecure worker is taken to be of this machine's kind); --flash-attn on|off chooses; "
         "generate/bench --json report it per model and device"),
        ("System", f"{platform.system()} {platform.machine()}"),
        ("Models folder", str(paths.models_dir())),
        ("Data folder", str(paths.data_dir())),
        ("Settings folder", str(paths.config_dir())),
        ("AMX kernels", "compiled in: batched decoding may crash on CPUs with AMX (llama.cpp issue 20824); "
                        "reinstall with scripts/setup-env.sh" if native.has_amx_kernels() else "none (as it should be)"),
        ("RPC (across machines)", _rpc_row()),
        ("MTP (built-in drafts)", _mtp_row()),
        ("Engine profile", profiles.describe(*profiles.remembered())),
        ("Window libraries", qtcheck.report()),
        ("llama.cpp features", native.system_info().strip()),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if native.has_amx_kernels():
        print("speculum: warning: this llama.cpp has AMX kernels, which crash on CPUs with AMX; "
              "bash scripts/setup-env.sh builds one without them.", file=sys.stderr)
    return 0


LOOPBACK = ("127.0.0.1", "localhost", "::1")


# How long a server whose models failed to load still answers /health (why) before it exits.
LOAD_FAILED_LINGER_S = 3.0


def cmd_serve(args) -> int:
    """An OpenAI-compatible API over the loaded pair, until Ctrl-C. It listens first: /health
    says loading (and requests get 503 model_loading) until the models are in."""
    import uvicorn

    from .engine.policy.fixed import FixedPolicy
    from .models.gguf import check_gguf_file
    from .server import listen
    from .server.api import create_app
    from .server.service import ServedModel

    if args.host not in LOOPBACK and not args.api_key:
        raise SpeculumError(f"Serving on {args.host} makes the model reachable from other machines: "
                            "pass --api-key KEY (clients send Authorization: Bearer KEY).")
    if args.n_ctx:
        args.ctx = args.n_ctx
    # What the files' headers tell is said at once, before anything listens: a wrong path, a mode they cannot run.
    target = check_gguf_file(args.target)
    draft = check_gguf_file(args.draft) if getattr(args, "draft", None) else None
    if Mode(args.mode) in (Mode.DRAFT, Mode.MTP):
        FixedPolicy.for_mode(Mode(args.mode), None, has_draft_model=draft is not None,
                             has_mtp=target.nextn_layers > 0 or bool(draft and draft.assistant_for))
    model_id = args.model_id or Path(args.target).stem
    served = ServedModel(None, model_id, mode=args.mode, max_waiting=args.max_waiting)
    served.state_message = f"Loading {model_id}."
    app = create_app(served, api_key=args.api_key, cors_origins=args.cors_origin or None, bind_host=args.host)
    server = uvicorn.Server(listen.config(app, args.host, args.port, header_timeout=args.header_timeout,
                                         max_connections=args.max_connections))
    failed = threading.Event()
    loading = threading.Thread(target=_load_served, args=(args, served, server, failed), name="speculum-load",
                               daemon=True)
    loading.start()
    print(f"Listening at http://{args.host}:{args.port}/v1; loading {model_id}", file=sys.stderr, flush=True)
    try:
        server.run()
    finally:  # (Ctrl-C: uvicorn raises it again once it has shut down)
        loading.join(10)  # a load still running sees should_exit at its next tensor and cancels
    return 1 if failed.is_set() else 0


def _load_served(args, served, server, failed) -> None:
    """Load the pair for a server already listening; a failure is said on /health for a
    moment, then the server exits (the process ends non-zero)."""
    import time

    def progress(stage: str, fraction: float) -> bool:
        served.state_message = f"Loading the {stage} model: {fraction:.0%}."
        return not server.should_exit  # Ctrl-C while loading cancels the load

    try:
        decoder = _load(args, progress)
        decoder.policy_for(args.mode)  # a mode these models cannot run (mtp without NextN layers) stops here
    except BaseException as exc:  # noqa: BLE001 - said in words; the server must not stay up without models
        if server.should_exit:
            return
        message = str(exc) if isinstance(exc, SpeculumError) else f"Loading failed: {exc!r}"
        served.load_failed(message)
        failed.set()
        print(f"speculum: {message}", file=sys.stderr, flush=True)
        time.sleep(LOAD_FAILED_LINGER_S)
        server.should_exit = True
        return
    if getattr(args, "rpc", None):
        from .engine.rpc import client as rpc

        # A lost worker ends the request, not the server: the models load again once it is back.
        served.workers = rpc.parse_endpoints(args.rpc)
        served.reload = lambda: _load(args)
        rpc.on_worker_lost(served.worker_lost)
    served.loaded(decoder)  # answered at once: auto mode measures this machine's costs in idle moments
    print(f"Serving {served.model_id} ({args.mode} mode) at http://{args.host}:{args.port}/v1",
          file=sys.stderr, flush=True)
    from .server.idle import IdleMeasuring

    IdleMeasuring(served, Mode(args.mode), lambda: server.should_exit).start()


def cmd_rpc_worker(args) -> int:
    from .rpc_worker import run

    from .engine.rpc.address import check_port

    return run(args.host, check_port(args.port, "--port"), args.threads, args.cache_dir, args.insecure,
               args.new_pairing)


def _rpc_row() -> str:
    from .engine.rpc import client as rpc

    why = rpc.availability()
    return why or (f"available (llama.cpp RPC protocol {'.'.join(map(str, rpc.PROTOCOL))}): "
                   "speculum rpc-worker, --rpc HOST:PORT")


def _mtp_row() -> str:
    from .engine.llama import llama_ext

    ok = llama_ext.support()
    return ("yes: models with NextN layers draft for themselves (--mode mtp)" if ok
            else f"no: {ok.reason}")


def _thread_wait(setting: dict) -> str:
    text = " ".join(f"{name}={setting[name]}" for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if setting.get(name))
    return f"{text} (set by {setting.get('source')})"


def _tiled_matmul(setting: dict) -> str:
    from .engine.llama import cpu_settings

    on = cpu_settings.tiled_matmul_on(setting)
    why = ""
    if setting.get("tiled_source") == cpu_settings.FROM_SPECULUM:
        why = (": this CPU has AVX-512, where verification passes run faster with it" if on
               else ": without AVX-512 verification passes of 8+ tokens run faster without it")
        why += "; until measured here (the window does, after a model loads, while it waits for you)"
    elif setting.get("tiled_source") == cpu_settings.FROM_MEASUREMENT:
        measured = setting.get("tiled_measured") or {}
        why = (f" ({measured.get('model')}, {measured.get('at')}): " +
               (f"verification passes ran faster {'with' if on else 'without'} it here"
                if measured.get("decided_by") == "measurement" else "no difference measured, so by the CPU's flags"))
    value = setting.get(cpu_settings.TILED_MATMUL)
    return f"{'on' if on else 'off'} ({cpu_settings.TILED_MATMUL}={value}, set by {setting.get('tiled_source')}){why}"


def cmd_gui(args) -> int:
    from . import qtcheck

    problem = qtcheck.problem()
    if problem:
        print(f"speculum: {problem}", file=sys.stderr)
        return 2
    from .ui.app import run_app

    return run_app(args)


def _add_serve_options(s: argparse.ArgumentParser) -> None:
    from .server import listen

    _add_model_options(s)
    s.add_argument("--n-ctx", type=int, help="context size in tokens (same as --ctx)")
    s.add_argument("--mode", choices=("auto", "off", "draft", "lookup", "mtp"), default="auto")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--api-key", help="required as 'Authorization: Bearer KEY' (needed to listen beyond this machine)")
    s.add_argument("--model-id", help="the model name clients use (default: the target file's name)")
    s.add_argument("--max-waiting", type=int, default=8, help="requests that may wait for the model (then 429)")
    s.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                   help="let web pages from this origin (https://app.example) call the API; repeatable, '*' for any "
                        "(default: none: a page on another site cannot drive the model)")
    s.add_argument("--header-timeout", type=float, default=listen.HEADER_TIMEOUT_S, metavar="S",
                   help="close a connection whose request headers take longer than this "
                        f"(default {listen.HEADER_TIMEOUT_S:g} s)")
    s.add_argument("--max-connections", type=int, default=listen.MAX_CONNECTIONS, metavar="N",
                   help=f"open connections at most; more are closed at once (default {listen.MAX_CONNECTIONS})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speculum", description="Local LLMs with speculative decoding, made visible.")
    parser.add_argument("--version", action="version", version=f"speculum {__version__}")
    parser.add_argument("--self-test", metavar="MODEL", help="check a model loads and generates; exit 0 when it does")
    sub = parser.add_subparsers(dest="command")

    g = sub.add_parser("generate", help="generate from a prompt, showing each draft")
    _add_model_options(g)
    _add_sampling_options(g)
    g.add_argument("--system", help="system message")
    g.add_argument("--document", help="a .txt/.md/.html/.pdf document to work on")
    g.add_argument("--json", action="store_true", help="one JSON object per cycle, then a summary object")
    g.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    g.add_argument("prompt", help="the prompt; '-' reads it from standard input")
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="compare modes side by side on a prompt suite")
    _add_model_options(b)
    b.add_argument("--prompts", help="JSONL prompt suite (default: the bundled one)")
    b.add_argument("--modes", default="off,draft,lookup,mtp,auto",
                   help="modes to compare; draft needs --draft, mtp a target with NextN layers (else skipped)")
    b.add_argument("--max-tokens", type=int, help="override each prompt's max_tokens")
    b.add_argument("--repeat", type=int, default=1)
    b.add_argument("-k", type=int, default=4)
    b.add_argument("--fixed-k", action="store_true", help="draft and lookup modes draft exactly k tokens every cycle")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench)

    t = sub.add_parser("tune", help="measure whether ggml's tiled matmul speeds up verification on this machine")
    t.add_argument("--target", required=True, help="target GGUF file")
    t.add_argument("--threads", type=int, help="CPU threads (default: all cores)")
    t.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    t.set_defaults(func=cmd_tune)

    s = sub.add_parser("serve", help="an OpenAI-compatible API (chat, completions, Predicted Outputs)")
    _add_serve_options(s)
    s.set_defaults(func=cmd_serve)

    d = sub.add_parser("doctor", help="versions, compute backend, folders")
    d.set_defaults(func=cmd_doctor)

    w = sub.add_parser("rpc-worker", help="lend this machine's device to another machine's target (llama.cpp RPC)")
    w.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 or :: for all "
                        "interfaces, each printed with its pairing string)")
    w.add_argument("--port", default="50052", help="TCP port (default 50052)")
    w.add_argument("--insecure", action="store_true",
                   help="serve llama.cpp's plain RPC protocol on --host: no TLS, no token; anyone who reaches the "
                        "port can run code on this device. For loopback, or inside a tunnel of your own "
                        "(SSH, WireGuard); clients then pass --rpc HOST:PORT")
    w.add_argument("--new-pairing", action="store_true",
                   help="make a new certificate and token: pairing strings printed before stop working")
    w.add_argument("--threads", type=int, help="CPU threads for the device (default: all cores)")
    w.add_argument("--cache-dir", help="keep large tensors here, so a reload does not send them again")
    w.set_defaults(func=cmd_rpc_worker)

    from .models.commands import register

    register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.self_test:
            from .selftest import self_test

            return self_test(args.self_test)
        if args.command is None:
            return cmd_gui(args)
        return args.func(args)
    except SpeculumError as exc:
        print(f"speculum: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # Ctrl-C: the end the user asked for, not a fault to show
        return 130


if __name__ == "__main__":
    sys.exit(main())
