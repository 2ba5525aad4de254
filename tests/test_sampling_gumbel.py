"""Drafter-invariant sampling (issue 46): with a seed, each token is the Gumbel-max of its row
under noise keyed by (seed, position, token), and the draft proposes with the same noise. The
noise function and the draw are pure logic; the decoding checks run on the deterministic
synthetic model (and under a real llama.cpp grammar over a synthetic model's vocabulary)."""

from __future__ import annotations

import numpy as np
import pytest

from grammar_vocab import LlamaVocab, JsonSynthetic, json_draft, write_vocab
from speculum.engine.decoder import Decoder
from speculum.engine.grammar.schema import grammar_for_response_format
from speculum.engine.sampling import (GUMBEL_CEILING, Coupling, SamplingParams, distribution, gumbel_max,
                                      gumbel_noise)
from synthetic import SyntheticModel, noisy_copy
from test_exactness_synthetic import chi_square_p

EULER_GAMMA = 0.5772156649


def tokens_of(decoder, prompt, **kw):
    return [t for c in decoder.generate(prompt, **kw) for t in c.emitted]


# -- the noise ---------------------------------------------------------------------------------

def test_noise_is_a_function_of_seed_position_and_token_alone():
    ids = np.arange(50_000)
    g = gumbel_noise(7, 12, ids)
    assert np.array_equal(g, gumbel_noise(7, 12, ids))  # deterministic
    picked = np.array([49_999, 3, 17, 3])
    assert np.array_equal(gumbel_noise(7, 12, picked), g[picked])  # whoever asks, in any order
    for other in (gumbel_noise(8, 12, ids), gumbel_noise(7, 13, ids), gumbel_noise(-7, 12, ids)):
        assert np.mean(other == g) < 1e-3  # keyed by the seed and the position
        assert abs(np.corrcoef(other, g)[0, 1]) < 0.02
    assert len(np.unique(g)) > 0.99 * len(ids)  # and by the token
    assert abs(np.corrcoef(g[:-1], g[1:])[0, 1]) < 0.02  # neighbouring tokens independent


def test_noise_is_standard_gumbel():
    g = np.concatenate([gumbel_noise(seed, pos, np.arange(20_000)) for seed in (0, 1, 2**40) for pos in (0, 5, 9)])
    assert abs(g.mean() - EULER_GAMMA) < 0.01
    assert abs(g.var() - np.pi ** 2 / 6) < 0.03
    assert g.max() <= GUMBEL_CEILING
    u = np.exp(-np.exp(-g))  # back to the uniforms: flat over 20 bins
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    assert chi_square_p(counts, np.full(20, 1 / 20), len(u)) > 0.001


# -- the draw ----------------------------------------------------------------------------------

FILTERS = [dict(temperature=0.8), dict(temperature=1.3, top_k=40), dict(temperature=0.7, top_p=0.9),
           dict(temperature=1.0, min_p=0.05), dict(temperature=0.5, top_k=100, top_p=0.95, min_p=0.01)]


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ",".join(f))
def test_the_draw_is_the_argmax_of_the_whole_perturbed_row(filters):
    """Only the tokens near the top get their noise: the result is still the argmax over all."""
    rng = np.random.default_rng(3)
    n = 20_000
    for trial in range(40):
        logits = (rng.standard_normal(n) * rng.uniform(0.5, 6)).astype(np.float32)
        params = SamplingParams(seed=int(rng.integers(1 << 62)), **filters)
        position = int(rng.integers(10_000))
        whole = np.multiply(logits, 1 / params.temperature, dtype=np.float32)
        whole[distribution(logits, params) == 0] = -np.inf
        whole = whole + gumbel_noise(params.seed, position, np.arange(n)).astype(np.float32)
        assert gumbel_max(logits, params, position) == int(np.argmax(whole)), trial
        if params.filtered:
            continue  # (a grammar's row with filters is masked whole first: verify.TargetRows.gumbel)
        # under a grammar that forbids most tokens, asked about the likeliest first
        allowed = rng.random(n) < 0.05
        asked = []

        def allows(tokens):
            asked.append(len(tokens))
            return allowed[tokens]

        whole[~allowed] = -np.inf
        assert gumbel_max(logits, params, position, allows=allows) == int(np.argmax(whole)), trial


def test_a_peaked_row_draws_from_its_head():
    """As a language model's row: a few likely tokens far above the rest. Only they get noise,
    and a grammar is asked about a few of them, never about the whole vocabulary."""
    rng = np.random.default_rng(4)
    n = 150_000
    logits = rng.standard_normal(n).astype(np.float32)
    logits[rng.choice(n, 30, replace=False)] += 30
    asked = []

    def allows(tokens):
        asked.append(len(tokens))
        return tokens % 3 == 0

    for seed in range(20):
        params = SamplingParams(temperature=0.8, seed=seed)
        whole = logits / np.float32(0.8) + gumbel_noise(seed, 0, np.arange(n)).astype(np.float32)
        whole[np.arange(n) % 3 != 0] = -np.inf
        assert gumbel_max(logits, params, 0, allows=allows) == int(np.argmax(whole))
    assert max(asked) <= 64


def test_the_draw_follows_the_filtered_distribution():
    logits = np.array([2.0, 1.5, 1.0, 0.2, -0.5, -3.0], dtype=np.float32)
    for params in (SamplingParams(temperature=0.7, top_k=4), SamplingParams(temperature=1.2, top_p=0.9)):
        p = distribution(logits, params)
        n = 6000
        counts = np.bincount([gumbel_max(logits, SamplingParams(**{**params.__dict__, "seed": s}), 0)
                              for s in range(n)], minlength=len(logits))
        assert np.all(counts[p == 0] == 0)
        assert chi_square_p(counts, p, n) > 0.001
        # positions, too, are independent draws
        counts = np.bincount([gumbel_max(logits, SamplingParams(**{**params.__dict__, "seed": 5}), pos)
                              for pos in range(n)], minlength=len(logits))
        assert chi_square_p(counts, p, n) > 0.001


