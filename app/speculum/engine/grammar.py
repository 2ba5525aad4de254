"""Grammar-constrained decoding: llama.cpp's GBNF grammar sampler, followed token by token.

A ``Grammar`` is GBNF text, checked when it is made (``grammar_for_response_format`` makes one
from an OpenAI ``response_format``). ``Grammar.start(model)`` gives the ``GrammarState`` at the
start of an answer: which tokens may come next (``allowed``, ``allows``, ``best``) and how it
follows a token (``accept``). ``clone`` copies it, so a draft can be walked ahead of the
accepted text and the copy dropped where the target rejects the draft.

A whole-vocabulary mask is the grammar's dear call (about 14 ms for Qwen's 151,936 tokens on
a 2-core CPU): greedy picks ask the likeliest tokens first (``best``), and sampling without
top-k/top-p/min-p reads the masked distribution lazily (``MaskedDistribution``), exactly.

The state is llama.cpp's grammar sampler (``llama_sampler_init_grammar``), applied to a reused
token-data array. llama.cpp aborts the process when a state is made to accept a token it
forbids, so ``accept`` checks first.
"""

from __future__ import annotations

import ctypes
import json
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Pool sizes for the greedy token: the grammar usually allows one of the model's favourites, so
# the best few are checked before the whole vocabulary.
_POOLS = (32, 1024)

# Sampling without top-k/top-p/min-p, the masked distribution p' = p * allowed / Z is read lazily
# (``MaskedDistribution``): the grammar is asked about the likeliest tokens only, those holding
# all but ``HEAD_TAIL`` of the mass where ``HEAD_SIZES`` allow, and the whole vocabulary only
# when that cannot settle a decision exactly.
HEAD_SIZES = (256, 4096)
HEAD_TAIL = 1e-4
REJECTION_TRIES = 64

# Bounds on what a client's schema may ask the grammar to spell out (a repetition is written
# out once per item): beyond them a schema is refused, not enforced at any cost.
MAX_SCHEMA_CHARS = 100_000
MAX_SCHEMA_DEPTH = 64
MAX_COUNT = 1_000  # minItems, maxLength, ... and {n,m} in patterns
MAX_GRAMMAR_CHARS = 1_000_000
# Optional pieces in a pattern, its bounded repetitions written out (``(.?){8}``: 8, ``a?b?``: 2):
# llama.cpp's grammar keeps a parse stack for each place a character may fall, and checking a
# token tries every way to split it among them, so each more multiplies the work of every
# whole-vocabulary check (measured on SmolLM2's 49,152 tokens: ``(.?){4}`` 0.06 s, ``(.?){8}``
# 0.5 s, ``(.?){16}`` 5 s, ``(.?){60}`` and ``((.?){3}.){20}`` more than a minute).
MAX_OPTIONAL_PIECES = 6
_COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")
_COUNT_CHARS = 24  # grammar text the converter writes per counted item, about (a rule name and brackets)

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def _lc():
    """llama_cpp, loaded on first use through the gate (engine.native), so importing this module
    loads no llama.cpp (the window's process never does)."""
    from .llama.native import lc
    return lc


@dataclass(frozen=True)
class Grammar:
    """GBNF text and its root rule; raises ValueError, in plain words, when llama.cpp cannot parse it."""

    gbnf: str
    root: str = "root"

    def __post_init__(self) -> None:
        if not isinstance(self.gbnf, str) or not self.gbnf.strip():
            raise ValueError("The grammar is empty.")
        if len(self.gbnf) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"The grammar is {len(self.gbnf):,} characters; at most {MAX_GRAMMAR_CHARS:,} are taken.")
        if "\0" in self.gbnf or "\0" in self.root:
            raise ValueError("The grammar holds a NUL character.")
        sampler = self._sampler(None)
        _lc().llama_sampler_free(sampler)

    @classmethod
    def from_json_schema(cls, schema: dict) -> "Grammar":
        """The grammar of JSON documents that conform to ``schema`` (llama.cpp's converter)."""
        _check_schema(schema)
        schema = _converter_schema(schema)
        _lc()  # through the gate first: llama_cpp's package loads libllama
        from llama_cpp.llama_grammar import json_schema_to_gbnf
        try:
            gbnf = json_schema_to_gbnf(json.dumps(schema))
        except RecursionError:
            raise ValueError("The JSON schema is too deep or too large to enforce.") from None
        except Exception as exc:  # the converter asserts on what it does not know
            raise ValueError(f"The JSON schema cannot be enforced: {_plain(exc)}") from None
        return cls(gbnf)

    def _sampler(self, vocab):
        lc = _lc()
        from .llama.native import _log_lines, clear_log, recent_log_error
        clear_log()
        sampler = lc.llama_sampler_init_grammar(vocab, self.gbnf.encode("utf-8", "replace"),
                                                self.root.encode("utf-8", "replace"))
        if not sampler:
            why = recent_log_error() or "\n".join(line.strip() for line in _log_lines if line.strip())
            raise ValueError("The grammar does not parse" + (f": {why}" if why else "."))
        return sampler

    def start(self, model) -> "GrammarState":
        """The state at the start of an answer, over ``model``'s vocabulary (``model.llama_vocab``)."""
        vocab = model.llama_vocab
        if not vocab:
            raise ValueError("This model has no llama.cpp vocabulary to apply a grammar with.")
        return GrammarState(self._sampler(vocab), _Candidates(model.n_vocab))


