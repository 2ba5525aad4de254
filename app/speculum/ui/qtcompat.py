"""A work-around for PySide6 6.12.0: ``SignalInstance.emit()`` returns ``True`` without a reference.

Each Python-side ``emit`` then takes one reference from ``True`` that it never gave, and
after a few thousand emits (one per generated cycle here) the interpreter frees ``True``
and aborts ("Fatal Python error: bool_dealloc"). ``emit`` below gives the reference
back, only when a probe at import shows this build has the bug.
"""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, Signal

_incref = ctypes.pythonapi.Py_IncRef
_incref.argtypes = [ctypes.py_object]
_incref.restype = None


class _Probe(QObject):
    fired = Signal()


def _emit_steals_a_reference() -> bool:
    probe = _Probe()
    before = sys.getrefcount(True)
    for _ in range(16):
        probe.fired.emit()
    lost = before - sys.getrefcount(True)
    for _ in range(max(lost, 0)):
        _incref(True)  # repay what the probe itself took
    return lost >= 16


EMIT_STEALS = _emit_steals_a_reference()


def emit(signal, *args):
    """``signal.emit(*args)``, safe on PySide6 builds whose emit under-counts its result."""
    result = signal.emit(*args)
    if EMIT_STEALS:
        _incref(result)
    return result
