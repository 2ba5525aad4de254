"""Rendering a conversation with the model's own chat template (from GGUF metadata).

Templates are Hugging Face Jinja templates; they are rendered the way transformers
renders them (sandboxed Jinja, trim_blocks, lstrip_blocks, loop controls).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import SpeculumError

# Used when a GGUF carries no template: plain, readable turns.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


class HasTemplate(Protocol):
    chat_template: str | None
    bos: int
    eos: int

    def token_text(self, token: int, special: bool = True) -> str: ...


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render_chat(model: HasTemplate, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    template = model.chat_template or FALLBACK_TEMPLATE
    try:
        return _compile(template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=model.token_text(model.bos) if model.bos >= 0 else "",
            eos_token=model.token_text(model.eos) if model.eos >= 0 else "",
        )
    except jinja2.exceptions.TemplateError as exc:
        raise SpeculumError(f"The model's chat template could not be rendered: {exc}") from None
