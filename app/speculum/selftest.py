"""`speculum --self-test MODEL.gguf`: does this install (or bundle) run models, exactly?

It imports every speculum module outside the window (a bundle missing a module fails
here, not in front of a user), loads the model on this build's backend, generates
greedily in plain mode and in speculative prompt-lookup mode, and requires the two to
agree token for token: greedy speculative decoding must not change the output.

One allowance, from design.md: llama.cpp's logits depend slightly on how many tokens
share a batch (up to ~0.5 measured on CPU), so a model can flip at a numerical tie. A
difference passes only when it is proven to be one: at the first differing position the
speculative token is the plain run's runner-up and the two logits, re-measured along
the plain run's exact path, are closer than that noise. It runs as the app does: on the
CPU the target has no flash attention (engine/llama/cpu_settings.py), and then even SmolLM2
Q4_1, bit-identical across batch shapes with it, can meet such a tie.

No Qt import: this runs on machines without a screen, and before the window is trusted.
"""

from __future__ import annotations

import importlib
import pkgutil
import platform
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, TextIO

import speculum

from . import __version__
from .engine.exactness import RowCheck, check_rows
from .engine.vocabulary import Device, Mode
from .errors import SpeculumError
from .models.gguf import check_gguf_file

# Asks the model to copy: greedy small models then repeat n-grams of the prompt, which is
# what prompt lookup drafts from, so the speculative run really verifies multi-token drafts.
PROMPT = ("Copy this list exactly, one item per line, and nothing else: apple, banana, cherry, "
          "date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine, orange, papaya.")
MAX_TOKENS = 64
N_CTX = 1024
ROW_CHECK_PASS = 4  # rows of the pass compared with single steps

# Largest logit difference measured between batch shapes on CPU (design.md, "Numerics").
TIE_MARGIN = 0.5

# Modules never imported here: the window (Qt) and anything run as a program.
_SKIP = ("speculum.ui", "speculum.__main__")

IDENTICAL, TIE, MISMATCH = "identical", "numerical tie", "mismatch"


@dataclass
class Run:
    mode: Mode
    tokens: list[int]
    text: str
    tokens_per_s: float
    drafted: int = 0
    accepted: int = 0


@dataclass
class Verdict:
    kind: str  # IDENTICAL, TIE or MISMATCH
    position: int | None = None  # first differing token, None when identical
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.kind in (IDENTICAL, TIE)


@dataclass
class SelfTestResult:
    model: str
    backend: str  # where the model's layers run: CPU, CUDA, Metal, ...
    gpu_layers: int
    build_gpu: str | None  # GPU backend this llama.cpp was built with, None for CPU-only
    modules: list[str]
    plain: Run
    speculative: Run
    verdict: Verdict
    notes: list[str] = field(default_factory=list)
    device: Device = Device.CPU  # where the layers run (``backend`` is its label)
    rows: RowCheck | None = None  # a 4-row pass against 4 single steps (engine/exactness.py)

    @property
    def passed(self) -> bool:
        return self.verdict.passed and bool(self.plain.tokens)


def speculum_modules() -> list[str]:
    """Import every speculum module except the window's; return their names.

    Inside a bundle this proves PyInstaller collected them (and what they import).
    """
    names: list[str] = []

    def walk(path: Sequence[str], prefix: str) -> None:
        for info in sorted(pkgutil.iter_modules(path, prefix), key=lambda i: i.name):
            if info.name.startswith(_SKIP):
                continue
            module = importlib.import_module(info.name)
            names.append(info.name)
            if info.ispkg:
                walk(module.__path__, info.name + ".")

    walk(speculum.__path__, "speculum.")
    return names


def compare(plain: Sequence[int], speculative: Sequence[int],
            reference_logits: Callable[[int], "object"]) -> Verdict:
    """Identical, a proven numerical tie, or a mismatch.

    ``reference_logits(i)`` gives the plain run's logits row at generated position i;
    it is called only when the outputs differ.
    """
    import numpy as np

    n = min(len(plain), len(speculative))
    i = next((j for j in range(n) if plain[j] != speculative[j]), None)
    if i is None:
        if len(plain) == len(speculative):
            return Verdict(IDENTICAL)
        return Verdict(MISMATCH, n, f"one output stops after {n} tokens, the other has "
                                    f"{max(len(plain), len(speculative))}")
    row = np.asarray(reference_logits(i), dtype=np.float64)
    want, got = plain[i], speculative[i]
    order = np.argsort(row)[::-1]
    gap = float(row[want] - row[got])
    detail = (f"token {i}: plain {want} (logit {row[want]:.3f}), speculative {got} "
              f"(logit {row[got]:.3f}), gap {gap:.3f}")
    if int(order[0]) == want and int(order[1]) == got and gap < TIE_MARGIN:
        return Verdict(TIE, i, detail + f" < {TIE_MARGIN}: the two best tokens tie within batch-shape noise")
    return Verdict(MISMATCH, i, detail)


def _generate(decoder, prompt: list[int], mode: Mode) -> Run:
    tokens: list[int] = []
    text: list[str] = []
    generation = decoder.generate(prompt, max_tokens=MAX_TOKENS, policy=mode)
    for cycle in generation:
        tokens.extend(cycle.emitted)
        text.append(cycle.text)
    stats = generation.stats
    return Run(mode, tokens, "".join(text), stats.tokens_per_s, stats.drafted, stats.accepted)


