"""Which JSON-schema keywords a grammar enforces, and the refusal of every other one.

"Strict" means the answer conforms: a keyword the grammar cannot enforce is refused with a
ValueError naming it and where it stands in the schema, never ignored. The table is README's
(section "Structured answers and tools: JSON-schema keywords").

Ranges (``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``) are written here
as digit grammars, for integers (``integer_range``) and for numbers between whole bounds
(``number_range``, no exponent): llama-cpp-python's converter ignores them.
"""

from __future__ import annotations

import math

# Enforced by llama-cpp-python's converter as they are (after schema.prepare's rewrites).
ENFORCED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "pattern", "minLength",
    "maxLength", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
})
# Annotations: they describe, and change no valid answer.
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "$schema", "$id", "$anchor", "deprecated",
    "readOnly", "writeOnly", "discriminator", "contentEncoding", "contentMediaType", "strict",
})
# Refused, with why (a grammar over text cannot say it, or the converter does not).
REFUSED = {
    "multipleOf": "a grammar does not enforce divisibility",
    "uniqueItems": "a grammar cannot compare an array's items with each other",
    "not": "a grammar does not enforce negation",
    "if": "conditional schemas are not enforced", "then": "conditional schemas are not enforced",
    "else": "conditional schemas are not enforced",
    "patternProperties": "property names by pattern are not enforced",
    "propertyNames": "property-name schemas are not enforced (but {\"type\": \"string\"}, what every name is)",
    "dependentRequired": "dependencies between properties are not enforced",
    "dependentSchemas": "dependencies between properties are not enforced",
    "dependencies": "dependencies between properties are not enforced",
    "contains": "'contains' is not enforced", "minContains": "'contains' is not enforced",
    "maxContains": "'contains' is not enforced",
    "unevaluatedProperties": "unevaluated properties are not enforced",
    "unevaluatedItems": "unevaluated items are not enforced",
    "additionalItems": "use 'items' for the items after 'prefixItems'",
    "minProperties": "property counts are not enforced", "maxProperties": "property counts are not enforced",
    "$dynamicRef": "dynamic references are not resolved", "$recursiveRef": "dynamic references are not resolved",
    "nullable": "write the null as {\"type\": [..., \"null\"]}",
}
TYPES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})
FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
# Formats enforced as a pattern of their practical form (a scheme and no blanks; one "@" and a dot).
FORMAT_PATTERNS = {"uri": r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$", "email": r"^[^\s@]+@[^\s@]+\.[^\s@]+$",
                   "hostname": r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$"}
# Keywords that speak of one type of value only (JSON schema applies them to that type alone).
FOR_TYPE = {"minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
            "items": "array", "prefixItems": "array", "minItems": "array", "maxItems": "array",
            "properties": "object", "required": "object", "additionalProperties": "object",
            "minimum": "integer", "maximum": "integer", "exclusiveMinimum": "integer", "exclusiveMaximum": "integer"}
RANGE = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
MAX_DIGITS = 18  # integer bounds beyond this many digits are refused (the grammar grows with them)


def _at(where: str) -> str:
    return f"at {where}" if where else "at the schema's root"


def refuse(key: str, where: str, why: str) -> ValueError:
    return ValueError(f"The JSON schema's keyword '{key}' {_at(where)} cannot be enforced: {why}.")


def check_node(node: dict, where: str) -> None:
    """Refuse ``node``'s keywords that no grammar here enforces, or that the converter would
    drop beside another one (``where``: the node's place, for the message)."""
    for key, value in node.items():
        if key in REFUSED:
            if (key == "uniqueItems" and value is False) or (key == "multipleOf" and value == 1
                                                             and node.get("type") == "integer") \
                    or (key == "propertyNames" and value in ({}, {"type": "string"})):  # what every name is
                continue
            raise refuse(key, where, REFUSED[key])
        if key not in ENFORCED and key not in ANNOTATIONS and not key.startswith("x-"):
            raise refuse(key, where, "it is not a keyword this server knows")
    kind = node.get("type")
    if "type" in node and kind not in TYPES:
        raise refuse("type", where, f"{str(kind)[:40]!r} is not a JSON-schema type")
    constraints = {k for k in node if k in ENFORCED} - {"$defs", "definitions"}
    for combiner in ("$ref", "anyOf", "oneOf"):
        if combiner in node:
            beside = sorted(constraints - {combiner, "type"} - ({"$ref"} if combiner != "$ref" else set()))
            if beside:
                raise refuse(beside[0], where, f"it stands beside '{combiner}', which the grammar follows alone: "
                                               f"move it into the schema that '{combiner}' leads to")
    if "pattern" in node:
        for key in ("minLength", "maxLength", "format"):
            if key in node:
                raise refuse(key, where, "it stands beside 'pattern': write the length or format into the pattern")
    for key in ("minLength", "maxLength", "pattern", "format"):
        if key in node and kind != "string":
            raise refuse(key, where, "it needs \"type\": \"string\" beside it")
    if "format" in node and node["format"] not in FORMATS and node["format"] not in FORMAT_PATTERNS:
        raise refuse("format", where, f"the format {str(node['format'])[:40]!r} is not enforced (these are: "
                                      f"{', '.join(sorted(FORMATS | set(FORMAT_PATTERNS)))})")
    for key in ("minItems", "maxItems"):
        if key in node and ("prefixItems" in node or kind != "array"):
            raise refuse(key, where, "it needs \"type\": \"array\" and 'items' (not 'prefixItems') beside it")
    if "prefixItems" in node and "items" in node:
        raise refuse("items", where, "items after 'prefixItems' are not enforced")
    for key in RANGE:
        if key in node:
            if kind not in ("integer", "number"):
                raise refuse(key, where, "a range needs \"type\": \"integer\" or \"number\" beside it")
            value = node[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or abs(value) >= 10 ** MAX_DIGITS:
                raise refuse(key, where, f"its bound must be a number of at most {MAX_DIGITS} digits")
            if kind == "number" and value != int(value):
                raise refuse(key, where, "a number's range is enforced between whole bounds only")


def integer_bounds(node: dict) -> tuple[int | None, int | None]:
    """The inclusive integer range ``node``'s range keywords allow (None: open)."""
    low = high = None
    if "minimum" in node:
        low = math.ceil(node["minimum"])
    if "exclusiveMinimum" in node:
        low = max(low if low is not None else -10 ** MAX_DIGITS, math.floor(node["exclusiveMinimum"]) + 1)
    if "maximum" in node:
        high = math.floor(node["maximum"])
    if "exclusiveMaximum" in node:
        high = min(high if high is not None else 10 ** MAX_DIGITS, math.ceil(node["exclusiveMaximum"]) - 1)
    return low, high


def integer_range(low: int | None, high: int | None) -> str:
    """A GBNF expression for the JSON integers from ``low`` to ``high`` (None: unbounded), with no
    leading zeros and no "-0"; ValueError when the range is empty."""
    if low is not None and high is not None and low > high:
        raise ValueError(f"the integer range from {low} to {high} is empty")
    parts = []
    if high is None or high >= 0:  # the non-negative part
        parts.append(_natural(max(low, 0) if low is not None else 0, high))
    if low is None or low < 0:  # the negative part: "-" and its magnitude
        parts.append('"-" (' + _natural(max(-high, 1) if high is not None else 1, -low if low is not None else None)
                     + ")")
    return " | ".join(f"({p})" for p in parts)


def _natural(low: int, high: int | None) -> str:
    """Decimal numerals of ``low`` to ``high`` (None: no end), both at least 0."""
    if high is None:
        digits = len(str(low))
        longer = f'[1-9] [0-9]{{{digits},}}'
        return f"{_same_length(str(low), '9' * digits)} | {longer}"
    alternatives = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        first = str(low) if digits == len(str(low)) else "1" + "0" * (digits - 1)
        last = str(high) if digits == len(str(high)) else "9" * digits
        alternatives.append(_same_length(first, last))
    return " | ".join(f"({a})" for a in alternatives)


def _same_length(a: str, b: str) -> str:
    """Numerals from ``a`` to ``b``, strings of digits of one length with a <= b."""
    if not a:
        return '""'
    if a[0] == b[0]:
        rest = _same_length(a[1:], b[1:]) if len(a) > 1 else ""
        return f'"{a[0]}"' + (f" ({rest})" if rest else "")
    n = len(a) - 1
    tail = f" [0-9]{{{n}}}" if n else ""
    if a[1:] == "0" * n and b[1:] == "9" * n:
        return f"[{a[0]}-{b[0]}]{tail}"
    out = [f'"{a[0]}" ({_same_length(a[1:], "9" * n)})' if n else f'"{a[0]}"']
    if int(b[0]) - int(a[0]) > 1:
        out.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}]{tail}")
    out.append(f'"{b[0]}" ({_same_length("0" * n, b[1:])})' if n else f'"{b[0]}"')
    return " | ".join(f"({x})" for x in out)


