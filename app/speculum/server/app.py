"""The application `speculum serve` runs: OpenAI's routes (api), Anthropic's Messages (anthropic)
and OpenAI's Responses (responses) over one served model, behind the guard (guard)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from . import responses
from .anthropic import Messages
from .api import Api, failed, not_found
from .guard import Guard
from .service import ServedModel


def create_app(served: ServedModel, api_key: str | None = None, cors_origins: list[str] | None = None,
               bind_host: str | None = "127.0.0.1") -> Starlette:
    """The API over ``served``. ``bind_host``: where it listens (on loopback, only loopback
    host names are served); ``cors_origins``: web pages allowed to call it."""
    api = Api(served, api_key)
    routes = [Route("/health", api.health, methods=["GET"]),
              Route("/v1/models", api.guarded(api.models), methods=["GET"]),
              Route("/v1/models/{model_id:path}", api.guarded(api.model), methods=["GET"]),
              Route("/v1/chat/completions", api.guarded(api.chat), methods=["POST"]),
              Route("/v1/completions", api.guarded(api.completions), methods=["POST"])]
    routes += Messages(api).routes()
    routes += responses.routes(api)
    return Starlette(routes=routes,
                     middleware=[Middleware(Guard, bind_host=bind_host, cors_origins=cors_origins or ())],
                     exception_handlers={404: not_found, 405: not_found, Exception: failed})
