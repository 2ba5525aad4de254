"""JSON schemas and OpenAI ``response_format`` as grammars: checked (size, depth, every keyword
enforced or refused by name: ``grammar.keywords``), rewritten into what llama-cpp-python's
converter reads, and converted.

A schema is ``prepare``d on its own, its ``$defs`` hoisted under names of its own, so several
schemas (a request's tools) share one grammar and each ``#/$defs/...`` still resolves against
the schema it was written in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from . import keywords
from .patterns import MAX_COUNT, check_pattern, converter_pattern
from .state import MAX_GRAMMAR_CHARS, Grammar

# Bounds on what a client's schema may ask the grammar to spell out (a repetition is written
# out once per item): beyond them a schema is refused, not enforced at any cost.
MAX_SCHEMA_CHARS = 100_000
MAX_SCHEMA_DEPTH = 64
_COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")
_COUNT_CHARS = 24  # grammar text the converter writes per counted item, about (a rule name and brackets)
# An upper count this large is taken as no bound (Claude Code's tools give a script a maxLength of
# 524,288): written out it would be a grammar far past MAX_GRAMMAR_CHARS, and an answer that long
# would fill a local context many times. README's table says so. Counts from MAX_COUNT up to it: refused.
UNBOUNDED_FROM = 100_000
_ANY_VALUE = {"type": "value"}  # the converter's rule for any JSON value (it reads {} as any object)


# -- OpenAI response_format ------------------------------------------------------------------

def grammar_for_response_format(response_format: dict | None) -> Grammar | None:
    """The grammar that enforces an OpenAI ``response_format`` (None: free text).

    ``{"type": "text"}``: none; ``{"type": "json_object"}``: any JSON object;
    ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``:
    JSON conforming to the schema (an absent schema: any JSON object). Raises ValueError, in
    words for the client, for anything else or a schema that cannot be enforced.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ValueError("response_format must be an object.")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind != "json_schema":
        raise ValueError(f"response_format type {kind!r} is not supported; use 'text', 'json_object' or "
                         "'json_schema'.")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise ValueError("response_format json_schema must be an object holding 'name' and 'schema'.")
    schema = spec.get("schema")
    if schema is None:
        return json_object_grammar()
    if not isinstance(schema, dict):
        raise ValueError("response_format json_schema.schema must be an object (a JSON schema).")
    return schema_grammar(schema)


def json_object_grammar() -> Grammar:
    """Any JSON object (llama.cpp's json.gbnf)."""
    from ..llama import native
    return Grammar(native.json_gbnf())


# -- schemas ---------------------------------------------------------------------------------

@dataclass
class Prepared:
    """A schema as the converter reads it: its body, the definitions it refers to (to stand in
    the final root's ``$defs``), and the rules written here rather than by the converter."""
    schema: dict
    defs: dict = field(default_factory=dict)
    rules: dict[str, str] = field(default_factory=dict)  # rule name -> GBNF expression


def schema_grammar(schema: dict) -> Grammar:
    """The grammar of JSON documents that conform to ``schema`` (ValueError, naming the keyword and
    its place, for what cannot be enforced)."""
    return Grammar(schema_gbnf(schema))


def schema_gbnf(schema: dict) -> str:
    """The GBNF of JSON documents that conform to ``schema``."""
    prepared = prepare(schema, "", "s")
    return convert({**prepared.schema, "$defs": prepared.defs}, prepared.rules)


def prepare(schema, where: str, prefix: str) -> Prepared:
    """``schema`` checked and rewritten (``where``: its place, for messages; ``prefix``: a name
    its definitions and rules take, unique among the schemas of one grammar)."""
    if not isinstance(schema, dict):
        raise ValueError(f"The JSON schema {keywords._at(where)} must be an object.")
    _check_size(schema, where)
    return _Preparer(schema, where, prefix).prepared


