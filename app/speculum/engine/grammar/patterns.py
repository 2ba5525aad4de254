"""A JSON schema's ``pattern``, as llama.cpp's JSON-schema converter can enforce it: rewritten
into the subset it reads (``converter_pattern``) and costed before it is written out
(``check_pattern``), so a pattern that would stall the grammar is refused, not enforced at any cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_COUNT = 1_000  # minItems, maxLength, ... and {n,m} in patterns
# Optional pieces in a pattern, its bounded repetitions written out (``(.?){8}``: 8, ``a?b?``: 2):
# llama.cpp's grammar keeps a parse stack for each place a character may fall, and checking a
# token tries every way to split it among them, so each more multiplies the work of every
# whole-vocabulary check (measured on SmolLM2's 49,152 tokens: ``(.?){4}`` 0.06 s, ``(.?){8}``
# 0.5 s, ``(.?){16}`` 5 s, ``(.?){60}`` and ``((.?){3}.){20}`` more than a minute).
MAX_OPTIONAL_PIECES = 6


def check_pattern(pattern: str, where: str) -> int:
    """About how much grammar text ``pattern`` becomes; ValueError when it repeats counts too
    large or holds too many optional pieces (``MAX_OPTIONAL_PIECES``)."""
    try:
        shape = _PatternShape(pattern).shape
    except RecursionError:
        raise ValueError(f"The JSON schema's {where} nests its groups too deeply.") from None
    except ValueError as exc:
        raise ValueError(f"The JSON schema's {where} cannot be enforced: {exc}") from None
    if shape.optional > MAX_OPTIONAL_PIECES:
        raise ValueError(f"The JSON schema's {where} has {shape.optional:,} optional parts (its repetitions "
                         f"written out); a grammar enforces at most {MAX_OPTIONAL_PIECES}: each multiplies the work of "
                         "checking every token.")
    return shape.chars


# llama-cpp-python's converter copies a pattern's escapes into the grammar as they are, where
# ``\d``, ``\w``, ``\s`` and ``\.`` do not parse and a multi-character escape (``\u00e9``) loses
# the quantifier after it; it asserts on ``(?:`` and on a pattern not anchored at both ends; and
# it matches the pattern against the string's JSON text, so ``.`` or ``[^a]`` lets a raw quote
# end the string early. So a pattern reaches it rewritten into the strings the pattern means
# that JSON can hold: escapes as classes, ``(?:`` as ``(``, an open end as ``.*`` (a schema's
# pattern matches anywhere), every ``.`` and negated class kept off the quote, the backslash
# and control characters, and a character JSON escapes spelled as its escape.
_JSON_UNSAFE = r"\x22\x5C\x00-\x1F\x7F"  # within a class: what a JSON string may not hold raw
_ANY = f"[^{_JSON_UNSAFE}]"
_SHORTHANDS = {"d": "0-9", "w": "0-9A-Za-z_", "s": " "}  # \s: the space (JSON escapes the rest)
_CONTROL_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "f": "\f", "v": "\v"}
_JSON_ESCAPES = {'"': '"', "\\": "\\", "\n": "n", "\r": "r", "\t": "t", "\f": "f", "\b": "b"}
_HEX_DIGITS = {"x": 2, "u": 4}


def converter_pattern(pattern: str, where: str = "pattern") -> str:
    """``pattern`` (a JSON schema regular expression) in the subset the converter reads, over the
    string's JSON text; ValueError naming ``where`` for what a grammar cannot say (``\b``, ``\1``)."""
    n = len(pattern)
    start = pattern.startswith("^")
    end = n > int(start) and pattern.endswith("$") and (n - 1 - len(pattern[:n - 1].rstrip("\\"))) % 2 == 0
    out, i, n, open_at = [], int(start), n - int(end), None  # open_at: where the open class's "[" is
    while i < n:
        c, i = pattern[i], i + 1
        if c == "\\" and i < n:
            char, i = _escape(pattern, i, open_at is not None, where)
        elif open_at is None and c == "[":
            open_at, char = len(out), c
        elif open_at is not None and c == "]" and len(out) > open_at + 1 + (out[open_at + 1:open_at + 2] == ["^"]):
            char = (_JSON_UNSAFE if out[open_at + 1:open_at + 2] == ["^"] else "") + c
            open_at = None
        elif open_at is not None:  # "]" first in a class is one of its characters
            char = c if c not in '"]' and " " <= c != "\x7f" else _class_char(c) if c == "]" else ""
        elif c == "(" and pattern.startswith("?:", i):
            char, i = c, i + 2
        elif c == "." or c in _JSON_ESCAPES or c < " ":
            char = _ANY if c == "." else _literal(c)
        else:
            char = c
        out.append(char)
    core = "".join(out)
    if start and end:
        return f"^{core}$"
    return "^" + ("" if start else f"{_ANY}*") + f"({core})" + ("" if end else f"{_ANY}*") + "$"