def test_a_seed_picks_drafter_invariant_sampling_unless_told():
    assert SamplingParams(temperature=0.8, seed=1).drafter_invariant
    assert not SamplingParams(temperature=0.8).drafter_invariant
    assert not SamplingParams(temperature=0.0, seed=1).drafter_invariant  # greedy is greedy
    assert not SamplingParams(temperature=0.8, seed=1, coupling=Coupling.REJECTION).drafter_invariant
    assert SamplingParams(temperature=0.8, coupling=Coupling.GUMBEL).drafter_invariant


# -- decoding ----------------------------------------------------------------------------------

SEEDED = [dict(temperature=0.8), dict(temperature=1.0, top_k=5), dict(temperature=0.8, top_p=0.9, min_p=0.02),
          dict(temperature=0.9, presence_penalty=0.7, repeat_penalty=1.3)]


@pytest.mark.parametrize("sampled", SEEDED, ids=lambda f: ",".join(f))
def test_every_mode_writes_plain_decoding_s_answer_for_a_seed(sampled):
    prompt = [1, 2, 3, 4, 1, 2, 3]
    for seed in range(4):
        sampling = SamplingParams(seed=seed, **sampled)
        plain = tokens_of(Decoder(SyntheticModel(n_vocab=12, seed=1, order=1)), prompt, max_tokens=60,
                          sampling=sampling)
        target = SyntheticModel(n_vocab=12, seed=1, order=1)
        drafted = 0
        for noise in (0.3, 2.0):
            decoder = Decoder(target, noisy_copy(target, seed=5, noise=noise))
            for mode, k in (("draft", 4), ("draft", None), ("lookup", 3), ("auto", None)):
                cycles = list(decoder.generate(prompt, max_tokens=60, policy=mode, k=k, sampling=sampling))
                assert [t for c in cycles for t in c.emitted] == plain, (seed, noise, mode, k)
                drafted += sum(len(c.drafted) for c in cycles)
        assert drafted > 60
        other = tokens_of(Decoder(SyntheticModel(n_vocab=12, seed=1, order=1)), prompt, max_tokens=60,
                          sampling=SamplingParams(seed=seed + 100, **sampled))
        assert other != plain  # the seed is what holds it


def test_rejection_sampling_s_seeded_answer_depends_on_the_drafts():
    """Why the coupling: with rejection sampling one stream of draws is spent as the drafts go,
    so the same seed gives another answer in another mode."""
    prompt = [1, 2, 3]
    parted = 0
    for seed in range(4):
        sampling = SamplingParams(temperature=0.8, seed=seed, coupling=Coupling.REJECTION)
        plain = tokens_of(Decoder(SyntheticModel(n_vocab=12, seed=1)), prompt, max_tokens=40, sampling=sampling)
        target = SyntheticModel(n_vocab=12, seed=1)
        spec = tokens_of(Decoder(target, noisy_copy(target, seed=5, noise=1.0)), prompt, max_tokens=40,
                         policy="draft", k=4, sampling=sampling)
        parted += spec != plain
    assert parted >= 3


def test_a_good_draft_is_mostly_kept():
    """The coupling accepts a drafted token iff the draft's perturbed argmax is the target's: a
    draft model close to the target is kept almost always, a poor one seldom."""
    target = SyntheticModel(n_vocab=64, seed=2, sharpness=2.0)
    rates = {}
    for noise in (0.05, 3.0):
        decoder = Decoder(target, noisy_copy(target, seed=9, noise=noise))
        cycles = list(decoder.generate([1, 2], max_tokens=200, policy="draft", k=4,
                                       sampling=SamplingParams(temperature=1.0, seed=4)))
        rates[noise] = sum(c.n_accepted for c in cycles) / sum(len(c.drafted) for c in cycles)
    assert rates[0.05] > 0.9 and rates[3.0] < 0.5, rates


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return LlamaVocab(write_vocab(tmp_path_factory.mktemp("vocab") / "json-pieces.gguf"))


SCHEMA = {"type": "object", "properties": {"x": {"type": "array", "items": {"enum": ["a", "ab", "b", "c"]},
                                                  "maxItems": 6}, "y": {"type": "boolean"}}, "required": ["x", "y"]}


@pytest.mark.parametrize("filtered", [False, True])
def test_a_grammar_constrained_answer_is_plain_decoding_s_for_a_seed(vocab, filtered):
    grammar = grammar_for_response_format({"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}})
    sampled = dict(temperature=1.0, top_k=6) if filtered else dict(temperature=1.0)
    answers = set()
    for seed in range(5):
        sampling = SamplingParams(seed=seed, **sampled)
        target = JsonSynthetic(vocab, seed=seed)
        prompt = target.tokenize('{"x":["a","ab","c"],"y":true}{"x":["b"],"y":false}')
        plain = tokens_of(Decoder(JsonSynthetic(vocab, seed=seed)), prompt, max_tokens=40, grammar=grammar,
                          sampling=sampling)
        for mode in ("draft", "lookup"):
            decoder = Decoder(target, json_draft(target, seed=7, noise=1.0))
            spec = tokens_of(decoder, prompt, max_tokens=40, grammar=grammar, policy=mode, k=4, sampling=sampling)
            assert spec == plain, (seed, mode)
        answers.add(tuple(plain))
    assert len(answers) > 2
