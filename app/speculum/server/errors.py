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


class WorkerUnreachable(SpeculumError):
    """The RPC worker holding the target's layers was lost and is not back: this request ends (503),
    the server stays. (``protocol.WorkerLost`` is the event that tells the window so.)"""


# --- Anthropic's error shape, for the routes of its Messages API ---------------------------------------

ANTHROPIC_PATHS = "/v1/messages"  # /v1/messages and everything under it answer in Anthropic's shape
_ANTHROPIC_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    503: "overloaded_error", 529: "overloaded_error"}


def shaped_for(path: str, status: int, body: dict) -> dict:
    """An error body in OpenAI's shape, reshaped for the API ``path`` belongs to: Anthropic's
    ``{"type": "error", "error": {"type", "message"}}`` under /v1/messages, else as it is."""
    if not (path == ANTHROPIC_PATHS or path.startswith(ANTHROPIC_PATHS + "/")):
        return body
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    kind = _ANTHROPIC_KINDS.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": str(error.get("message", ""))}}
