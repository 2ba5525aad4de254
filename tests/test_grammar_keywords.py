"""Strict means strict: every JSON-schema keyword is enforced by llama.cpp's own grammar (over a
vocabulary of single characters: the grammar takes exactly the documents the schema allows) or
refused with an error naming the keyword and where it stands (README's table of keywords)."""

import json

import pytest

from grammar_vocab import CharModel
from speculum.engine.grammar import keywords
from speculum.engine.grammar.schema import schema_grammar
from speculum.engine.grammar.state import Grammar

CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
PIECES = ["<unk>", "<s>", "</s>"] + CHARS
EOS = 2


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return CharModel(tmp_path_factory.mktemp("vocab") / "chars.gguf", PIECES)


def takes(model, schema: dict, value) -> bool:
    """Whether the schema's grammar lets a model write ``value`` (as compact JSON), whole."""
    state = schema_grammar(schema).start(model)
    for ch in json.dumps(value, separators=(",", ":")):
        token = PIECES.index(ch)
        if not state.allows(token):
            return False
        state.accept(token)
    return state.allows(EOS)


def of(prop: dict) -> dict:
    return {"type": "object", "properties": {"v": prop}, "required": ["v"]}


ENFORCED = [  # keyword, schema of v, values allowed, values refused
    ("minimum", {"type": "integer", "minimum": 5}, [5, 6, 10, 12345], [4, 0, -5, -100]),
    ("maximum", {"type": "integer", "maximum": 7}, [7, 0, -3, -1000], [8, 10, 100]),
    ("minimum+maximum", {"type": "integer", "minimum": 5, "maximum": 7}, [5, 6, 7], [4, 8, 100, -6, 57]),
    ("exclusiveMinimum", {"type": "integer", "exclusiveMinimum": 5}, [6, 60], [5, 4, -6]),
    ("exclusiveMaximum", {"type": "integer", "exclusiveMaximum": 7}, [6, -7], [7, 70]),
    ("negative range", {"type": "integer", "minimum": -12, "maximum": -3}, [-12, -3, -7, -10], [-13, -2, 0, 3]),
    ("wide range", {"type": "integer", "minimum": 17, "maximum": 2305}, [17, 99, 100, 999, 2305, 2299],
     [16, 2306, 3000, 10000, 9]),
    ("fractional bounds", {"type": "integer", "minimum": 1.5, "maximum": 3.5}, [2, 3], [1, 4]),
    ("number range", {"type": "number", "minimum": 0, "maximum": 600000}, [0, 0.5, 12, 599999.99, 600000, 600000.0],
     [-1, -0.5, 600000.5, 600001]),
    ("number exclusiveMinimum", {"type": "number", "exclusiveMinimum": 0}, [0.001, 1, 12.5], [0, 0.0, -2]),
    ("number exclusiveMaximum", {"type": "number", "exclusiveMaximum": -2}, [-2.5, -3, -100], [-2, -1.5, 0, 3]),
    ("number both sides", {"type": "number", "minimum": -1, "exclusiveMaximum": 1}, [-1, -0.5, 0, 0.99],
     [-1.5, 1, 1.0, 2]),
    ("format uri", {"type": "string", "format": "uri"}, ["https://example.com/a?b=1"], ["not a uri", "example.com"]),
    ("format email", {"type": "string", "format": "email"}, ["ann@example.org"], ["ann", "a b@c.d"]),
    ("propertyNames", {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": True},
     [{"a": 1}], [[1]]),
    ("maxLength no bound", {"type": "string", "maxLength": 524288}, ["abc", ""], [3]),
    ("annotations only", {"description": "any value"}, ["a", 1, None, [1], {"a": 1}], []),
    ("type", {"type": "string"}, ["Oslo"], [["Oslo", "Rome"], 3, None]),
    ("enum", {"enum": ["a", "b"]}, ["a", "b"], ["c"]),
    ("const", {"const": 3}, [3], [4]),
    ("minLength", {"type": "string", "minLength": 2}, ["ab", "abc"], ["a", ""]),
    ("maxLength", {"type": "string", "maxLength": 2}, ["ab", ""], ["abc"]),
    ("pattern", {"type": "string", "pattern": "^[a-c]+$"}, ["abc"], ["abd"]),
    ("format", {"type": "string", "format": "date"}, ["2024-05-06"], ["yesterday", "2024-13-01"]),
    ("minItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2}, [[1, 2]], [[1], []]),
    ("maxItems", {"type": "array", "items": {"type": "integer"}, "maxItems": 1}, [[1], []], [[1, 2]]),
    ("items", {"type": "array", "items": {"type": "string"}}, [["a"]], [[1]]),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}, [[1, "a"]],
     [["a", 1]]),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, [1, None], ["x"]),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, [1, True], ["x"]),
    ("allOf", {"allOf": [{"type": "integer", "minimum": 2}]}, [2, 3], [1]),
    ("type list", {"type": ["string", "null"], "maxLength": 1}, ["a", None], ["ab", 1]),
    ("additionalProperties", {"type": "object", "properties": {"a": {"type": "integer"}},
                              "additionalProperties": False}, [{"a": 1}], [{"a": 1, "b": 2}]),
    ("required", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
     [{"a": 1}], [{}]),
    ("$ref", {"$ref": "#/$defs/small"}, [1], [5]),
]