def _escape(pattern: str, i: int, in_class: bool, where: str) -> tuple[str, int]:
    """The escape whose letter is at ``i``: inside a class, the characters it adds there (none
    where JSON writes them escaped); outside, a piece matching it. And where the pattern goes on."""
    e, i = pattern[i], i + 1
    if e in _HEX_DIGITS:
        digits = pattern[i:i + _HEX_DIGITS[e]]
        if len(digits) != _HEX_DIGITS[e] or any(h not in "0123456789abcdefABCDEF" for h in digits):
            raise ValueError(f"The JSON schema's {where} has \\{e} without {_HEX_DIGITS[e]} hex digits.")
        char, i = chr(int(digits, 16)), i + len(digits)
    elif e.lower() in _SHORTHANDS:
        if e.isupper() and in_class:
            raise ValueError(f"The JSON schema's {where} has \\{e} inside [...], which a grammar cannot say.")
        chars = _SHORTHANDS[e.lower()] + (_JSON_UNSAFE if e.isupper() else "")
        return (chars if in_class else f"[{'^' if e.isupper() else ''}{chars}]"), i
    elif e in _CONTROL_ESCAPES:
        char = _CONTROL_ESCAPES[e]
    elif e.isalnum():  # \b, \B, \A, \Z, back-references
        raise ValueError(f"The JSON schema's {where} uses \\{e}, which a grammar cannot say.")
    else:
        char = e
    if in_class:
        return ("" if char in _JSON_ESCAPES or char < " " or char == "\x7f" else _class_char(char)), i
    return _literal(char), i


def _class_char(c: str) -> str:
    """``c`` as one character of a class, in GBNF."""
    return f"\\x{ord(c):02X}" if c in "[]\\^-" else c


def _literal(c: str) -> str:
    """A piece matching ``c`` in a string's JSON text: itself, or the escape JSON writes it as."""
    if c in _JSON_ESCAPES:
        return f"([\\x5C][{_class_char(_JSON_ESCAPES[c])}])"
    if c < " " or c == "\x7f":
        return rf"([\x5C]u00{ord(c):02x})"
    return f"[{_class_char(c)}]"


@dataclass(frozen=True)
class _Shape:
    """What a piece of a pattern costs a grammar."""

    nullable: bool  # it may match nothing
    optional: int  # optional pieces inside it, its bounded repetitions written out
    chars: int  # about how much grammar text the converter writes for it


_ONE = _Shape(False, 0, 4)  # a character, class, escape or dot


class _PatternShape:
    """A regular expression read as llama.cpp's converter reads it (groups, alternatives,
    classes, escapes, ``? * + {m,n}``), costed piece by piece as it is read."""

    def __init__(self, pattern: str):
        self.p = pattern[1:] if pattern.startswith("^") else pattern
        self.p = self.p[:-1] if self.p.endswith("$") and not self.p.endswith("\\$") else self.p
        self.i = 0
        self.shape = self._alternatives()
        if self.i < len(self.p):
            raise ValueError(f"The pattern closes a group it never opened, at {self.i}.")

    def _alternatives(self) -> _Shape:
        branches: list[list[_Shape]] = [[]]
        while self.i < len(self.p) and self.p[self.i] != ")":
            c = self.p[self.i]
            if c == "|":
                branches.append([])
                self.i += 1
            elif c in "?*+{" and branches[-1]:
                branches[-1][-1] = _repeated(branches[-1][-1], *self._quantifier())
            else:
                branches[-1].append(self._piece())
        seqs = [_sequence(items) for items in branches]
        return _Shape(any(s.nullable for s in seqs), sum(s.optional for s in seqs), sum(s.chars for s in seqs))

    def _piece(self) -> _Shape:
        c, self.i = self.p[self.i], self.i + 1
        if c == "(":
            inner = self._alternatives()
            self.i += 1  # its ")"
            return _Shape(inner.nullable, inner.optional, inner.chars + 8)
        if c == "[":
            while self.i < len(self.p) and self.p[self.i] != "]":
                self.i += 2 if self.p[self.i] == "\\" else 1
            self.i += 1
        elif c == "\\":
            self.i += 1
        return _ONE

    def _quantifier(self) -> tuple[int, int | None]:
        c, self.i = self.p[self.i], self.i + 1
        if c != "{":
            return {"?": (0, 1), "*": (0, None), "+": (1, None)}[c]
        end = self.p.find("}", self.i)
        counts = _PATTERN_COUNT.fullmatch(self.p[self.i - 1:end + 1]) if end >= 0 else None
        if counts is None:
            raise ValueError(f"The pattern has an unclosed or invalid {{m,n}} at {self.i - 1}.")
        self.i = end + 1
        low = int(counts[1] or 0)
        high = low if counts[2] is None else (int(counts[3]) if counts[3] else None)
        if low > MAX_COUNT or (high is not None and high > MAX_COUNT):
            raise ValueError(f"The pattern repeats more than {MAX_COUNT:,} times.")
        return low, high


_PATTERN_COUNT = re.compile(r"\{\s*(\d*)\s*(?:(,)\s*(\d*)\s*)?\}")


def _sequence(items: list[_Shape]) -> _Shape:
    """Pieces one after another: their optional pieces add up, whatever stands between them (a
    token's characters reach across a required piece: ``((.?){3}.){20}`` stalls as ``(.?){80}``)."""
    optional = sum(max(1, s.optional) if s.nullable else s.optional for s in items)
    return _Shape(all(s.nullable for s in items), optional, sum(s.chars for s in items))


def _repeated(body: _Shape, low: int, high: int | None) -> _Shape:
    """``body{low,high}`` (high None: unbounded). The converter writes a bounded count out as
    copies, each with the body's optional pieces; a required body's optional tail nests
    (``(a (a)?)?``): one more choice, not one per copy. Unbounded repetition is a recursive
    rule, whose stacks do not multiply (``.*.*.*.*.*.*``: 0.04 s a check)."""
    copies = max(1, low if high is None else high)
    own = max(1, body.optional) if body.nullable and high is not None else body.optional
    optional = own * copies + (0 if body.nullable or high is None or high == low else 1)
    return _Shape(low == 0 or body.nullable, optional, body.chars + 16 * copies)