class _Candidates:
    """Token-data arrays the grammar marks (-inf: forbidden), reused for every call of one answer."""

    def __init__(self, n_vocab: int):
        lc = _lc()
        self.n_vocab = n_vocab
        self._data = (lc.llama_token_data * n_vocab)()
        self.view = np.frombuffer(self._data, dtype=_TOKEN_DATA)
        self._array = lc.llama_token_data_array(
            ctypes.cast(self._data, lc.llama_token_data_p), n_vocab, -1, False)
        self._pointer = ctypes.pointer(self._array)

    def allowed(self, sampler, tokens: np.ndarray | None = None) -> np.ndarray:
        """Which of ``tokens`` (None: the whole vocabulary, as a mask) the grammar allows now."""
        n = self.n_vocab if tokens is None else len(tokens)
        view = self.view[:n]
        view["id"] = np.arange(n) if tokens is None else tokens
        view["logit"] = 0.0
        self._array.size, self._array.selected, self._array.sorted = n, -1, False
        _lc().llama_sampler_apply(sampler, self._pointer)
        return view["logit"] == 0.0


class GrammarState:
    """Where an answer stands in its grammar: which tokens may come next, and following one."""

    def __init__(self, sampler, candidates: _Candidates):
        self._sampler = sampler
        self._candidates = candidates
        self._one = np.zeros(1, np.int32)
        self._free = _lc().llama_sampler_free  # held: at interpreter exit no import works

    def __del__(self) -> None:
        if getattr(self, "_sampler", None):
            self._free(self._sampler)
            self._sampler = None

    @property
    def n_vocab(self) -> int:
        return self._candidates.n_vocab

    def clone(self) -> "GrammarState":
        return GrammarState(_lc().llama_sampler_clone(self._sampler), self._candidates)

    def allows(self, token: int) -> bool:
        if not 0 <= token < self.n_vocab:
            return False
        self._one[0] = token
        return bool(self._candidates.allowed(self._sampler, self._one)[0])

    def accept(self, token: int) -> None:
        """Follow ``token``; ValueError when the grammar forbids it (the state is then unchanged)."""
        if not self.allows(token):
            raise ValueError(f"token {token} is not allowed by the grammar here")
        _lc().llama_sampler_accept(self._sampler, int(token))

    def allowed(self) -> np.ndarray:
        """A mask over the vocabulary: True where the token may come next."""
        return self._candidates.allowed(self._sampler)

    def allowed_among(self, tokens: np.ndarray) -> np.ndarray:
        """Which of ``tokens`` (ids within the vocabulary) may come next: the cost of asking grows
        with how many are asked."""
        return self._candidates.allowed(self._sampler, tokens.astype(np.int32))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of ``logits`` with -inf on every token the grammar forbids (rows may be longer or
        shorter than this vocabulary: a draft model's; tokens past it are forbidden)."""
        allowed = self.allowed()
        out = np.full(logits.shape, -np.inf, dtype=np.float32)
        n = min(len(logits), len(allowed))
        np.copyto(out[:n], logits[:n], where=allowed[:n])
        return out

    def best(self, logits: np.ndarray) -> int:
        """The argmax of ``mask(logits)``, lowest id on ties, checking the likeliest tokens first."""
        logits = np.asarray(logits[:self.n_vocab], dtype=np.float32)
        top = int(np.argmax(logits))  # the lowest id of the largest: the answer whenever allowed
        if self.allows(top):
            return top
        for size in _POOLS:
            if size >= len(logits):
                break
            threshold = np.partition(logits, len(logits) - size)[len(logits) - size]
            pool = np.flatnonzero(logits >= threshold)  # every token tied at the threshold too
            ok = pool[self.allowed_among(pool)]
            if len(ok):
                return _first_best(ok, logits[ok])
        ok = np.flatnonzero(self.allowed())
        if not len(ok):
            raise ValueError("The grammar allows no token here.")
        return _first_best(ok, logits[ok])

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows in turn (a draft stops at the first it forbids)."""
        if not tokens:
            return 0
        walk = self.clone()
        for n, token in enumerate(tokens):
            if not walk.allows(token):
                return n
            if n + 1 < len(tokens):
                _lc().llama_sampler_accept(walk._sampler, int(token))
        return len(tokens)


    def masked_head(self, p: np.ndarray) -> np.ndarray | None:
        """A draft's proposal under the grammar without a whole-vocabulary mask: ``p`` kept on its
        likeliest ``HEAD_SIZES[0]`` tokens the grammar allows, renormalised (None when it allows
        none of them). Verification is exact for any proposal it is handed, this one included."""
        m = min(HEAD_SIZES[0], len(p))
        head = np.argpartition(-p, m - 1)[:m] if m < len(p) else np.arange(len(p))
        head = head[head < self.n_vocab]
        ok = head[self.allowed_among(head)]
        mass = float(p[ok].sum(dtype=np.float64)) if len(ok) else 0.0
        if mass <= 0.0:
            return None
        out = np.zeros_like(p)
        out[ok] = p[ok] / mass
        return out


class MaskedDistribution:
    """One row's grammar-masked distribution p' = p * allowed / Z, with ``p`` a temperature
    softmax (no top-k/top-p/min-p), read without a whole-vocabulary mask where it can be exactly.

    Z, the allowed mass, is bounded by asking the grammar about the likeliest tokens only: those
    allowed give Z's lower bound, the untested tail's mass its upper. An acceptance test
    ``u < p'(x) / q(x)`` is decided from the bounds unless ``u`` falls between them, and sampling
    is rejection sampling from ``p`` (draw, keep an allowed token); only then, or after
    ``REJECTION_TRIES`` draws, is the whole mask computed. Every decision is the exact one."""

    def __init__(self, logits: np.ndarray, sampling, state: GrammarState):
        from .sampling import distribution

        self.logits, self.sampling, self.state = logits, sampling, state
        self.p = distribution(logits, sampling)
        self._exact: np.ndarray | None = None
        self._bounds: tuple[float, float] | None = None

    def bounds(self) -> tuple[float, float]:
        """(lower, upper) bound of the allowed mass Z."""
        if self._exact is not None:
            return self._z, self._z
        if self._bounds is None:
            p, total = self.p, float(self.p.sum(dtype=np.float64))
            for size in HEAD_SIZES:
                m = min(size, len(p))
                head = np.argpartition(-p, m - 1)[:m] if m < len(p) else np.arange(len(p))
                tail = max(0.0, total - float(p[head].sum(dtype=np.float64)))
                if tail <= HEAD_TAIL * total:
                    break
            inside = head[head < self.state.n_vocab]
            allowed = self.state.allowed_among(inside)
            ok = inside[allowed]
            self._forbidden = np.concatenate([inside[~allowed], head[head >= self.state.n_vocab]])
            self._known = set(ok.tolist())
            low = float(p[ok].sum(dtype=np.float64))
            self._bounds = (low, low + tail * (1 + 1e-9) + 1e-30)
        return self._bounds

    def exact(self) -> np.ndarray:
        """p' itself (the whole mask: asked only when needed)."""
        if self._exact is None:
            from .sampling import distribution

            masked = self.state.mask(self.logits)
            self._z = float(self.p[np.isfinite(masked)].sum(dtype=np.float64))
            self._exact = distribution(masked, self.sampling)  # as the whole-mask path defines it
        return self._exact

    def prob(self, x: int) -> float:
        """p'(x): exact once the mask is known, else from Z's lower bound (for display)."""
        if self._exact is not None:
            return float(self._exact[x])
        if not self.state.allows(x):
            return 0.0
        low = self.bounds()[0]
        return float(self.p[x]) / low if low > 0 else float(self.exact()[x])

    def accepts(self, x: int, qx: float, u: float) -> bool:
        """Exactly ``u < min(1, p'(x) / qx)``."""
        if self._exact is not None:
            return u < min(1.0, float(self._exact[x]) / qx)
        if not self.state.allows(x):
            return False
        low, high = self.bounds()
        px = float(self.p[x])
        if low > 0:
            if u < min(1.0, px / (high * qx)):
                return True
            if u >= min(1.0, px / (low * qx)):
                return False
        return u < min(1.0, float(self.exact()[x]) / qx)

    def sample(self, rng: np.random.Generator, exclude: int | None = None) -> int:
        """A token from p' (with ``exclude`` taken out), by rejection: drawn from p without the
        likeliest tokens known forbidden (every allowed token keeps its p), kept when allowed."""
        from .sampling import sample

        if self._exact is None:
            self.bounds()
            proposal = self.p.copy()
            proposal[self._forbidden] = 0.0
            if exclude is not None:
                proposal[exclude] = 0.0
            if proposal.sum(dtype=np.float64) > 0:
                for _ in range(REJECTION_TRIES):
                    y = sample(proposal, rng)
                    if y in self._known or self.state.allows(y):
                        return y
        p = self.exact()
        if exclude is None:
            return sample(p, rng)
        rest = p.copy()
        rest[exclude] = 0.0
        return sample(rest, rng) if rest.sum() > 0 else sample(p, rng)


def _first_best(ids: np.ndarray, values: np.ndarray) -> int:
    return int(ids[values == values.max()].min())


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
    return Grammar.from_json_schema(schema)


def json_object_grammar() -> Grammar:
    """Any JSON object (llama.cpp's json.gbnf)."""
    _lc()  # through the gate first: llama_cpp's package loads libllama
    from llama_cpp.llama_grammar import JSON_GBNF
    return Grammar(JSON_GBNF)


def _check_schema(schema) -> None:
    """Refuse a schema too big, too deep, or whose grammar would be too large or too slow to
    enforce, naming where in the schema; estimated before the converter writes anything."""
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError):
        raise ValueError("The JSON schema is not plain JSON.") from None
    if size > MAX_SCHEMA_CHARS:
        raise ValueError(f"The JSON schema is {size:,} characters; at most {MAX_SCHEMA_CHARS:,} are taken.")
    stack, grammar_chars = [(schema, 0, "")], 0
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"The JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels.")
        if isinstance(node, list):
            stack.extend((item, depth + 1, f"{path}[{i}]") for i, item in enumerate(node))
        elif isinstance(node, dict):
            for key, value in node.items():
                where = f"{path}.{key}" if path else str(key)
                if key in _COUNTS and not isinstance(value, (dict, list)):
                    if _too_many(value):
                        raise ValueError(f"The JSON schema's {where} of {value} is more than the {MAX_COUNT:,} "
                                         "a grammar enforces.")
                    grammar_chars += value * _COUNT_CHARS
                if key == "pattern" and isinstance(value, str):
                    grammar_chars += _check_pattern(_converter_pattern(value, where), where)
                if grammar_chars > MAX_GRAMMAR_CHARS:
                    raise ValueError(f"The JSON schema's counts and patterns (up to {where}) would write a grammar "
                                     f"of more than {MAX_GRAMMAR_CHARS:,} characters.")
                stack.append((value, depth + 1, where))


