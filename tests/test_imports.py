"""The package's import graph: every module imports alone, and no two modules need each other.

An import circle holds together only while the imports inside functions run late enough;
the first caller that imports the modules in another order finds a half-made module.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import speculum

PACKAGE = Path(speculum.__file__).parent


def _modules() -> dict[str, Path]:
    modules = {}
    for file in sorted(PACKAGE.rglob("*.py")):
        parts = list(file.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = file
    return modules


def _imports(name: str, file: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in it, inside functions too."""
    package = name.split(".") if file.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            origin = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # "from . import x" names a module; "from .x import y" a name in one
                found.add(f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, file, modules) for name, file in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, as the path round it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_circle_and_passes_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_module_of_the_package_imports_itself_round_a_circle():
    graph = import_graph()
    assert "speculum.engine.llama.native" in graph["speculum.engine.llama.model"]  # the reader sees deferred imports too
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


LLAMA_ROOM = "speculum.engine.llama."


def _importers_of(library: str) -> list[str]:
    """The package's modules that import ``library`` (or a module of it) anywhere in them."""
    def names(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        return [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []

    return [name for name, file in _modules().items()
            if any(n == library or n.startswith(library + ".")
                   for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))) for n in names(node))]


def test_only_the_llama_room_loads_llama_cpp_and_there_only_through_its_gate():
    """llama.cpp is the engine/llama room's business, and inside it native is the gate: it sets
    the CPU settings before it imports llama_cpp. Anything else that needs llama.cpp asks the room."""
    importers = _importers_of("llama_cpp")
    assert [name for name in importers if not name.startswith(LLAMA_ROOM)] == []
    assert importers == ["speculum.engine.llama.native"]


def test_the_import_finder_sees_plain_and_dotted_imports():
    assert "speculum.engine.llama.native" in _importers_of("llama_cpp")
    assert "speculum.ui.app" in _importers_of("PySide6")  # "from PySide6.QtWidgets import ..."


def test_every_module_imports_alone_in_a_fresh_interpreter():
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}

    def alone(name: str) -> tuple[str, str]:
        done = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True,
                              env=env, timeout=300)
        return name, done.stderr.strip().splitlines()[-1] if done.returncode else ""

    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = {name: why for name, why in pool.map(alone, sorted(_modules())) if why}
    assert not failed, failed
