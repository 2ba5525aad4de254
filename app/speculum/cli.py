"""`speculum` — the window with no arguments; `generate`, `bench`, `tune`, `serve`, `models`, `doctor`, `rpc-worker`.

What the command line says is read in ``options`` (one typed object per subcommand); what each
command does is here.
"""

from __future__ import annotations

import json
import platform
import sys
import threading
from typing import TYPE_CHECKING

from . import __version__, paths
from .engine.vocabulary import Device, Mode, Role
from .errors import SpeculumError
from .models import commands as models_commands
from .options import (BenchOptions, DoctorOptions, GenerateOptions, ModelOptions, ModelsAdd, ModelsCheck,
                      ModelsDownload, ModelsInstallDemo, ModelsList, ModelsRemove, Options, RpcWorkerOptions,
                      SelfTestOptions, ServeCommand, TuneOptions, WindowOptions, parse)

if TYPE_CHECKING:
    from .server.serving import Serving

# Each command imports what it runs, inside it: the engine and bench modules cost ~0.23 s
# of imports (numpy, jinja2, GGUF headers; measured with -X importtime), which the window's
# start, `speculum models` and `doctor` need not pay.


def _load(models: ModelOptions, progress=None):
    """The pair, loaded in this process with the engine profile this machine remembers: the
    decoder and the profile's name (``progress(role, fraction)`` returning False cancels)."""
    if models.exact is not None:  # first: ggml reads its switch once, when llama.cpp loads
        from .engine.llama import cpu_settings

        cpu_settings.choose_exact(models.exact)
    from .engine.llama import profiles
    from .engine.loading import load_decoder

    profile, why = profiles.remembered()
    if profile is not profiles.STANDARD:
        print(f"speculum: engine profile {profiles.describe(profile, why)}", file=sys.stderr)
    if models.rpc_timeout is not None:
        from .engine.rpc import client as rpc

        rpc.set_read_timeout(models.rpc_timeout)
    return load_decoder(models.target, models.draft, profile.apply(models.load), progress), profile.name


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


def cmd_generate(options: GenerateOptions) -> int:
    from .documents import read_document
    from .engine.chat import chat_tokens
    from .engine.prompts import build_messages
    from .engine.sampling import SamplingParams
    from .engine.stats import Stats
    from .summarise import DocumentSummary
    from .termview import PromptProgress, TerminalView

    chosen = options.sampling
    user = sys.stdin.read() if options.prompt == "-" else options.prompt
    document = read_document(options.document) if options.document else None
    decoder, profile = _load(options.models)
    sampling = SamplingParams(chosen.temperature, chosen.top_k, chosen.top_p, chosen.min_p, chosen.seed)
    reading = PromptProgress(sys.stderr)

    prompts = []  # each generation's prompt (--check-plain reads the one answer's again)

    def generate(messages):
        prompt = chat_tokens(decoder.target, messages)
        prompts.append(prompt)
        return decoder.generate(prompt, max_tokens=chosen.max_tokens, sampling=sampling, policy=chosen.mode,
                                k=chosen.draft_length, on_prompt=reading, origin="cli")

    if document is None:
        generation = generate(build_messages(user, options.system))
        steps = (("", cycle, generation) for cycle in generation)
    else:  # in parts, then combined, when longer than the context: as the window does
        steps = DocumentSummary(decoder.target, document, chosen.max_tokens, generate, request=user)
    view = TerminalView(decoder.target, color=options.color)
    last, text, runs, stage_now, tokens = None, [], [], "", []
    try:
        for stage, cycle, generation in steps:
            if not runs or runs[-1] is not generation.stats:  # each generation (part) has its own stats
                runs.append(generation.stats)
            last = cycle
            text.append(cycle.text)
            tokens.extend(cycle.emitted)
            if options.json:
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
    if options.json:
        summary = {"type": "summary", **stats.summary(), "mode": chosen.mode, "profile": profile,
                   "finish": last.finish if last else None, "message": last.message if last else "",
                   "text": answer, "policy": last.policy.to_json() if last and last.policy else {},
                   "attention": _attention(decoder)}
        if isinstance(steps, DocumentSummary) and steps.part_summaries:
            summary["parts"] = len(steps.part_summaries)
        print(json.dumps(summary, ensure_ascii=False))
    else:
        view.summary(stats, last.finish if last else None, last.message if last else "",
                     last.policy if last else None)
    if options.check_plain and tokens:
        return _check_plain(decoder, prompts[0], tokens, options.json)
    return 0


