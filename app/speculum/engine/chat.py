"""Rendering a conversation with the model's own chat template (from GGUF metadata).

Templates are Hugging Face Jinja templates; they are rendered the way transformers
renders them (sandboxed Jinja, trim_blocks, lstrip_blocks, loop controls).

A template comes with a downloaded file, so it is code from a stranger. Jinja's sandbox
keeps it from Python's internals, but not from hanging (nested ``range(100000)`` loops)
or allocating without end (``'a' * 10**10``). Python cannot interrupt a rendering thread,
so the work itself is bounded: every loop step and call counts against a budget of steps
and seconds, operators and filters that multiply sizes check the size first, and the
output stops at a cap. Any failure is one plain sentence naming the template's model.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import string
import time
from collections.abc import Iterator, Sized
from datetime import datetime
from functools import lru_cache
from typing import Any, Iterable, Protocol, Sequence

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from ..errors import SpeculumError

# Used when a GGUF carries no template: plain, readable turns.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

# Far above what any real template needs (they loop over the messages, a few thousand steps),
# far below what would freeze the app or exhaust its memory.
MAX_STEPS = 250_000  # loop iterations, calls and items filtered in one rendering
MAX_SECONDS = 10.0
MAX_TEXT = 16 << 20  # characters in any one string, and in the whole prompt (~4M tokens)
MAX_ITEMS = 1 << 20  # items in a list a template builds
MAX_INT_BITS = 1 << 16  # integers a template computes

_STEPS = "__speculum_steps"
_CONCAT = "__speculum_concat"


class HasTemplate(Protocol):
    chat_template: str | None
    bos: int
    eos: int
    path: Any  # the file it came from (a Path), or None
    facts: Any  # its ModelFacts, or None

    def token_text(self, token: int, special: bool = True) -> str: ...


class TemplateLimit(Exception):
    """The template went past a bound; the message says which, in plain words."""


class _Budget:
    """Steps and time left to the rendering running in this context (set by ``render_chat``)."""

    def __init__(self) -> None:
        self.steps = 0
        self.next_clock = 256  # reading the clock every step would cost more than the step
        self.deadline = time.monotonic() + MAX_SECONDS

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_STEPS:
            raise TemplateLimit(f"it takes more than {MAX_STEPS:,} steps")
        if self.steps >= self.next_clock:
            self.next_clock = self.steps + 256
            if time.monotonic() > self.deadline:
                raise TemplateLimit(f"it runs longer than {MAX_SECONDS:g} seconds")


def _check_size(n: int) -> None:
    if n > MAX_TEXT:
        raise TemplateLimit(f"it builds a text of more than {MAX_TEXT:,} characters")


def _check_items(value: Any) -> Any:
    if isinstance(value, (list, tuple)) and len(value) > MAX_ITEMS:
        raise TemplateLimit(f"it builds a list of more than {MAX_ITEMS:,} items")
    if isinstance(value, (str, bytes)):
        _check_size(len(value))
    return value


def _check_width(width: Any) -> None:
    if isinstance(width, int) and width > MAX_TEXT:
        _check_size(width)


def _check_int(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise TemplateLimit(f"it computes a number of more than {MAX_INT_BITS:,} bits")
    return value


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_percent_format(fmt: str) -> None:
    for width, precision in _PERCENT_SPEC.findall(fmt):
        for n in (width, precision):
            if n == "*" or (n and int(n) > MAX_TEXT):
                raise TemplateLimit("it formats a field wider than Speculum allows")


def _check_brace_format(fmt: str) -> None:
    for _text, _field, spec, _conv in string.Formatter().parse(fmt):
        if spec and ("{" in spec or any(int(n) > MAX_TEXT for n in re.findall(r"\d+", spec))):
            raise TemplateLimit("it formats a field wider than Speculum allows")


def _product(left: Any, right: Any) -> Any:
    for seq, n in ((left, right), (right, left)):
        if isinstance(n, int) and isinstance(seq, (str, bytes)):
            _check_size(len(seq) * n)
        if isinstance(n, int) and isinstance(seq, (list, tuple)) and len(seq) * n > MAX_ITEMS:
            raise TemplateLimit(f"it builds a list of more than {MAX_ITEMS:,} items")
    if isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateLimit(f"it computes a number of more than {MAX_INT_BITS:,} bits")
    return left * right


def _power(left: Any, right: Any) -> Any:
    if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        if left.bit_length() * right > MAX_INT_BITS:
            raise TemplateLimit(f"it computes a number of more than {MAX_INT_BITS:,} bits")
    return left ** right


def _sum(left: Any, right: Any) -> Any:
    if isinstance(left, (str, bytes)) and isinstance(right, (str, bytes)):
        _check_size(len(left) + len(right))
    elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)) and len(left) + len(right) > MAX_ITEMS:
        raise TemplateLimit(f"it builds a list of more than {MAX_ITEMS:,} items")
    return left + right


def _modulo(left: Any, right: Any) -> Any:
    if isinstance(left, str):
        _check_percent_format(left)
        return _check_items(left % right)
    return left % right


_BINOPS = {"*": _product, "**": _power, "+": _sum, "%": _modulo}


def _str_method_check(method: Any, args: tuple, kwargs: dict) -> None:
    """Sizes a str method would produce, checked before it runs."""
    owner = getattr(method, "__self__", None)  # library: Jinja hands any callable
    if not isinstance(owner, str):
        return
    name = getattr(method, "__name__", "")  # library: Jinja hands any callable
    if name in ("center", "ljust", "rjust", "zfill"):
        _check_width(args[0] if args else kwargs.get("width"))
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            _check_size(owner.count("\t") * size + len(owner))
    elif name == "join" and args:
        _joined_size(owner, args[0])
    elif name == "replace" and len(args) >= 2:
        _replaced_size(owner, *args[:3])
    elif name in ("format", "format_map"):
        _check_brace_format(owner)


def _joined_size(separator: str, items: Any) -> None:
    if isinstance(items, (list, tuple)):
        _check_size(sum(len(x) for x in items if isinstance(x, str)) + len(separator) * len(items))


def _replaced_size(text: str, old: Any, new: Any, count: Any = -1) -> None:
    if isinstance(old, str) and isinstance(new, str):
        hits = len(text) + 1 if old == "" else text.count(old)
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        _check_size(len(text) + hits * max(len(new) - len(old), 0))


class _Bounded(NodeTransformer):
    """Rewrites a parsed template so each ``for`` counts its steps and each ``~`` checks its size."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = nodes.Call(nodes.Name(_STEPS, "load", lineno=node.lineno), [node.iter], [], None, None,
                               lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        return nodes.Call(nodes.Name(_CONCAT, "load", lineno=node.lineno),
                          [nodes.List(node.nodes, lineno=node.lineno)], [], None, None, lineno=node.lineno)


