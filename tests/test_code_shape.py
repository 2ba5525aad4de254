"""The code's own shape, as the project's standards ask, over all of app/: no function over 80
lines, no module over 600, no folder with more than 20 modules directly in it, no ``noqa: F401``
re-export, and no ``getattr``/``hasattr`` on the project's own objects (a library's or the
platform's attribute is asked with a ``# library:`` or ``# platform:`` comment on the line)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import speculum

PACKAGE = Path(speculum.__file__).parent
LONGEST = 80
LONGEST_MODULE = 600
MOST_MODULES = 20  # per folder, directly in it


def _long_functions() -> list[str]:
    found = []
    for file in sorted(PACKAGE.rglob("*.py")):
        where = file.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST:
                    found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_80_lines():
    assert _long_functions() == []


def _modules() -> list[tuple[str, list[str]]]:
    return [(file.relative_to(PACKAGE).as_posix(), file.read_text(encoding="utf-8").splitlines())
            for file in sorted(PACKAGE.rglob("*.py"))]


def test_no_module_is_longer_than_600_lines():
    long = [f"{where} ({len(lines)} lines)" for where, lines in _modules() if len(lines) > LONGEST_MODULE]
    assert long == []


def test_no_folder_holds_more_than_20_modules_directly():
    crowded = {}
    for folder in [PACKAGE, *(d for d in PACKAGE.rglob("*") if d.is_dir() and d.name != "__pycache__")]:
        modules = sorted(folder.glob("*.py"))
        if len(modules) > MOST_MODULES:
            crowded[folder.relative_to(PACKAGE.parent).as_posix()] = len(modules)
    assert crowded == {}


# The one unused import kept on purpose: the window's Qt fix-ups run on import, before any widget.
SIDE_EFFECT_IMPORTS = {("ui/__init__.py", "from . import qtcompat")}


def test_no_module_re_exports_what_it_does_not_use():
    """An import kept only so that an old path still works (``noqa: F401``) hides where a name
    lives; every caller imports it from its home."""
    found = [f"{where}:{i}" for where, lines in _modules() for i, line in enumerate(lines, 1)
             if "noqa: F401" in line and not any(where == w and line.startswith(s) for w, s in SIDE_EFFECT_IMPORTS)]
    assert found == []


# A call before the line's comment (which may name one).
_PROBE = re.compile(r"(?<![\w.])(getattr|hasattr)\(")
_ASKED_OF_OTHERS = re.compile(r"#.*\b(library|platform):")


def test_attributes_are_probed_only_on_libraries_and_the_platform():
    """The project's own objects declare what they have (``Drafter``, ``Backend``): code asks them
    plainly. ``getattr``/``hasattr`` stay for a library's build or the platform, and say so."""
    found = [f"{where}:{i}: {line.strip()}" for where, lines in _modules() for i, line in enumerate(lines, 1)
             if _PROBE.search(line.split("#")[0]) and not _ASKED_OF_OTHERS.search(line)]
    assert found == []


def test_the_shape_checks_find_what_they_look_for():
    assert _PROBE.search('x = getattr(args, "draft", None)') and not _PROBE.search("obj.getattr(x)")
    assert _ASKED_OF_OTHERS.search('hasattr(os, "fchmod")  # platform: not on Windows')
    assert not _ASKED_OF_OTHERS.search('getattr(drafter, "behind")  # the library of drafters')
