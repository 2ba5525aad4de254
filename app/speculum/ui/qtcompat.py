"""A work-around for PySide6/shiboken6 6.12.0 on Python 3.11 and older.

That build returns ``None`` from every void method (``setText``, ``show``, ``update``…)
and ``True`` from ``Signal.emit()`` without taking a reference, as if they were
immortal, which they are only from Python 3.12 on. Each call then drops one reference
the program never gave, and after some thousands of calls the interpreter frees
``None`` or ``True`` and aborts ("Fatal Python error: none_dealloc"). When a probe
at import shows the bug, ``None``, ``True`` and ``False`` get a reference count so
large that no run can exhaust it: the immortality Python 3.12 gives them.
"""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, Signal

_MARGIN = 1 << 48


class _Probe(QObject):
    fired = Signal()


def _calls_drop_references() -> bool:
    probe = _Probe()
    none, true = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(32):
        probe.setObjectName("probe")  # a void method
        probe.fired.emit()
    return none - sys.getrefcount(None) >= 32 or true - sys.getrefcount(True) >= 32


def _immortalise(obj) -> None:
    ctypes.c_ssize_t.from_address(id(obj)).value += _MARGIN


BROKEN_REFCOUNTS = sys.version_info < (3, 12) and _calls_drop_references()
if BROKEN_REFCOUNTS:
    for _singleton in (None, True, False):
        _immortalise(_singleton)