class _TemplateSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(_BINOPS)

    def compile(self, source, name=None, filename=None, raw=False, defer_init=False):  # noqa: D401
        if isinstance(source, str):
            source = _Bounded().visit(self.parse(source, name, filename))
        return super().compile(source, name, filename, raw, defer_init)

    def call_binop(self, context, operator_name, left, right):
        _step()
        return _BINOPS[operator_name](left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - Jinja's own signature
        _step()
        _str_method_check(getattr(__obj, "__wrapped__", __obj), args, kwargs)  # library: Jinja's callables
        result = super().call(__context, __obj, *args, **kwargs)
        return _check_int(_check_items(result))


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("chat_template_budget", default=None)


def _step(n: int = 1) -> None:
    budget = _budget.get()
    if budget is not None:
        budget.step(n)


def _steps(iterable: Any) -> Iterable:
    for item in iterable:
        _step()
        yield item


def _counted(value: Any) -> Any:
    """A filter's input, paid for: a collection by its size, an iterator item by item."""
    if isinstance(value, (str, bytes)):
        _step()
    elif isinstance(value, Sized):
        _step(len(value))
    elif isinstance(value, Iterator):
        return _steps(value)
    return value


def _paid(f):
    """Every filter (map, list, unique, sum...) pays for what it walks through and checks what it builds."""
    value_at = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0  # library: Jinja's filters

    @functools.wraps(f)  # keeps jinja_pass_arg
    def bounded(*args, **kwargs):
        if len(args) > value_at:
            args = (*args[:value_at], _counted(args[value_at]), *args[value_at + 1:])
        return _check_items(f(*args, **kwargs))
    return bounded


def _concat(items: list) -> str:
    parts = [str(x) for x in items]
    _check_size(sum(map(len, parts)))
    return "".join(parts)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    if isinstance(indent, int) and indent > 64 or isinstance(indent, str) and len(indent) > 64:
        raise TemplateLimit("it indents JSON wider than Speculum allows")
    return _check_items(json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                   sort_keys=sort_keys))