def _check_plain(decoder, prompt: list[int], answer: list[int], as_json: bool) -> int:
    """generate --check-plain: the answer against plain decoding of its prompt (engine/plaincheck.py);
    1 where they differ."""
    from .engine.plaincheck import Outcome, check_plain

    tty = sys.stderr.isatty()

    def progress(checked: int, total: int) -> None:
        if tty:
            sys.stderr.write(f"\rChecking against plain decoding… {checked:,} / {total:,} tokens\x1b[K")
            sys.stderr.flush()

    result = check_plain(decoder, prompt, answer, progress)
    if tty:
        sys.stderr.write("\r\x1b[K")
    if as_json:
        print(json.dumps({"type": "check_plain", **result.to_json()}, ensure_ascii=False))
    else:
        print(result.words())
    return 1 if result.outcome == Outcome.DIFFERS else 0


def cmd_bench(options: BenchOptions) -> int:
    from .bench import load_prompts, print_table, run_bench

    prompts = load_prompts(options.prompts)
    decoder, profile = _load(options.models)
    info: dict = {}
    results = run_bench(decoder, prompts, list(options.modes), max_tokens=options.max_tokens, repeat=options.repeat,
                        k=options.draft_length, progress=sys.stderr, info=info, remember=options.remember)
    info["flash_attn"] = {True: "on", False: "off"}.get(decoder.target.flash_attn, "auto")  # the target's
    info["attention"] = _attention(decoder)
    if options.json:
        print(json.dumps({"results": results, "profile": profile, **info}, indent=1))
    else:
        print_table(results, sys.stdout, info)
    return 0


def cmd_tune(options: TuneOptions) -> int:
    """Time the target's verification passes with ggml's tiled matmul on and off, in child
    processes; the faster setting is remembered for this machine (engine/llama/tuning.py)."""
    from .engine.llama import tuning
    from .engine.llama.native import default_threads

    threads = options.threads or default_threads()
    if options.child:  # one setting, from the environment: the passes' seconds as JSON
        print(json.dumps(tuning.time_passes(options.target, threads)))
        return 0
    print("speculum: timing verification passes with the tiled matmul on and off (about a minute)…",
          file=sys.stderr)
    passes = tuning.measure(options.target, threads, lambda: False)
    if passes is None:
        raise SpeculumError(f"The measurement failed: the model could not be timed ({options.target}).")
    entry = tuning.remember_passes(options.target, passes)
    print(json.dumps(entry, indent=1))
    from .engine.llama.cpu_settings import tiled_environment

    setting = " ".join(f"{k}={v}" for k, v in tiled_environment(entry["tiled"]).items())
    print(f"speculum: the tiled matmul {'in' if entry['tiled'] == '1' else 'not in'} verification passes, "
          f"{setting} from the next start ({entry['decided_by']})", file=sys.stderr)
    return 0


def cmd_doctor(options: DoctorOptions) -> int:
    from . import qtcheck
    from .engine.llama import contention, cpu_settings, native, profiles

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
        ("Threads", contention.describe(native.default_threads())),
        ("Thread wait", _thread_wait(cpu_settings.in_effect())),
        ("Tiled matmul", _tiled_matmul(cpu_settings.in_effect())),
        ("Exact speculation", _row_invariance(cpu_settings.in_effect(), cpu_settings.build_has_row_switch(), gpu)),
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


def _row_invariance(setting: dict, built: bool, gpu: str | None) -> str:
    """The doctor's line on whether speculative output is plain decoding's, bit for bit."""
    from .engine.llama import cpu_settings

    if not built:
        return ("not in this llama.cpp build (no row-invariance switch): a verify pass may compute a row "
                "unlike a single step, so at a near tie speculative output can part from plain decoding; "
                "bash scripts/setup-env.sh builds it with the switch")
    on = cpu_settings.rows_invariant_asked(setting)
    where = (f"; on {gpu} the GPU's kernels are not covered by the switch (unmeasured)" if gpu else "")
    state = ("on: every row computed by one kernel whatever its pass, so speculative output equals "
             "plain decoding token for token (speculum --self-test checks it on a model)" if on else
             "off: prompts read a little faster (8% on the demo target), but at a near tie speculative "
             "output can part from plain decoding; --exact turns it on")
    return f"{state} ({cpu_settings.ROW_INVARIANT}={setting.get(cpu_settings.ROW_INVARIANT)}, " \
           f"set by {setting.get('invariant_source')}){where}"


# How long a server whose models failed to load still answers /health (why) before it exits.
LOAD_FAILED_LINGER_S = 3.0


