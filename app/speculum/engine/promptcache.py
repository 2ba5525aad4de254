"""The prompt cache: saved KV states of recent sequences, so a prompt seen before is not read again.

One model context holds one sequence. When a new prompt shares less with it than a sequence
seen earlier does (the window switching back to a conversation, an API client resending its
system prompt and document after another client's request), the live sequence is saved
(llama.cpp's ``llama_state_seq_get_data``) and the saved one with the longest common prefix is
put back (``_set_data``) and cut to that prefix: only the new tokens are decoded.

States are kept per owner (the target, the draft model) within one byte budget shared by
all; the least recently used go first, and a state larger than the whole budget is not kept.
A KV cache can be cut anywhere, so a saved state serves any prefix of its tokens; a recurrent
state (``exact``) serves only its whole length.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .vocabulary import Role

MIB = 1 << 20
# Tokens a sequence must lose before it is worth saving, and tokens a saved state must add to
# the live prefix before it is worth putting back: below these, reading them again costs less
# than the copy (and a state held for a few tokens crowds out useful ones).
MIN_SAVED = 32
MIN_GAIN = 16


def available_ram() -> int:
    """Bytes of memory free for use now (0: not known)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        if sys.platform != "win32":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    from ..models.hardware import _ram_bytes

    return _ram_bytes() // 2


def default_budget() -> int:
    """A quarter of the memory free now, between 256 MiB and 8 GiB (llama-server keeps 8 GiB)."""
    free = available_ram()
    return max(256 * MIB, min(free // 4, 8192 * MIB)) if free else 1024 * MIB


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


@dataclass(eq=False)
class SavedState:
    owner: Role
    tokens: np.ndarray  # int32: the tokens the state holds, in order
    state: object  # what the model's ``save_state`` returned (a ctypes byte array)
    size: int  # bytes, the row's included
    row: tuple[int, np.ndarray] | None = None  # (position, logits) of a prompt's last token (CachedSequence.row)


class PromptCache:
    """Saved states by owner, least recently used first, never more than ``budget`` bytes."""

    def __init__(self, budget: int | None = None):
        self.budget = default_budget() if budget is None else max(0, int(budget))
        self._states: OrderedDict[int, SavedState] = OrderedDict()  # by id, oldest use first
        self.size = 0  # bytes held
        self.version = 0  # changes whenever a state is kept or dropped

    def __len__(self) -> int:
        return len(self._states)

    def states(self, owner: Role | None = None) -> list[SavedState]:
        return [s for s in self._states.values() if owner is None or s.owner == owner]

    def save(self, owner: Role, tokens: Sequence[int], model, row: tuple[int, np.ndarray] | None = None) -> bool:
        """Keep ``model``'s live state, which holds ``tokens``, and ``row`` with it; False when it
        is not kept (already held by a longer saved state, larger than the budget, or the model
        could not save it)."""
        held = np.asarray(tokens, dtype=np.int32)
        for key, saved in list(self._states.items()):
            if saved.owner != owner:
                continue
            shared = common_prefix(saved.tokens, held)
            if shared == len(held) and len(saved.tokens) >= len(held):
                self._states.move_to_end(key)  # this state already serves every prefix of these tokens
                return False
            if shared == len(saved.tokens):  # the new state serves all this one did
                self._drop(key)
        state = model.save_state()
        size = len(state) + (row[1].nbytes if row is not None else 0) if state is not None else 0
        if state is None or size > self.budget:
            return False
        while self.size + size > self.budget:
            self._drop(next(iter(self._states)))
        saved = SavedState(owner, held, state, size, row)
        self._states[id(saved)] = saved
        self.size += size
        self.version += 1
        return True

    def best(self, owner: Role, context: Sequence[int], exact: bool = False) -> tuple[SavedState | None, int]:
        """The saved state sharing the longest prefix with ``context``, and that length. With
        ``exact`` (a recurrent state, which cannot be cut back) only states that are whole
        prefixes of ``context`` count."""
        wanted = np.asarray(context, dtype=np.int32)
        found, length = None, 0
        for saved in self._states.values():
            if saved.owner != owner:
                continue
            shared = common_prefix(saved.tokens, wanted)
            if exact and shared < len(saved.tokens):
                continue
            if shared > length:
                found, length = saved, shared
        return found, length

    def restore(self, saved: SavedState, model) -> bool:
        """Put ``saved`` back into ``model``; it becomes the most recently used."""
        ok = model.load_state(saved.state, len(saved.tokens))
        key = id(saved)
        if key in self._states:
            if ok:
                self._states.move_to_end(key)
            else:  # a state llama.cpp refuses now will not be taken later
                self._drop(key)
        return ok

    def clear(self) -> None:
        self._states.clear()
        self.size = 0
        self.version += 1

    def _drop(self, key: int) -> None:
        self.size -= self._states.pop(key).size
        self.version += 1
