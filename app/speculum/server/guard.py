"""What a request must show before the API does any work for it.

A server on 127.0.0.1 is reachable from every web page the user opens: a browser sends a
cross-site ``POST`` with ``Content-Type: text/plain`` without asking first, and DNS rebinding
lets a page on another site read the answers under its own host name. So, before routing:

- on a loopback bind, the ``Host`` must be a loopback name or address (``localhost``,
  ``*.localhost``, 127.0.0.0/8, ``[::1]``, or the bound address): a rebound name is not;
- a browser's ``Origin`` must be the server's own (under any loopback name, on its port) or one
  the user allowed (``--cors-origin``), and a cross-site request that hides its origin
  (``Sec-Fetch-Site``) is refused;
- a ``POST`` must say ``Content-Type: application/json``: a browser cannot send that
  cross-site without a preflight, which is answered per the same origins.

Each refusal is an answer in the error shape of the API asked (OpenAI's, Anthropic's), sent before
the body is read.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Iterable
from urllib.parse import urlsplit

from .errors import shaped_for

ALLOWED_METHODS = "GET, POST, OPTIONS"
PREFLIGHT_MAX_AGE_S = 600


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port or IPv6 brackets, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header[1:]
    if header.count(":") == 1:
        header = header.split(":", 1)[0]
    return header.rstrip(".")


def is_loopback(name: str) -> bool:
    """A name or address that can only mean this machine."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Guard:
    """ASGI middleware: refuses foreign hosts, foreign origins and non-JSON posts before any work."""

    def __init__(self, app, bind_host: str | None = "127.0.0.1", cors_origins: Iterable[str] = ()):
        self.app = app
        bound = host_name(bind_host) if bind_host else ""
        # Host names are checked where the bind is loopback: elsewhere the API key guards.
        self.check_host = not bound or is_loopback(bound)
        self.bound = bound
        origins = [o.strip().rstrip("/") for o in cors_origins if o and o.strip()]
        self.any_origin = "*" in origins
        self.origins = {o.lower() for o in origins if o != "*"}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, body = refusal
            return await _answer(send, status, shaped_for(scope["path"], status, body))  # (each API its own shape)
        origin = headers.get("origin")
        cross_site = origin is not None and origin.rstrip("/").lower() != self._own_origin(scope, headers)
        if scope["method"] == "OPTIONS":
            return await _answer(send, 204, None, self._preflight_headers(origin, headers))
        if not cross_site:
            return await self.app(scope, receive, send)

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + [
                    (b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]}
            await send(message)
        return await self.app(scope, receive, send_with_cors)

    def _refusal(self, scope, headers: dict) -> tuple[int, dict] | None:
        """The answer that ends this request here, or None to let it through."""
        host = headers.get("host")
        if self.check_host and host is not None and not self._host_allowed(host):
            return 403, _error(f"The host name '{host[:100]}' is not this machine's: a server on a loopback "
                               "address answers only to localhost, 127.0.0.1 or [::1].", "forbidden_host")
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, scope, headers):
            return 403, _error(f"Requests from the web page at '{origin[:100]}' are not allowed; "
                               "speculum serve --cors-origin ORIGIN allows a page.", "forbidden_origin")
        if origin is None and headers.get("sec-fetch-site") in ("cross-site", "same-site") and not self.any_origin:
            return 403, _error("Requests from other web sites are not allowed.", "forbidden_origin")
        if scope["method"] == "POST":
            media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                return 415, _error("The request body must be JSON, sent with 'Content-Type: application/json'.",
                                   "unsupported_media_type")
        return None

    def _host_allowed(self, host: str) -> bool:
        name = host_name(host)
        return is_loopback(name) or (bool(self.bound) and name == self.bound)

    def _own_origin(self, scope, headers: dict) -> str:
        return f"{scope.get('scheme', 'http')}://{headers.get('host', '')}".lower()

    def _origin_allowed(self, origin: str, scope, headers: dict) -> bool:
        origin = origin.rstrip("/").lower()
        return (self.any_origin or origin in self.origins or origin == self._own_origin(scope, headers)
                or self._same_server(origin, scope))

    def _same_server(self, origin: str, scope) -> bool:
        """A page from this very server under another loopback name (localhost for 127.0.0.1)."""
        try:
            url = urlsplit(origin)
            port = url.port or {"http": 80, "https": 443}.get(url.scheme)
        except ValueError:
            return False
        server_port = (scope.get("server") or (None, None))[1]
        return self.check_host and bool(url.hostname) and is_loopback(url.hostname) and port == server_port

    def _preflight_headers(self, origin: str | None, headers: dict) -> dict:
        answer = {"allow": ALLOWED_METHODS}
        if origin is not None:  # already checked: an origin allowed to call
            answer.update({"access-control-allow-origin": origin, "vary": "Origin",
                           "access-control-allow-methods": ALLOWED_METHODS,
                           "access-control-max-age": str(PREFLIGHT_MAX_AGE_S)})
            asked = headers.get("access-control-request-headers")
            if asked:
                answer["access-control-allow-headers"] = asked
        return answer


def _error(message: str, code: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


async def _answer(send, status: int, body: dict | None, headers: dict | None = None) -> None:
    payload = json.dumps(body).encode() if body is not None else b""
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    if body is not None:
        raw += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