def convert(root: dict, rules: dict[str, str]) -> str:
    """llama-cpp-python's converter on a prepared root, its placeholder rules written in."""
    from ..llama import native  # llama.cpp's room has the converter
    try:
        gbnf = native.json_schema_gbnf(json.dumps(root))
    except RecursionError:
        raise ValueError("The JSON schema is too deep or too large to enforce.") from None
    except Exception as exc:  # the converter asserts on what it does not know
        raise ValueError(f"The JSON schema cannot be enforced: {_plain(exc)}") from None
    for name, expression in rules.items():  # (a definition nothing refers to has no rule)
        gbnf = re.sub(rf"^{re.escape(name)} ::= .*$", lambda _: f"{name} ::= ({expression}) space", gbnf,
                      count=1, flags=re.M)
    return gbnf


class _Preparer:
    def __init__(self, schema: dict, where: str, prefix: str):
        self.where, self.prefix = where, prefix
        self.defs: dict = {}
        self.rules: dict[str, str] = {}
        self.root_used = False
        body = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
        for key in ("$defs", "definitions"):
            found = schema.get(key, {})
            if not isinstance(found, dict):
                raise keywords.refuse(key, where, "it must be an object of schemas")
            for name, sub in found.items():
                self.defs[self._def_name(name)] = self._node(sub, _join(where, f"{key}.{name}"))
        self.prepared = Prepared(self._node(body, where), self.defs, self.rules)
        if self.root_used:
            self.defs[self._def_name("root")] = self.prepared.schema

    def _def_name(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def _node(self, node, where: str):
        if node is True or (isinstance(node, dict) and all(k in keywords.ANNOTATIONS or k.startswith("x-")
                                                             for k in node)):
            return dict(_ANY_VALUE)  # no constraint: any value
        if not isinstance(node, dict):
            raise ValueError(f"The JSON schema {keywords._at(where)} must be an object (or true).")
        node = _merged_all_of(node, where)
        kind = node.get("type")
        if isinstance(kind, list):  # the converter drops the other keywords beside a list of types
            if not kind or not all(isinstance(k, str) for k in kind):
                raise keywords.refuse("type", where, "it must be a type or a non-empty list of types")
            rest = {k: v for k, v in node.items() if k != "type"}
            return {"anyOf": [self._node({**_for(rest, k), "type": k}, where) for k in kind]}
        keywords.check_node(node, where)
        out = {}
        for key, value in node.items():
            at = _join(where, key)
            if key in ("properties", "$defs", "definitions"):
                if not isinstance(value, dict):
                    raise keywords.refuse(key, where, "it must be an object of schemas")
                out[key] = {name: self._node(sub, _join(at, name)) for name, sub in value.items()}
            elif key in ("anyOf", "oneOf", "prefixItems") or (key == "items" and isinstance(value, list)):
                if not isinstance(value, list) or not value:
                    raise keywords.refuse(key, where, "it must be a non-empty list of schemas")
                out[key] = [self._node(sub, f"{at}[{i}]") for i, sub in enumerate(value)]
            elif key == "items" or (key == "additionalProperties" and value is not False):
                out[key] = self._node(value, at)
            elif key == "$ref":
                out[key] = self._ref(value, where)
            elif key == "pattern" and isinstance(value, str):
                out[key] = converter_pattern(value, at)
            elif _unbounded(key, value):
                continue
            else:
                out[key] = value
        if out.get("type") in ("integer", "number") and any(k in out for k in keywords.RANGE):
            return self._range(out, where)
        if out.get("format") in keywords.FORMAT_PATTERNS:  # the converter knows no such format: a pattern
            out["pattern"] = converter_pattern(keywords.FORMAT_PATTERNS[out.pop("format")], _join(where, "format"))
        return out

    def _ref(self, ref, where: str) -> str:
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise keywords.refuse("$ref", where, "only references within the schema itself (#/...) are followed")
        parts = ref[2:].split("/") if ref != "#" else []
        if len(parts) >= 2 and parts[0] in ("$defs", "definitions"):
            return "#/$defs/" + "/".join([self._def_name(parts[1]), *parts[2:]])
        self.root_used = True
        return "#/$defs/" + "/".join([self._def_name("root"), *parts])

    def _range(self, node: dict, where: str) -> dict:
        try:
            expression = (keywords.integer_range(*keywords.integer_bounds(node)) if node["type"] == "integer"
                          else keywords.number_range(node))
        except ValueError as exc:
            raise keywords.refuse(next(k for k in keywords.RANGE if k in node), where, str(exc)) from None
        name = f"speculum-int-{re.sub(r'[^A-Za-z0-9-]', '-', self.prefix)}-{len(self.rules)}"
        self.rules[name] = expression
        self.defs[name] = {"const": name}  # a placeholder rule, written over in ``convert``
        return {"$ref": f"#/$defs/{name}"}


def _for(node: dict, kind: str) -> dict:
    """``node``'s keywords that apply to values of type ``kind`` (a range applies to numbers too)."""
    applies = {kind, "integer"} if kind == "number" else {kind}
    return {k: v for k, v in node.items() if keywords.FOR_TYPE.get(k, kind) in applies}


def _merged_all_of(node: dict, where: str) -> dict:
    """``allOf`` of one schema (pydantic writes a field's reference so) merged into the node; the
    converter reads more than one as object properties only, so more is refused."""
    parts = node.get("allOf")
    if parts is None:
        return node
    if not isinstance(parts, list) or len(parts) != 1 or not isinstance(parts[0], dict):
        raise keywords.refuse("allOf", where, "only an allOf of one schema is enforced: merge the schemas")
    rest = {k: v for k, v in node.items() if k != "allOf"}
    clash = sorted(k for k in set(rest) & set(parts[0]) if k not in keywords.ANNOTATIONS and rest[k] != parts[0][k])
    if clash:
        raise keywords.refuse(clash[0], where, "it stands both beside 'allOf' and within it")
    return {**parts[0], **rest}


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _check_size(schema, where: str) -> None:
    """Refuse a schema too big, too deep, or whose grammar would be too large or too slow to
    enforce, naming where in the schema; estimated before the converter writes anything."""
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError):
        raise ValueError("The JSON schema is not plain JSON.") from None
    if size > MAX_SCHEMA_CHARS:
        raise ValueError(f"The JSON schema is {size:,} characters; at most {MAX_SCHEMA_CHARS:,} are taken.")
    stack, grammar_chars = [(schema, 0, where)], 0
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"The JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels.")
        if isinstance(node, list):
            stack.extend((item, depth + 1, f"{path}[{i}]") for i, item in enumerate(node))
        elif isinstance(node, dict):
            for key, value in node.items():
                at = _join(path, str(key))
                if key in _COUNTS and not isinstance(value, (dict, list)):
                    if _unbounded(key, value):
                        continue
                    if _too_many(value):
                        raise ValueError(f"The JSON schema's {at} of {value} is more than the {MAX_COUNT:,} "
                                         "a grammar enforces.")
                    grammar_chars += value * _COUNT_CHARS
                if key == "pattern" and isinstance(value, str):
                    grammar_chars += check_pattern(converter_pattern(value, at), at)
                if grammar_chars > MAX_GRAMMAR_CHARS:
                    raise ValueError(f"The JSON schema's counts and patterns (up to {at}) would write a grammar "
                                     f"of more than {MAX_GRAMMAR_CHARS:,} characters.")
                stack.append((value, depth + 1, at))


def _unbounded(key: str, value) -> bool:
    """Whether an upper count is so large it is taken as none (``UNBOUNDED_FROM``)."""
    return key in ("maxLength", "maxItems") and isinstance(value, int) and not isinstance(value, bool) \
        and value >= UNBOUNDED_FROM


def _too_many(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("The JSON schema's item and length counts must be whole numbers.")
    return not 0 <= value <= MAX_COUNT


def _plain(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"