@pytest.mark.parametrize("keyword, prop, allowed, refused", ENFORCED, ids=[c[0] for c in ENFORCED])
def test_each_enforced_keyword_lets_through_exactly_what_it_allows(model, keyword, prop, allowed, refused):
    schema = {**of(prop), "$defs": {"small": {"type": "integer", "minimum": 0, "maximum": 3}}}
    for value in allowed:
        assert takes(model, schema, {"v": value}), (keyword, value)
    for value in refused:
        assert not takes(model, schema, {"v": value}), (keyword, value)


REFUSED = [  # keyword, schema of v (at properties.v)
    ("minimum", {"type": "number", "minimum": 0.5}),
    ("maximum", {"type": "number", "maximum": 7.25}),
    ("exclusiveMinimum", {"type": "string", "exclusiveMinimum": 0}),
    ("exclusiveMaximum", {"type": "number", "exclusiveMaximum": 1.5}),
    ("multipleOf", {"type": "integer", "multipleOf": 5}),
    ("format", {"type": "string", "format": "ipv6"}),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
    ("not", {"not": {"type": "string"}}),
    ("if", {"if": {"type": "string"}, "then": {"maxLength": 3}}),
    ("patternProperties", {"type": "object", "patternProperties": {"^a": {"type": "string"}}}),
    ("propertyNames", {"type": "object", "propertyNames": {"maxLength": 3}}),
    ("dependentRequired", {"type": "object", "dependentRequired": {"a": ["b"]}}),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}),
    ("minProperties", {"type": "object", "minProperties": 1}),
    ("maxProperties", {"type": "object", "maxProperties": 1}),
    ("unevaluatedProperties", {"type": "object", "unevaluatedProperties": False}),
    ("nullable", {"type": "string", "nullable": True}),
    ("maxLength", {"type": "string", "pattern": "^a+$", "maxLength": 3}),  # the converter would drop it
    ("minItems", {"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 1}),
    ("allOf", {"allOf": [{"type": "integer"}, {"minimum": 1}]}),
    ("minimum", {"$ref": "#/$defs/x", "minimum": 1}),  # beside a $ref, which the grammar follows alone
    ("$ref", {"$ref": "https://example.com/schema.json"}),
    ("madeUpKeyword", {"type": "string", "madeUpKeyword": 1}),
]


@pytest.mark.parametrize("keyword, prop", REFUSED, ids=[c[0] + str(i) for i, c in enumerate(REFUSED)])
def test_each_keyword_a_grammar_cannot_enforce_is_refused_naming_it_and_where(keyword, prop):
    with pytest.raises(ValueError) as refused:
        schema_grammar({**of(prop), "$defs": {"x": {"type": "integer"}}})
    assert f"'{keyword}'" in str(refused.value) and "at properties.v" in str(refused.value), str(refused.value)


def test_annotations_change_nothing_and_are_taken(model):
    schema = of({"type": "integer", "title": "V", "description": "a value", "default": 1, "examples": [1],
                 "deprecated": False, "x-vendor": "anything"})
    assert takes(model, schema, {"v": 12}) and not takes(model, schema, {"v": "12"})


def test_a_ref_resolves_in_nested_pydantic_models(model):
    from pydantic import BaseModel

    class Ingredient(BaseModel):
        name: str
        grams: int

    class Recipe(BaseModel):
        title: str
        ingredients: list[Ingredient]

    schema = Recipe.model_json_schema()
    assert "$defs" in schema
    assert takes(model, schema, {"title": "Soup", "ingredients": [{"name": "leek", "grams": 200}]})
    assert not takes(model, schema, {"title": "Soup", "ingredients": [{"name": "leek"}]})


def test_the_readme_table_names_every_keyword():
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    for keyword in sorted(keywords.ENFORCED | set(keywords.REFUSED)):
        assert f"`{keyword}`" in readme, keyword


def test_integer_ranges_are_digit_grammars_that_parse():
    for low, high in [(0, 0), (0, 9), (5, 7), (-5, 5), (10, 99), (99, 100), (None, 3), (3, None), (None, -3),
                      (-7, None), (123, 45678)]:
        Grammar(f"root ::= {keywords.integer_range(low, high)}")
    with pytest.raises(ValueError):
        keywords.integer_range(3, 2)