def _bounded_filters(filters: dict) -> dict:
    """Filters whose output can be far larger than their input, each checked first."""
    original = dict(filters)

    def center(value, width=80):
        _check_width(width)
        return original["center"](value, width)

    def indent(value, width=4, *args, **kwargs):
        lines = str(value).count("\n") + 1
        _check_size(len(str(value)) + lines * (len(width) if isinstance(width, str) else max(int(width), 0)))
        return original["indent"](value, width, *args, **kwargs)

    def fmt(value, *args, **kwargs):
        _check_percent_format(str(value))
        return _check_items(original["format"](value, *args, **kwargs))

    def join(eval_ctx, value, d="", attribute=None):
        value = list(value) if not isinstance(value, (list, tuple, str)) else value
        _check_items(value)
        _joined_size(str(d), [str(x) for x in value] if attribute is None else [])
        return _check_items(original["join"](eval_ctx, value, d, attribute))

    def replace(eval_ctx, value, old, new, count=None):
        _replaced_size(str(value), str(old), str(new), -1 if count is None else count)
        return original["replace"](eval_ctx, value, old, new, count)

    def wordwrap(environment, value, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
        if wrapstring is not None:
            _check_size(len(str(value)) * (len(str(wrapstring)) + 1))
        return original["wordwrap"](environment, value, width, break_long_words, wrapstring, break_on_hyphens)

    def batch(value, linecount, fill_with=None):
        if isinstance(linecount, int) and linecount > MAX_ITEMS:
            raise TemplateLimit(f"it builds a list of more than {MAX_ITEMS:,} items")
        return original["batch"](value, linecount, fill_with)

    def slice_(value, slices, fill_with=None):
        if isinstance(slices, int) and slices > MAX_ITEMS:
            raise TemplateLimit(f"it builds a list of more than {MAX_ITEMS:,} items")
        return original["slice"](value, slices, fill_with)

    join = jinja2.pass_eval_context(join)
    replace = jinja2.pass_eval_context(replace)
    wordwrap = jinja2.pass_environment(wordwrap)
    return {"center": center, "indent": indent, "format": fmt, "join": join, "replace": replace,
            "wordwrap": wordwrap, "batch": batch, "slice": slice_, "tojson": _tojson}


# Qwen2.5's templates show the call format from a Python f-string, its braces still doubled:
# ``{{"name": <function-name>, ...}}`` reaches the model as written, and with a system message of
# its own the model copies it (calls in double braces, unparsed). Shown as Qwen's later templates
# show it, with single braces.
_DOUBLED_CALL_EXAMPLE = re.compile(r'\{\{(\\"name\\": <function-name>, \\"arguments\\": <args-json-object>)\}\}')


def _repaired(template: str) -> str:
    """``template`` with known slips in what it tells the model corrected."""
    return _DOUBLED_CALL_EXAMPLE.sub(r"{\1}", template)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = _TemplateSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters.update(_bounded_filters(env.filters))
    env.filters.update({name: _paid(f) for name, f in env.filters.items()})
    env.globals[_STEPS] = _steps
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals[_CONCAT] = _concat
    return env.from_string(_repaired(template))


def template_owner(model: HasTemplate) -> str:
    """The model a template came with, for messages: its file name, as the user chose it."""
    name = model.path.name if model.path is not None else model.facts.name if model.facts is not None else None
    return " ".join(str(name).split())[:120] if name else "this model"


def _why(exc: BaseException) -> str:
    if isinstance(exc, TemplateLimit):
        return f"{exc} (Speculum's limit for a template)"
    if isinstance(exc, RecursionError):
        return "it calls itself too deeply"
    if isinstance(exc, MemoryError):
        return "it needs more memory than there is"
    if isinstance(exc, ZeroDivisionError):
        return "it divides by zero"
    text = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
    return text[:300]


def render_chat(model: HasTemplate, messages: Sequence[dict], add_generation_prompt: bool = True,
                tools: Sequence[dict] | None = None) -> str:
    """``tools``: OpenAI's tool definitions, shown by templates that have them (None: not given)."""
    template = model.chat_template or FALLBACK_TEMPLATE
    out: list[str] = []
    size = 0
    running = _budget.set(_Budget())
    try:
        stream = _compile(template).generate(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=model.token_text(model.bos) if model.bos >= 0 else "",
            eos_token=model.token_text(model.eos) if model.eos >= 0 else "",
            **({"tools": list(tools)} if tools else {}),
        )
        for piece in stream:
            size += len(piece)
            _check_size(size)
            out.append(piece)
    except Exception as exc:  # noqa: BLE001 - a stranger's template may raise anything; none may escape
        raise SpeculumError(f"The chat template of {template_owner(model)} could not be rendered: "
                            f"{_why(exc)}.") from None
    finally:
        _budget.reset(running)
    return "".join(out)


# -- the prompt's tokens: the template's scaffolding makes special tokens, a client's text never --

class Tokenizes(Protocol):
    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            **tools: Any) -> str: ...

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]: ...


