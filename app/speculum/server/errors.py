"""What the server answers a request with instead of an answer: the API turns these into
OpenAI's error shape (400 with the parameter named, 429 with Retry-After)."""

from __future__ import annotations

from ..errors import SpeculumError


class Busy(SpeculumError):
    """Too many requests are waiting; ``retry_after`` seconds is a fair guess."""

    def __init__(self, waiting: int, retry_after: int):
        super().__init__(f"The server is busy: {waiting} requests are waiting for the model. Retry shortly.")
        self.retry_after = retry_after


class BadRequest(SpeculumError):
    """A request the model cannot run as given (the prompt does not fit, ...)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


class WorkerLost(SpeculumError):
    """An RPC worker holding the target's layers was lost: this request ends (503), the server stays."""
