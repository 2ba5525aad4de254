"""Saved records read back with their types checked: settings, conversations, cycles.

A file written by another version, a crash or a hand edit can hold anything JSON can say.
Each field is checked against the dataclass's own annotation; a field of the wrong type is
reported in plain words, never passed on to code that would fail on it later.
"""

from __future__ import annotations

import enum
import math
import types
import typing
from functools import lru_cache


class RecordError(ValueError):
    """A saved record whose fields have the wrong types."""


@lru_cache(maxsize=None)
def field_types(cls) -> dict:
    """A dataclass's field annotations as types (they are strings under ``from __future__``)."""
    return typing.get_type_hints(cls)


def _kind(value) -> str:
    return "null" if value is None else {"str": "text", "bool": "true/false", "int": "a number",
                                         "float": "a number", "list": "a list", "dict": "an object"}.get(
        type(value).__name__, type(value).__name__)


def checked(value, hint):
    """``value`` as the annotation ``hint`` wants it (an int where a float belongs becomes a float);
    raises RecordError when it is of another type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return checked(value, option)
            except RecordError:
                continue
        raise RecordError(f"{_kind(value)}")
    if hint is type(None):
        if value is None:
            return None
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise RecordError("an infinite or undefined number")
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        if isinstance(value, str):
            try:
                return hint(value)
            except ValueError:
                return value  # a word a newer version wrote (a drafter this one lacks): kept as text
    elif hint is list or origin is list:
        if isinstance(value, list):
            try:
                return [checked(v, args[0]) for v in value] if args else value
            except RecordError as exc:
                raise RecordError(f"a list holding {exc}") from None
    elif hint is dict or origin is dict:
        if isinstance(value, dict):
            if not args:
                return value
            try:
                return {checked(k, args[0]): checked(v, args[1]) for k, v in value.items()}
            except RecordError as exc:
                raise RecordError(f"an object holding {exc}") from None
    else:
        raise TypeError(f"no check for {hint!r}")
    raise RecordError(_kind(value))


def typed_fields(cls, data: dict) -> tuple[dict, list[str]]:
    """The fields of dataclass ``cls`` present in ``data`` with the right types, and a plain
    description of each one that had another type (left out). Unknown keys are ignored."""
    kept, problems = {}, []
    for name, hint in field_types(cls).items():
        if name not in data or name not in cls.__dataclass_fields__:
            continue
        try:
            kept[name] = checked(data[name], hint)
        except RecordError as exc:
            problems.append(f"'{name}' was {exc}")
    return kept, problems


def zero(hint):
    """The empty value of a type, for a field a record written by an older version lacks."""
    origin = typing.get_origin(hint) or hint
    if origin in (typing.Union, types.UnionType):
        return None
    return {int: 0, float: 0.0, str: "", bool: False, list: [], dict: {}}.get(origin)