def cmd_serve(command: ServeCommand) -> int:
    """An OpenAI-compatible API over the loaded pair, until Ctrl-C. It listens first: /health
    says loading (and requests get 503 model_loading) until the models are in."""
    from .engine.policy.fixed import FixedPolicy
    from .models.gguf import check_gguf_file
    from .server.serving import serve

    models, options = command.models, command.serving
    # What the files' headers tell is said at once, before anything listens: a wrong path, a mode they cannot run.
    target = check_gguf_file(models.target)
    draft = check_gguf_file(models.draft) if models.draft else None
    if options.mode in (Mode.DRAFT, Mode.MTP):
        FixedPolicy.for_mode(options.mode, None, has_draft_model=draft is not None,
                             has_mtp=target.nextn_layers > 0 or bool(draft and draft.assistant_for))
    # Under --rpc a lost worker ends the request, not the server: the models load again once it is back.
    serving = serve(options, workers=models.load.rpc, reload=lambda: _load(models)[0])
    failed = threading.Event()
    loading = threading.Thread(target=_load_served, args=(models, serving, failed), name="speculum-load",
                               daemon=True)
    loading.start()
    print(f"Listening at {serving.url}; loading {options.model_id}", file=sys.stderr, flush=True)
    try:
        serving.run()
    finally:  # (Ctrl-C: uvicorn raises it again once it has shut down)
        loading.join(10)  # a load still running sees the server stopping at its next tensor and cancels
    return 1 if failed.is_set() else 0


def _load_served(models: ModelOptions, serving: Serving, failed: threading.Event) -> None:
    """Load the pair for a server already listening; a failure is said on /health for a
    moment, then the server exits (the process ends non-zero)."""
    import time

    served = serving.served

    def progress(role: Role, fraction: float) -> bool:
        served.loading(f"Loading the {role} model: {fraction:.0%}.")
        return not serving.stopping  # Ctrl-C while loading cancels the load

    try:
        decoder, _ = _load(models, progress)
        decoder.policy_for(served.mode)  # a mode these models cannot run (mtp without NextN layers) stops here
    except BaseException as exc:  # noqa: BLE001 - said in words; the server must not stay up without models
        if serving.stopping:
            return
        message = str(exc) if isinstance(exc, SpeculumError) else f"Loading failed: {exc!r}"
        served.load_failed(message)
        failed.set()
        print(f"speculum: {message}", file=sys.stderr, flush=True)
        time.sleep(LOAD_FAILED_LINGER_S)
        serving.stop()
        return
    if models.load.rpc:
        from .engine.rpc import client as rpc

        rpc.on_worker_lost(served.worker_lost)
    served.loaded(decoder)  # answered at once: auto mode measures this machine's costs in idle moments
    print(f"Serving {served.model_id} ({served.mode} mode) at {serving.url}", file=sys.stderr, flush=True)
    from .server.idle import IdleMeasuring

    IdleMeasuring(served, served.mode, lambda: serving.stopping).start()


def cmd_rpc_worker(options: RpcWorkerOptions) -> int:
    from .engine.rpc.address import check_port
    from .rpc_worker import run

    return run(options.host, check_port(options.port, "--port"), options.threads, options.cache_dir, options.insecure,
               options.new_pairing, options.exact)


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

    on = cpu_settings.tiled_in_passes(setting)
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
    state = "on" if on else "prompt chunks only" if cpu_settings.tiled_matmul_on(setting) else "off"
    values = ", ".join(f"{name}={setting[name]}" for name in (cpu_settings.TILED_MATMUL, cpu_settings.TILED_MIN_ROWS)
                       if setting.get(name) is not None)
    return f"{state} ({values}, set by {setting.get('tiled_source')}){why}"


def cmd_gui(options: WindowOptions) -> int:
    from . import qtcheck

    problem = qtcheck.problem()
    if problem:
        print(f"speculum: {problem}", file=sys.stderr)
        return 2
    from .ui.app import run_app

    return run_app()


def cmd_self_test(options: SelfTestOptions) -> int:
    from .selftest import self_test

    return self_test(options.model)


# Each subcommand's options, and what runs them.
COMMANDS = {
    WindowOptions: cmd_gui, SelfTestOptions: cmd_self_test, GenerateOptions: cmd_generate, BenchOptions: cmd_bench,
    TuneOptions: cmd_tune, ServeCommand: cmd_serve, DoctorOptions: cmd_doctor, RpcWorkerOptions: cmd_rpc_worker,
    ModelsList: models_commands.cmd_list, ModelsDownload: models_commands.cmd_download,
    ModelsCheck: models_commands.cmd_check, ModelsAdd: models_commands.cmd_add,
    ModelsRemove: models_commands.cmd_remove, ModelsInstallDemo: models_commands.cmd_install_demo,
}


def run(options: Options) -> int:
    return COMMANDS[type(options)](options)


def main(argv: list[str] | None = None) -> int:
    try:
        return run(parse(argv))
    except SpeculumError as exc:
        print(f"speculum: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # Ctrl-C: the end the user asked for, not a fault to show
        return 130


if __name__ == "__main__":
    sys.exit(main())