def _check_pattern(pattern: str, where: str) -> int:
    """About how much grammar text ``pattern`` becomes; ValueError when it repeats counts too
    large or holds too many optional pieces (``MAX_OPTIONAL_PIECES``)."""
    try:
        shape = _PatternShape(pattern).shape
    except RecursionError:
        raise ValueError(f"The JSON schema's {where} nests its groups too deeply.") from None
    except ValueError as exc:
        raise ValueError(f"The JSON schema's {where} cannot be enforced: {exc}") from None
    if shape.optional > MAX_OPTIONAL_PIECES:
        raise ValueError(f"The JSON schema's {where} has {shape.optional:,} optional parts (its repetitions written "
                         f"out); a grammar enforces at most {MAX_OPTIONAL_PIECES}: each multiplies the work of checking "
                         "every token.")
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


def _converter_schema(node):
    """``node`` with every ``pattern`` as the converter can read it (``_converter_pattern``)."""
    if isinstance(node, list):
        return [_converter_schema(item) for item in node]
    if isinstance(node, dict):
        return {key: _converter_pattern(value) if key == "pattern" and isinstance(value, str)
                else _converter_schema(value) for key, value in node.items()}
    return node


def _converter_pattern(pattern: str, where: str = "pattern") -> str:
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


def _too_many(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("The JSON schema's item and length counts must be whole numbers.")
    return not 0 <= value <= MAX_COUNT


def _plain(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"
