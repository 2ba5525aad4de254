"""Constrained decoding stays exact under speculation: proven on the synthetic model, whose
logits carry no llama.cpp numerics, with llama.cpp's own grammar sampler over a real
(vocab-only) vocabulary of JSON pieces."""

import json
from collections import Counter

import numpy as np
import pytest

from grammar_vocab import EOS, PIECES, JsonSynthetic, LlamaVocab, json_draft, write_vocab
from speculum.engine.decoder import Decoder
from speculum.engine.drafting.draft import Draft, Drafter
from speculum.engine.grammar.schema import grammar_for_response_format, json_object_grammar
from speculum.engine.grammar.state import Grammar
from speculum.engine.sampling import Coupling, SamplingParams, distribution, log_probs
from speculum.engine.vocabulary import Source
from test_exactness_synthetic import chi_square_p

SCHEMA = {"type": "object", "properties": {"x": {"enum": ["a", "b", "c"]}, "y": {"type": "boolean"}},
          "required": ["x", "y"]}
LIST_SCHEMA = {"type": "object", "properties": {"x": {"type": "array", "items": {"enum": ["a", "ab", "b", "c"]},
                                                      "maxItems": 6}}, "required": ["x"]}
PROMPT = '{"x":"b","y":false}{"x":["a","ab","c"]}{"x":"ab"}'


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return LlamaVocab(write_vocab(tmp_path_factory.mktemp("vocab") / "json-pieces.gguf"))


