"""The code's own shape, as the project's standards ask: no function over 80 lines in app/."""

from __future__ import annotations

import ast
from pathlib import Path

import speculum

PACKAGE = Path(speculum.__file__).parent
LONGEST = 80
# Owned and being split elsewhere: the API's app factory, and the widgets (ui/worker.py excepted).
ELSEWHERE = {("server/api.py", "create_app")}


def _long_functions() -> list[str]:
    found = []
    for file in sorted(PACKAGE.rglob("*.py")):
        where = file.relative_to(PACKAGE).as_posix()
        if where.startswith("ui/") and where != "ui/worker.py":
            continue
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (where, node.name) not in ELSEWHERE:
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST:
                    found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_80_lines():
    assert _long_functions() == []