def number_range(node: dict) -> str:
    """A GBNF expression for the JSON numbers (no exponent) within ``node``'s whole bounds."""
    low, high = node.get("minimum"), node.get("maximum")
    low_open, high_open = "exclusiveMinimum" in node, "exclusiveMaximum" in node
    if low_open:
        low = node["exclusiveMinimum"] if low is None or node["exclusiveMinimum"] >= low else low
        low_open = low == node["exclusiveMinimum"]
    if high_open:
        high = node["exclusiveMaximum"] if high is None or node["exclusiveMaximum"] <= high else high
        high_open = high == node["exclusiveMaximum"]
    low, high = (None if low is None else int(low)), (None if high is None else int(high))
    if low is not None and high is not None and (low > high or (low == high and (low_open or high_open))):
        raise ValueError(f"the number range from {low} to {high} is empty")
    parts = []
    if high is None or high > 0 or (high == 0 and not high_open):  # x >= 0: its magnitude from max(low, 0)
        parts.append(_magnitude(max(low, 0) if low is not None else 0, high,
                                low_open and low is not None and low >= 0, high_open))
    if low is None or low < 0:  # x < 0: "-" and a magnitude from max(-high, 0) to -low
        parts.append('"-" (' + _magnitude(max(-high, 0) if high is not None else 0, -low if low is not None else None,
                                          high_open and high is not None and high <= 0, low_open) + ")")
    return " | ".join(f"({p})" for p in parts)


_FRACTION, _NONZERO_FRACTION, _ZERO_FRACTION = '("." [0-9]+)', '("." [0-9]* [1-9] [0-9]*)', '("." "0"+)'


def _magnitude(low: int, high: int | None, low_open: bool, high_open: bool) -> str:
    """Unsigned decimals m with low <= m <= high (strict where open; high None: no end)."""
    out = [f'({_natural(low, low)}) {_NONZERO_FRACTION}' if low_open else f"({_natural(low, low)}) {_FRACTION}?"]
    if high is None or high > low + 1:  # whole parts strictly between, any fraction
        out.append(f"({_natural(low + 1, None if high is None else high - 1)}) {_FRACTION}?")
    if high is not None and high > low and not high_open:
        out.append(f"({_natural(high, high)}) {_ZERO_FRACTION}?")
    if high is not None and high == low and high_open:
        raise ValueError("the number range is empty")
    if high is not None and high == low:  # the one whole number itself
        out = [f"({_natural(low, low)}) {_ZERO_FRACTION}?"]
    return " | ".join(f"({x})" for x in out)