def _replay_plain(target, prompt: list[int], plain: list[int]) -> Callable[[int], object]:
    """Logits at position i of the plain run, recomputed along its exact batch shapes.

    The plain run (a fresh decoder, nothing cached) decoded the whole prompt in n_batch
    chunks, its last token in the last chunk, whose last row gave token 0; then one token
    per pass. Doing the same reproduces its logits bit for bit. (Replaying the last token
    in a pass of its own is another batch shape: on some CPUs it flips a near tie.)
    """
    def logits_at(i: int):
        target.reset()
        starts = range(0, len(prompt), target.n_batch)
        row = None
        for start in starts:
            part = prompt[start:start + target.n_batch]
            final = start == starts[-1]
            row = target.decode(part, rows=(len(part) - 1,) if final else ())
        for token in plain[:i]:
            row = target.decode([token])
        return row[0].copy()

    return logits_at


def run_self_test(model_path: str | Path) -> SelfTestResult:
    """Load, generate twice, compare. Raises SpeculumError for a missing or bad model."""
    from .engine.llama.native import gpu_backend
    from .engine.loading import load_decoder
    from .engine.settings import LoadOptions

    modules = speculum_modules()
    path = Path(model_path).expanduser()
    decoder = load_decoder(path, None, LoadOptions(n_ctx=N_CTX))
    target = decoder.target
    try:
        prompt = target.tokenize(target.apply_chat_template([{"role": "user", "content": PROMPT}]))
        plain = _generate(decoder, prompt, Mode.OFF)
        speculative = _generate(decoder, prompt, Mode.LOOKUP)
        # Last: replaying moves the KV cache under the decoder, which is not used after this.
        verdict = compare(plain.tokens, speculative.tokens, _replay_plain(target, prompt, plain.tokens))
        rows = check_rows(target, prompt[:-1], (prompt[-1:] + plain.tokens)[:ROW_CHECK_PASS])
        notes = []
        if speculative.drafted == 0:
            notes.append("prompt lookup found nothing to draft, so only plain decoding was exercised")
        facts = target.facts
        return SelfTestResult(
            model=path.name, backend=facts.backend, gpu_layers=facts.n_gpu_layers,
            build_gpu=gpu_backend(), modules=modules, plain=plain, speculative=speculative,
            verdict=verdict, notes=notes, device=facts.device, rows=rows,
        )
    finally:
        target.close()


def _rate(run: Run) -> str:
    line = f"{len(run.tokens):>4} tokens  {run.tokens_per_s:8.1f} tok/s"
    if run.drafted:
        line += f"  (drafted {run.drafted}, accepted {run.accepted}, {run.accepted / run.drafted:.0%})"
    return line


def _rows(check: RowCheck) -> str:
    if check.invariant:
        return (f"pass-size invariant: a {check.pass_size}-row pass equals {check.pass_size} single steps bit "
                f"for bit, so speculative output is plain decoding's token for token")
    return (f"not pass-size invariant: {check.identical} of {check.pass_size} rows of a {check.pass_size}-row pass "
            f"equal their single steps (up to {check.max_difference:.3g} apart), so at a near tie speculative "
            f"output can part from plain decoding (--exact, where this build has the switch)")


def report(result: SelfTestResult, out: TextIO) -> None:
    layers = "all layers" if result.gpu_layers >= 10**6 else f"{result.gpu_layers} layers"
    where = "CPU" if result.device == Device.CPU else f"{result.backend} ({layers} on the GPU)"
    print(f"model      {result.model}", file=out)
    print(f"build      llama.cpp with {result.build_gpu or 'CPU only'}", file=out)
    print(f"backend    {where}", file=out)
    print(f"modules    {len(result.modules)} speculum modules import", file=out)
    print(f"plain      {_rate(result.plain)}", file=out)
    print(f"lookup     {_rate(result.speculative)}", file=out)
    if result.rows is not None:
        print(f"rows       {_rows(result.rows)}", file=out)
    for note in result.notes:
        print(f"note       {note}", file=out)
    v = result.verdict
    if not result.plain.tokens:
        print("FAIL: the model generated no tokens.", file=out)
    elif v.kind == IDENTICAL:
        print(f"PASS: speculative output equals plain output, {len(result.plain.tokens)} tokens.", file=out)
    elif v.kind == TIE:
        print(f"PASS: outputs agree up to a numerical tie at {v.detail}.", file=out)
    else:
        print(f"FAIL: speculative output differs from plain output at {v.detail}.", file=out)


def self_test(model_path: str | Path, out: TextIO | None = None) -> int:
    """The CLI's --self-test: 0 on success, 1 on failure; SpeculumError (exit 2) for a bad model."""
    out = out or sys.stdout
    check_gguf_file(Path(model_path).expanduser())  # a missing or foreign file: one line, exit 2
    where = "bundle" if getattr(sys, "frozen", False) else "installed"  # platform: a bundled app
    print(f"Speculum {__version__} self-test ({where}; Python {platform.python_version()}, "
          f"{platform.system()} {platform.machine()})", file=out)
    try:
        # Importing the engine loads llama.cpp's shared library: part of what is tested.
        from .engine.llama.native import llama_cpp_version

        print(f"llama.cpp  llama-cpp-python {llama_cpp_version()}", file=out)
        result = run_self_test(model_path)
    except SpeculumError:
        raise
    except Exception as exc:  # a broken install: say so plainly, keep the traceback for a report
        traceback.print_exc()
        print(f"FAIL: {type(exc).__name__}: {exc}", file=out)
        return 1
    report(result, out)
    out.flush()
    return 0 if result.passed else 1
