"""Auto mode: placeholder until the measured cost model lands (plain decoding)."""

from __future__ import annotations

from .policy import FixedPolicy


class AutoPolicy(FixedPolicy):
    @classmethod
    def for_decoder(cls, decoder) -> "AutoPolicy":
        return cls("off", 0)
