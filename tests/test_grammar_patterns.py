"""JSON-schema ``pattern``s as real clients write them (pydantic, instructor: ``\\d``, ``\\w``,
``\\.``, ``(?:``, unanchored), enforced by llama.cpp's own grammar over a vocabulary of single
characters: the grammar takes exactly the JSON strings the pattern matches, and never a string
JSON cannot hold (a raw quote or backslash inside it)."""

import json
import re

import pytest

from grammar_vocab import CharModel
from speculum.engine.grammar.schema import schema_grammar

CHARS = [chr(c) for c in range(32, 127)] + ["é", "\n"]
PIECES = ["<unk>", "<s>", "</s>"] + CHARS
EOS = 2


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return CharModel(tmp_path_factory.mktemp("vocab") / "chars.gguf", PIECES)


def takes(model, pattern: str, json_text: str) -> bool:
    """Whether the grammar of a string with ``pattern`` lets a model write ``json_text``, whole."""
    state = schema_grammar({"type": "string", "pattern": pattern}).start(model)
    for ch in json_text:
        token = PIECES.index(ch)
        if not state.allows(token):
            return False
        state.accept(token)
    return state.allows(EOS)


CASES = [  # pattern, string, whether a JSON schema validator says it matches
    (r"^\d{3}-\d{4}$", "555-1234", True), (r"^\d{3}-\d{4}$", "55-1234", False),
    (r"^\d{3}-\d{4}$", "555-12345", False),
    (r"\d+", "order 42 shipped", True), (r"\d+", "no digits", False),  # unanchored: anywhere
    (r"^[\w.-]+@[\w-]+\.\w+$", "a.b-c@x-y.org", True), (r"^[\w.-]+@[\w-]+\.\w+$", "a@b", False),
    (r"^[\w.-]+@[\w-]+\.\w+$", "a@b,org", False),
    (r"^(?:ab)+$", "abab", True), (r"^(?:ab)+$", "aba", False),
    (r"^\S+$", "abc", True), (r"^\S+$", "ab c", False),
    (r"^\D+$", "abc", True), (r"^\D+$", "ab1", False),
    (r"^a\.b$", "a.b", True), (r"^a\.b$", "axb", False),
    (r"^\u00e9+$", "éé", True), (r"^\x41\x42$", "AB", True), (r"^\x41\x42$", "AA", False),
    (r"^line\nnext$", "line\nnext", True), (r"^say \"hi\"$", 'say "hi"', True),
    (r"^C:\\dir$", "C:\\dir", True), (r"^[^a]+$", "bcd", True), (r"^[^a]+$", "bad", False),
    (r"^[]a]+$", "]a]", True), (r"^\s?x$", " x", True), (r"^v\d+(\.\d+){2}$", "v1.22.3", True),
    (r"^v\d+(\.\d+){2}$", "v1.22", False), (r"^[A-Z]{2}\d{2}$", "AB12", True),
]


@pytest.mark.parametrize("pattern, value, expected", CASES, ids=lambda v: str(v)[:20])
def test_a_pattern_takes_the_strings_it_matches_and_no_others(model, pattern, value, expected):
    assert bool(re.search(pattern, value)) == expected  # the case itself is right
    assert takes(model, pattern, json.dumps(value, ensure_ascii=False)) == expected


@pytest.mark.parametrize("pattern", [r"^.+$", r"^[^a]+$", r"^\S+$", r"^\D+$", r"^\W+$", r"x"])
def test_no_pattern_lets_a_raw_quote_or_backslash_break_the_string(model, pattern):
    for text in ('"x"x"', '"x\\x"', '"x\nx"'):  # each not one JSON string
        assert not takes(model, pattern, text)
    assert takes(model, pattern, '"x+x"' if pattern != r"^\W+$" else '"+ +"')


@pytest.mark.parametrize("pattern, words", [(r"^\bword$", r"\\b"), (r"^(a)\1$", r"\\1"), (r"^[\D]$", r"\\D inside"),
                                            (r"^\x4$", "hex digits")])
def test_what_a_grammar_cannot_say_is_refused_in_words(pattern, words):
    with pytest.raises(ValueError, match=words):
        schema_grammar({"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}})