def schema_grammar(schema):
    return grammar_for_response_format({"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})


def answer(decoder, prompt, **kw):
    cycles = list(decoder.generate(prompt, **kw))
    return [t for c in cycles for t in c.emitted], cycles


def text_of(tokens):
    return "".join(PIECES[t] for t in tokens if t != EOS)


def conforms(value, schema) -> bool:
    if schema == SCHEMA:
        return set(value) == {"x", "y"} and value["x"] in "abc" and isinstance(value["y"], bool)
    return (set(value) == {"x"} and isinstance(value["x"], list) and len(value["x"]) <= 6
            and all(v in ("a", "ab", "b", "c") for v in value["x"]))


GRAMMARS = {"json_object": lambda: json_object_grammar(), "schema": lambda: schema_grammar(SCHEMA),
            "list": lambda: schema_grammar(LIST_SCHEMA)}


@pytest.mark.parametrize("which", sorted(GRAMMARS))
@pytest.mark.parametrize("mode", ["draft", "lookup", "prediction", "auto"])
def test_greedy_constrained_speculation_equals_plain_constrained(vocab, which, mode):
    grammar = GRAMMARS[which]()
    drafted = accepted = finished = 0
    for seed in range(6):
        target = JsonSynthetic(vocab, seed=seed)
        prompt = target.tokenize(PROMPT)
        plain, _ = answer(Decoder(JsonSynthetic(vocab, seed=seed)), prompt, max_tokens=80, grammar=grammar)
        predicted = target.tokenize('{"x":"a","y":true}') if mode == "prediction" else ()
        decoder = Decoder(target, json_draft(target, seed=5, noise=1.5))
        spec, cycles = answer(decoder, prompt, max_tokens=80, grammar=grammar, prediction=predicted,
                              policy="auto" if mode in ("auto", "prediction") else mode, k=None if mode == "auto" else 4)
        assert spec == plain, (seed, text_of(plain), text_of(spec))
        drafted += sum(len(c.drafted) for c in cycles)
        accepted += sum(c.n_accepted for c in cycles)
        if which == "json_object" and cycles[-1].finish == "max_tokens":
            continue  # any object: the random model may go on writing one string
        assert cycles[-1].finish == "eog" and spec[-1] == EOS  # ended where the grammar allowed it
        value = json.loads(text_of(spec))
        assert isinstance(value, dict)
        finished += 1
        if which != "json_object":
            assert conforms(value, SCHEMA if which == "schema" else LIST_SCHEMA), value
    assert drafted > 0 and accepted > 0 and finished >= 3


def test_without_a_grammar_the_same_model_writes_no_json(vocab):
    """The grammar is what makes the answers above JSON: unconstrained, the model writes noise."""
    target = JsonSynthetic(vocab, seed=1)
    out, _ = answer(Decoder(target), target.tokenize(PROMPT), max_tokens=40)
    with pytest.raises(ValueError):
        json.loads(text_of(out))


class ErrantDrafter(Drafter):
    """Drafts the target's constrained greedy token with probability ``quality``, else any token
    of the vocabulary. When sampling, its q is uniform over the vocabulary (forbidden tokens too)
    and the draft is drawn from it, so verification must reject what the grammar forbids."""

    source = Source.MODEL

    def __init__(self, target, quality: float, seed: int = 0):
        self.target, self.quality, self.rng = target, quality, np.random.default_rng(seed)

    @classmethod
    def build(cls, inputs):
        return None  # (put in place by hand in each test)

    def propose(self, context, k, choice, sampling, rng):
        n = len(PIECES)
        if not sampling.greedy:
            return Draft([int(t) for t in rng.integers(0, n, k)], Source.MODEL, q=np.full((k, n), 1.0 / n))
        walk, tokens = choice.grammar.clone(), []
        for _ in range(k):
            good = walk is not None and self.rng.random() < self.quality
            tokens.append(walk.best(self.target.logits_after(list(context) + tokens)) if good
                          else int(self.rng.integers(0, n)))
            if walk is not None and walk.allows(tokens[-1]) and tokens[-1] != EOS:
                walk.accept(tokens[-1])
            else:
                walk = None
        return Draft(tokens, Source.MODEL)


def test_drafts_the_grammar_forbids_are_cut_before_verification(vocab):
    """Drafts that leave the grammar never change the constrained answer, and only their
    allowed prefix is verified."""
    grammar = schema_grammar(SCHEMA)
    for quality in (0.3, 0.7, 0.9):
        target = JsonSynthetic(vocab, seed=3)
        prompt = target.tokenize(PROMPT)
        plain, _ = answer(Decoder(JsonSynthetic(vocab, seed=3)), prompt, max_tokens=60, grammar=grammar)
        decoder = Decoder(target)
        decoder.drafters[Source.MODEL] = ErrantDrafter(target, quality)
        spec, cycles = answer(decoder, prompt, max_tokens=60, grammar=grammar, policy="draft", k=4)
        assert spec == plain
        state = grammar.start(target)
        for c in cycles:
            assert state.allowed_prefix(c.drafted) == len(c.drafted)
            for t in c.emitted:
                if t != EOS:
                    state.accept(t)
        assert sum(c.n_accepted for c in cycles) > 0


def test_lookup_and_prediction_drafts_stop_at_their_first_forbidden_token(vocab):
    grammar = schema_grammar(SCHEMA)
    target = JsonSynthetic(vocab, seed=2)
    decoder = Decoder(target)
    # The prediction leaves the schema after '{"x":"a",': "z" is no key of it.
    predicted = target.tokenize('{"x":"a","x":"b"}')
    _, cycles = answer(decoder, target.tokenize(PROMPT), max_tokens=40, grammar=grammar, prediction=predicted,
                       policy="auto")
    state = grammar.start(target)
    for c in cycles:
        assert state.allowed_prefix(c.drafted) == len(c.drafted), c.drafted
        for t in c.emitted:
            if t != EOS:
                state.accept(t)


def _exact_answers(target, prompt, grammar, sampling, max_tokens):
    """Every answer the masked target can give, with its probability (depth first)."""
    out = {}
    stack = [((), grammar.start(target), 1.0)]
    while stack:
        seq, state, pr = stack.pop()
        if len(seq) == max_tokens or (seq and seq[-1] == EOS):
            out[seq] = out.get(seq, 0.0) + pr
            continue
        p = distribution(state.mask(target.logits_after(prompt + list(seq))), sampling)
        for t in np.flatnonzero(p > 0):
            child = state.clone()
            if t != EOS:
                child.accept(int(t))
            stack.append((seq + (int(t),), child, pr * float(p[t])))
    return out


SAMPLED = [("off", "lazy"), ("draft", "lazy"), ("lookup", "lazy"), ("errant", "lazy"),
           ("off", "small head"), ("draft", "small head"), ("lookup", "small head"), ("draft", "top-k")]


@pytest.mark.parametrize("mode, reading", SAMPLED)
def test_sampled_constrained_answers_are_distributed_as_the_masked_target(vocab, mode, reading, monkeypatch):
    """At T > 0 the answers are distributed as the masked target's, exactly: with model drafts
    (their proposal kept to what the grammar allows), lookup drafts (cut at a forbidden token) and
    uniform drafts that often hold forbidden tokens (rejected by verification: p = 0 there).

    "lazy": the masked rows are read from the likeliest tokens (here: all of them) and sampled by
    rejection; "small head": only 3 tokens are asked before the whole mask, so the bounds on the
    allowed mass settle acceptance tests or fall back to the whole mask; "top-k": every row masked
    whole, then cut."""
    import speculum.engine.grammar.state as grammar_module

    if reading == "small head":
        monkeypatch.setattr(grammar_module, "HEAD_SIZES", (3,))
    whole_masks = Counter()
    allowed = grammar_module.GrammarState.allowed
    monkeypatch.setattr(grammar_module.GrammarState, "allowed",
                        lambda self: whole_masks.update(["mask"]) or allowed(self))
    grammar = schema_grammar(SCHEMA)
    # Rejection sampling, whose reading of masked rows this is (seeded answers would otherwise be
    # drawn by Gumbel-max: test_sampling_gumbel.py holds those under a grammar).
    sampling_kw = dict(temperature=1.0, top_k=4 if reading == "top-k" else 0, top_p=1.0, coupling=Coupling.REJECTION)
    target = JsonSynthetic(vocab, seed=4, sharpness=1.0)
    prompt = target.tokenize(PROMPT)
    exact = _exact_answers(target, prompt, grammar, SamplingParams(**sampling_kw), max_tokens=24)
    assert abs(sum(exact.values()) - 1) < 1e-6
    whole_masks.clear()
    decoder = Decoder(target, json_draft(target, seed=6, noise=1.0))
    if mode == "errant":
        decoder.drafters[Source.MODEL] = ErrantDrafter(target, 0.0)
    n = 600
    seen = Counter()
    drafted = forbidden = 0
    for seed in range(n):
        out, cycles = answer(decoder, prompt, max_tokens=24, grammar=grammar, policy="draft" if mode == "errant" else mode,
                             k=4, sampling=SamplingParams(seed=seed, **sampling_kw))
        seen[tuple(out)] += 1
        drafted += sum(len(c.drafted) for c in cycles)
        forbidden += sum(c.drafted[c.n_accepted] != c.emitted[c.n_accepted] for c in cycles
                         if c.n_accepted < len(c.drafted) and len(c.emitted) > c.n_accepted)
        assert conforms(json.loads(text_of(out)), SCHEMA)
    assert mode == "off" or (drafted > n and forbidden > 0)
    if (mode, reading) == ("off", "lazy"):
        assert not whole_masks  # plain sampling under a grammar asks no whole-vocabulary mask
    if reading != "lazy":
        assert whole_masks  # the fallbacks did run
    keys = sorted(exact)
    assert sum(seen[k] for k in keys) == n  # nothing outside the masked target's answers
    assert chi_square_p([seen[k] for k in keys], [exact[k] for k in keys], n) > 0.001


def _reference_logprobs(target, prompt, grammar, tokens, penalties=None):
    state, out = grammar.start(target), []
    for i, t in enumerate(tokens):
        row = target.logits_after(prompt + tokens[:i])
        out.append(float(log_probs(state.mask(row))[t]))
        if t != EOS:
            state.accept(t)
    return out


@pytest.mark.parametrize("mode", ["draft", "lookup"])
def test_logprobs_equal_the_plain_runs_at_every_position(vocab, mode):
    grammar = schema_grammar(LIST_SCHEMA)
    inside = 0
    for seed in range(4):
        target = JsonSynthetic(vocab, seed=seed)
        prompt = target.tokenize(PROMPT)
        plain, plain_cycles = answer(Decoder(JsonSynthetic(vocab, seed=seed)), prompt, max_tokens=60,
                                     grammar=grammar, logprobs=3)
        spec, cycles = answer(Decoder(target, json_draft(target, seed=7, noise=1.0)), prompt, max_tokens=60,
                              grammar=grammar, logprobs=3, policy=mode, k=4, want_probs=True)
        assert spec == plain
        inside += sum(c.n_accepted for c in cycles)  # positions verified after accepted drafts
        flat = lambda cs, name: [x for c in cs for x in getattr(c, name)]  # noqa: E731
        for name in ("logprobs", "top_tokens", "top_logprobs"):
            assert flat(cycles, name) == flat(plain_cycles, name), name
        assert len(flat(cycles, "logprobs")) == len(spec)
        # what the window shows is the same masked distribution
        assert np.allclose(flat(cycles, "p_emitted"), np.exp(flat(cycles, "logprobs")), atol=1e-5)
        assert np.allclose(flat(cycles, "logprobs"), _reference_logprobs(target, prompt, grammar, spec), atol=1e-6)
        for tops, token, lp in zip(flat(cycles, "top_tokens"), spec, flat(cycles, "logprobs")):
            assert len(tops) <= 3 and (token in tops or lp <= min(flat(cycles, "top_logprobs")[0]))
    assert inside > 0


def test_sampled_logprobs_are_the_masked_targets_at_temperature_one(vocab):
    grammar = schema_grammar(SCHEMA)
    target = JsonSynthetic(vocab, seed=8)
    prompt = target.tokenize(PROMPT)
    out, cycles = answer(Decoder(target, json_draft(target, seed=2, noise=1.0)), prompt, max_tokens=40,
                         grammar=grammar, logprobs=0, policy="draft", k=4,
                         sampling=SamplingParams(temperature=0.7, top_k=3, seed=1))
    got = [x for c in cycles for x in c.logprobs]
    assert np.allclose(got, _reference_logprobs(target, prompt, grammar, out), atol=1e-6)


PENALTIES = [dict(presence_penalty=1.5), dict(frequency_penalty=0.8), dict(repeat_penalty=1.6, repeat_last_n=8),
             dict(presence_penalty=0.5, frequency_penalty=0.5, repeat_penalty=1.3)]


@pytest.mark.parametrize("penalty", PENALTIES, ids=lambda p: ",".join(p))
@pytest.mark.parametrize("mode", ["draft", "lookup"])
def test_penalised_speculation_equals_penalised_plain(vocab, penalty, mode):
    sampling = SamplingParams(**penalty)
    changed, accepted = False, 0
    for seed in range(4):
        target = JsonSynthetic(vocab, seed=seed, order=1)
        prompt = target.tokenize(PROMPT)
        unpenalised, _ = answer(Decoder(JsonSynthetic(vocab, seed=seed, order=1)), prompt, max_tokens=50)
        plain, _ = answer(Decoder(JsonSynthetic(vocab, seed=seed, order=1)), prompt, max_tokens=50,
                          sampling=sampling)
        spec, cycles = answer(Decoder(target, json_draft(target, seed=3, noise=0.5)), prompt, max_tokens=50,
                              sampling=sampling, policy=mode, k=4)
        assert spec == plain
        accepted += sum(c.n_accepted for c in cycles)
        changed |= plain != unpenalised
    assert changed and accepted > 0  # the penalties did shape the answers, under speculation


def test_penalties_with_a_grammar_and_logprobs_equal_plain(vocab):
    sampling = SamplingParams(presence_penalty=1.0, frequency_penalty=0.5)
    grammar = schema_grammar(LIST_SCHEMA)
    target = JsonSynthetic(vocab, seed=5)
    prompt = target.tokenize(PROMPT)
    plain, plain_cycles = answer(Decoder(JsonSynthetic(vocab, seed=5)), prompt, max_tokens=60, grammar=grammar,
                                 sampling=sampling, logprobs=2)
    spec, cycles = answer(Decoder(target, json_draft(target, seed=3, noise=0.5)), prompt, max_tokens=60,
                          grammar=grammar, sampling=sampling, logprobs=2, policy="draft", k=4)
    assert spec == plain
    assert [x for c in cycles for x in c.logprobs] == [x for c in plain_cycles for x in c.logprobs]


def test_the_end_of_generation_comes_only_where_the_grammar_is_complete(vocab):
    """A model that wants to stop at once still writes a whole object, then stops."""

    class EagerToStop(JsonSynthetic):
        def logits_after(self, history):
            row = super().logits_after(history)
            row[EOS] += 50.0
            return row

    grammar = schema_grammar(SCHEMA)
    target = EagerToStop(vocab, seed=1)
    out, cycles = answer(Decoder(target), target.tokenize(PROMPT), max_tokens=40, grammar=grammar)
    assert out[-1] == EOS and EOS not in out[:-1] and cycles[-1].finish == "eog"
    assert conforms(json.loads(text_of(out)), SCHEMA)
    unconstrained, _ = answer(Decoder(EagerToStop(vocab, seed=1)), target.tokenize(PROMPT), max_tokens=40)
    assert unconstrained == [EOS]


# -- the grammar itself and response_format ----------------------------------------------------

def test_a_grammar_state_refuses_a_forbidden_token_without_harm(vocab):
    target = JsonSynthetic(vocab)
    state = schema_grammar(SCHEMA).start(target)
    brace, quote, x = PIECES.index("{"), PIECES.index('"'), PIECES.index("x")
    with pytest.raises(ValueError):
        state.accept(x)  # llama.cpp would abort the process on this
    with pytest.raises(ValueError):
        state.accept(EOS)  # not complete yet
    state.accept(brace)
    copy = state.clone()
    copy.accept(quote)
    assert state.allows(quote) and not copy.allows(quote) and copy.allows(x)  # the clone walked alone
    assert not state.allows(-1) and not state.allows(len(PIECES))
    mask = state.allowed()
    assert mask.dtype == bool and mask[quote] and not mask[x]
    row = np.arange(len(PIECES), dtype=np.float32)
    assert state.best(row) == max(np.flatnonzero(mask))


def test_greedy_pick_checks_the_whole_vocabulary_when_the_favourites_are_forbidden(vocab):
    """On a large vocabulary the greedy token is found among the likeliest first; when none of
    them is allowed it still equals the argmax of the fully masked row (ties: lowest id)."""
    target = JsonSynthetic(vocab)
    state = schema_grammar(SCHEMA).start(target)
    rng = np.random.default_rng(0)
    for _ in range(50):
        row = rng.integers(-3, 3, len(PIECES)).astype(np.float32)  # many ties
        masked = state.mask(row)
        assert state.best(row) == int(np.argmax(masked))


@pytest.mark.parametrize("response_format", [None, {"type": "text"}])
def test_free_text_formats_have_no_grammar(response_format):
    assert grammar_for_response_format(response_format) is None


def test_response_formats_give_grammars():
    assert grammar_for_response_format({"type": "json_object"}) == json_object_grammar()
    g = grammar_for_response_format({"type": "json_schema", "json_schema": {"name": "p", "strict": True,
                                                                             "schema": SCHEMA}})
    assert isinstance(g, Grammar) and '"\\"x\\""' in g.gbnf
    # pydantic's shape: $defs, $ref and optional fields (anyOf with null)
    pydantic_like = {"$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}},
                                        "required": ["n"]}},
                     "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
                                                      "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
                     "required": ["items"]}
    assert schema_grammar(pydantic_like) is not None
    assert grammar_for_response_format({"type": "json_schema", "json_schema": {"name": "any"}}) == json_object_grammar()