_MARKER = re.compile("\ue000([0-9]+)\ue001")  # private-use characters: no template changes them


def chat_tokens(model: Tokenizes, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                add_generation_prompt: bool = True) -> list[int]:
    """The conversation rendered by the model's chat template, as tokens in which only the
    template's own text (``<|im_start|>``, ``<|im_end|>``...) makes special tokens: a message's
    ``<|im_end|>``, or a tool description's, stays text and cannot close its turn.

    Where no message holds a special token's text, that is the rendered text tokenized whole.
    Else those messages' contents (and descriptions) are rendered as markers, the rest tokenized
    with special tokens read, and each marked text tokenized as text."""
    extra = {"tools": list(tools)} if tools else {}
    marked: dict[str, str] = {}  # marker -> the text it stands for, as it is written there

    def mark(text: str, written: str) -> str:
        if not text or model.tokenize(text, parse_special=True) == model.tokenize(text, parse_special=False):
            return text
        marker = f"\ue000{len(marked)}\ue001"
        marked[marker] = written
        return marker

    messages = [{**m, "content": mark(m["content"], m["content"])} if isinstance(m.get("content"), str) else m
                for m in messages]
    if tools:  # a description within the tools' JSON: written escaped, as JSON writes it
        extra["tools"] = [_described(tool, lambda d: mark(d, json.dumps(d, ensure_ascii=False)[1:-1]))
                          for tool in tools]
    text = model.apply_chat_template(messages, add_generation_prompt, **extra)
    if not marked:
        return model.tokenize(text)
    tokens, at = [], 0
    for match in _MARKER.finditer(text):
        tokens += model.tokenize(text[at:match.start()]) if match.start() > at else []
        tokens += model.tokenize(marked.get(match.group(0), match.group(0)), parse_special=False)
        at = match.end()
    return tokens + (model.tokenize(text[at:]) if at < len(text) else [])


def _described(node: Any, mark) -> Any:
    """``node`` with every ``description`` string put through ``mark``."""
    if isinstance(node, dict):
        return {k: mark(v) if k == "description" and isinstance(v, str) else _described(v, mark)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_described(v, mark) for v in node]
    return node