@pytest.mark.parametrize("response_format, words", [
    ({"type": "xml"}, "not supported"),
    ("json", "must be an object"),
    ({"type": "json_schema"}, "json_schema must be an object"),
    ({"type": "json_schema", "json_schema": {"schema": []}}, "must be an object"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "tuple"}}}, "cannot be enforced"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "array", "items": {}, "maxItems": 5000}}},
     "maxItems"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "a{1,100000}"}}}, "pattern"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "string", "minLength": "3"}}}, "whole numbers"),
    ({"type": "json_schema", "json_schema": {"schema": {"$ref": "https://example.com/s.json"}}}, "cannot be enforced"),
    ({"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/missing"}}}, "cannot be enforced"),
])
def test_unsupported_or_invalid_formats_are_refused_in_words(response_format, words):
    with pytest.raises(ValueError) as err:
        grammar_for_response_format(response_format)
    assert words in str(err.value)


def test_a_deeply_nested_schema_is_refused():
    schema = {"type": "string"}
    for _ in range(200):
        schema = {"type": "array", "items": schema}
    with pytest.raises(ValueError, match="nests deeper"):
        schema_grammar(schema)


# Patterns whose grammar would stall llama.cpp for seconds to hours a token (each optional piece a
# character may fall into multiplies the work of checking the vocabulary), or write megabytes.
HOSTILE_PATTERNS = ["^(a?){1000}$", "^((a?){10}){10}$", "^(.?){6}(.?){6}(.?){6}$", "^((.?){3}.){20}$",
                    "^(.{0,3}){12}$", "^(a|b?){60}$", "^([a-z]?){60}$", "^" + "(" * 4000 + "a" + ")" * 4000 + "$",
                    "^a{0,1000}" + "b?" * 6 + "$", "^a{2000}$", "^a{1,", "^a)(.?){1000}$"]


@pytest.mark.parametrize("pattern", HOSTILE_PATTERNS, ids=lambda p: p[:24])
def test_a_hostile_pattern_is_refused_before_any_grammar_is_written(pattern, monkeypatch):
    import llama_cpp.llama_grammar

    def never(*_):
        raise AssertionError("the converter ran")

    monkeypatch.setattr(llama_cpp.llama_grammar, "json_schema_to_gbnf", never)
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}}
    with pytest.raises(ValueError) as err:
        schema_grammar(schema)
    assert "properties.code.pattern" in str(err.value)


def test_many_counts_that_would_write_megabytes_of_grammar_are_refused():
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 1000} for i in range(60)}}
    with pytest.raises(ValueError, match="more than 1,000,000 characters"):
        schema_grammar(schema)


@pytest.mark.parametrize("pattern", [
    r"^([0-9]{1,3}[.]){3}[0-9]{1,3}$", r"^(https?://)?([a-z0-9-]+[.])+[a-z]+(/[a-z0-9 ./?%&=-]*)?$",
    r"^\+?[0-9]{1,3}[- ]?[0-9]{3}[- ]?[0-9]{4}$", r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
    r"^[A-Z][a-z]{1,20}( [A-Z][a-z]{1,20}){0,3}$", r"^ *-?[0-9]+([.][0-9]+)? *$", "^[a-z]{0,1000}$", "^(.?)*$",
    "^.*.*.*.*.*.*$", "^(.?){6}$"])
def test_everyday_patterns_are_still_enforced(pattern):
    assert schema_grammar({"type": "string", "pattern": pattern}).gbnf


@pytest.mark.parametrize("gbnf, words", [('root ::= "a" [0-9+', "does not parse"),
                                         ("root ::= foo", "does not parse"), ("", "empty"),
                                         ('root ::= root "a" | "b"', "does not parse")])
def test_a_bad_grammar_is_refused_in_words(gbnf, words):
    with pytest.raises(ValueError, match=words):
        Grammar(gbnf)


def test_a_grammar_on_a_model_without_a_llama_vocabulary_is_refused_in_words():
    from synthetic import SyntheticModel

    with pytest.raises(ValueError, match="no llama.cpp vocabulary"):
        list(Decoder(SyntheticModel()).generate([1, 2], grammar=json_object_grammar()))
