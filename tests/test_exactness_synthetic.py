"""The algorithm is exact: proven on a deterministic synthetic model (no llama.cpp numerics)."""

import numpy as np
import pytest

from speculum.engine.decoder import Decoder
from speculum.engine.drafting.draft import Draft, Drafter
from speculum.engine.sampling import SamplingParams, distribution
from speculum.engine.verify import verify
from speculum.engine.vocabulary import Source
from synthetic import SyntheticModel, noisy_copy


def run(decoder, prompt, **kw):
    cycles = list(decoder.generate(prompt, **kw))
    return [t for c in cycles for t in c.emitted], cycles


@pytest.mark.parametrize("noise", [0.0, 0.5, 2.0, 8.0])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_model_draft_equals_plain(noise, k):
    target = SyntheticModel(n_vocab=16, seed=1)
    plain, _ = run(Decoder(SyntheticModel(n_vocab=16, seed=1)), [1, 2, 3], max_tokens=80, policy="off")
    spec, cycles = run(Decoder(target, noisy_copy(target, seed=5, noise=noise)), [1, 2, 3],
                       max_tokens=80, policy="draft", k=k)
    assert spec == plain
    assert len(spec) == 80
    drafted = sum(len(c.drafted) for c in cycles)
    accepted = sum(c.n_accepted for c in cycles)
    assert drafted > 0
    if noise == 0.0:
        assert accepted == drafted  # a perfect draft is always accepted
    if noise == 8.0:
        assert accepted < drafted


def test_greedy_random_drafts_of_every_quality_equal_plain():
    """Drafts from a random proposer (right with probability a) never change greedy output."""
    target = SyntheticModel(n_vocab=10, seed=3)
    plain, _ = run(Decoder(SyntheticModel(n_vocab=10, seed=3)), [4, 5], max_tokens=60, policy="off")
    for quality in (0.0, 0.3, 0.7, 1.0):
        rng = np.random.default_rng(int(quality * 10))
        dec = Decoder(target)

        class RandomDrafter(Drafter):
            source = Source.MODEL

            @classmethod
            def build(cls, inputs):
                return None  # (put in place by hand below)

            def propose(self, context, k, choice, sampling, rng_):
                ctx = list(context)
                out = []
                for _ in range(k):
                    best = int(np.argmax(target.logits_after(ctx)))
                    tok = best if rng.random() < quality else int(rng.integers(target.n_vocab))
                    out.append(tok)
                    ctx.append(tok)
                return Draft(out, Source.MODEL)

        dec.drafters[Source.MODEL] = RandomDrafter()  # replaces the registered model drafter
        spec, cycles = run(dec, [4, 5], max_tokens=60, policy="draft", k=4)
        assert spec == plain, quality


@pytest.mark.parametrize("mode", ["auto", "draft", "lookup"])
def test_adaptive_modes_equal_plain(mode):
    target = SyntheticModel(n_vocab=8, seed=9, order=1)
    plain, _ = run(Decoder(SyntheticModel(n_vocab=8, seed=9, order=1)), [1, 2, 3], max_tokens=90, policy="off")
    spec, _ = run(Decoder(target, noisy_copy(target, seed=3, noise=1.0)), [1, 2, 3], max_tokens=90, policy=mode)
    assert spec == plain


def test_greedy_lookup_equals_plain():
    target = SyntheticModel(n_vocab=6, seed=7, order=1)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 0, 1, 2]
    plain, _ = run(Decoder(SyntheticModel(n_vocab=6, seed=7, order=1)), prompt, max_tokens=70, policy="off")
    spec, cycles = run(Decoder(target), prompt, max_tokens=70, policy="lookup", k=5)
    assert spec == plain
    assert any(c.source == "lookup" for c in cycles)
    assert sum(c.n_accepted for c in cycles) > 0


def chi_square_p(observed, expected_probs, n):
    from math import fsum
    exp = np.asarray(expected_probs) * n
    mask = exp > 5
    stat = fsum(((np.asarray(observed)[mask] - exp[mask]) ** 2 / exp[mask]).tolist())
    dof = int(mask.sum()) - 1
    # Wilson–Hilferty approximation of the chi-square upper tail (no scipy needed).
    from math import erf, sqrt
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / sqrt(2 / (9 * dof))
    return 0.5 * (1 - erf(z / sqrt(2)))


@pytest.mark.parametrize("drafter", ["draft", "lookup"])
def test_sampled_distribution_matches_target(drafter):
    """Over many seeded runs, the token after 4 generated steps is distributed as the target's."""
    V = 6
    sampling_kw = dict(temperature=1.0, top_k=0, top_p=1.0)
    target = SyntheticModel(n_vocab=V, seed=11, order=1, sharpness=1.2)
    draft = noisy_copy(target, seed=12, noise=1.5)
    prompt = [0, 1, 2, 3, 4, 5, 0, 1, 2]
    steps = 4  # the first token is plain: three more, two of them drafted together
    # Exact distribution of the sequence after `steps` tokens, by enumeration (order-1 chain).
    params = SamplingParams(**sampling_kw)
    probs = {(): 1.0}
    for _ in range(steps):
        nxt = {}
        for seq, pr in probs.items():
            p = distribution(target.logits_after(prompt + list(seq)), params)
            for t in range(V):
                nxt[seq + (t,)] = nxt.get(seq + (t,), 0.0) + pr * p[t]
        probs = nxt
    last_token = np.zeros(V)
    for seq, pr in probs.items():
        last_token[seq[-1]] += pr
    n = 3000
    counts = np.zeros(V)
    joint = {}
    dec = Decoder(target, draft if drafter == "draft" else None)
    drafted = 0
    for seed in range(n):
        out = []
        for c in dec.generate(prompt, max_tokens=steps, policy=drafter, k=3,
                              sampling=SamplingParams(seed=seed, **sampling_kw)):
            out.extend(c.emitted)
            drafted += len(c.drafted)
        assert len(out) == steps
        counts[out[-1]] += 1
        joint[tuple(out)] = joint.get(tuple(out), 0) + 1
    assert drafted > n  # speculation really happened
    assert chi_square_p(counts, last_token, n) > 0.001
    keys = sorted(probs)
    assert chi_square_p([joint.get(s, 0) for s in keys], [probs[s] for s in keys], n) > 0.001


def test_verify_sampled_rejects_and_resamples_from_residual():
    """One position, q puts mass on a token p never picks: it must always be rejected."""
    p_logits = np.array([[5.0, 0.0, -50.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    q = np.array([[0.0, 0.0, 1.0]])
    rng = np.random.default_rng(0)
    for _ in range(50):
        v = verify(p_logits, Draft([2], "model", q), SamplingParams(temperature=1.0), rng)
        assert v.n_accepted == 0 and v.tokens[0] in (0, 1)


def test_sampling_filters_shape_p_and_q_alike():
    logits = np.array([3.0, 2.0, 1.0, 0.0, -1.0])
    p = distribution(logits, SamplingParams(temperature=1.0, top_k=2))
    assert np.count_nonzero(p) == 2 and abs(p.sum() - 1) < 1e-12
    p = distribution(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert np.count_nonzero(p) == 2
    p = distribution(logits, SamplingParams(temperature=1.0, min_p=0.3))
    assert np.count_nonzero(p) == 2
    big = np.random.default_rng(0).standard_normal(5000) * 0.01  # flat: top-p needs the full sort
    p = distribution(big, SamplingParams(temperature=1.0, top_p=0.9))
    assert 4000 < np.count_nonzero(p) < 5000


def test_each_generation_keeps_its_own_stats_and_prompt_size():
    """A generation's numbers travel with it: a later generation on the same decoder (the next
    part of a summary, the next API request) leaves the earlier one's stats as they were."""
    target = SyntheticModel(n_vocab=16, seed=1)
    decoder = Decoder(target, noisy_copy(target, seed=5, noise=0.5))
    first = decoder.generate([1, 2, 3, 4, 5], max_tokens=30, policy="draft", k=3)
    first_cycles = list(first)
    second = decoder.generate([9, 8], max_tokens=10, policy="off")
    next(second)  # the second has read its prompt and made a pass
    assert first.prompt_total == 5 and second.prompt_total == 2
    assert first.stats.tokens == sum(len(c.emitted) for c in first_cycles) == 30
    assert first.stats.drafted == sum(len(c.drafted) for c in first_cycles) > 0
    assert second.stats.tokens == 1 and second.stats.drafted == 0
    list(second)
    assert first.stats.tokens == 30 and second.stats.tokens == 10


def test_the_synthetic_stand_in_is_a_backend_and_lacks_only_what_llama_cpp_alone_has(smollm):
    """Both models implement every call the engine makes; what a backend may lack has a
    declared default that says so, and the engine asks it plainly."""
    from speculum.engine.backend import Backend
    from speculum.errors import SpeculumError

    required = ("decode", "prefill", "trim", "is_eog", "token_bytes", "token_text", "tokenize")
    for model in (SyntheticModel(), smollm):
        assert isinstance(model, Backend)
        assert all(getattr(type(model), name) is not getattr(Backend, name) for name in required), type(model)
    stand_in = SyntheticModel()
    assert (stand_in.has_mtp, stand_in.max_rollback, stand_in.path, stand_in.facts) == (False, None, None, None)
    assert smollm.path is not None and smollm.facts.backend == "CPU" and not smollm.has_mtp
    with pytest.raises(SpeculumError, match="MTP"):
        Decoder(stand_in).policy_for("mtp")  # no MTP head: the plain-words error, not an AttributeError


@pytest.mark.parametrize("policy", ["off", "draft", "lookup", "auto"])
def test_every_policy_writes_its_first_token_from_one_plain_pass(policy):
    # llama-server's way: the prompt's last chunk holds its last token and gives the first token's
    # row, so a cold prompt's first token waits for no pass of its own. A repeated (cached) prompt's
    # takes the row kept from that read: no pass at all, and no draft or wider verification pass
    # first. Drafting starts after it, and the tokens are plain decoding's.
    target = SyntheticModel(n_vocab=64, seed=3, order=3)
    draft = noisy_copy(target, seed=5, noise=0.5)
    dec = Decoder(target, draft)
    prompt = [t % 64 for t in range(1, 300)]  # three 128-token chunks when someone watches the progress
    plain = [t for c in Decoder(SyntheticModel(n_vocab=64, seed=3, order=3)).generate(prompt, max_tokens=30,
                                                                                     policy="off") for t in c.emitted]
    read = []
    cycles = list(dec.generate(prompt, max_tokens=30, policy=policy, on_prompt=lambda n, total: read.append(n)))
    assert [t for c in cycles for t in c.emitted] == plain
    assert target.passes == 3 + len(cycles) - 1  # the prompt's chunks, then one a cycle after the first
    assert read[-1] >= len(prompt) - 1 and dec.stats.prompt_tokens == len(prompt) - 1  # counted as before
    assert (cycles[0].drafted, cycles[0].emitted) == ([], plain[:1])

    before, drafted_before = target.passes, draft.passes
    again = dec.generate(prompt, max_tokens=30, policy=policy)
    first = next(again)
    assert first.emitted == plain[:1] and first.drafted == []
    assert target.passes == before and draft.passes == drafted_before  # from the kept row: no pass, no draft
    assert plain[:1] + [t for c in again for t in c.emitted] == plain
    if policy in ("draft", "lookup"):  # (auto weighs costs this stand-in does not have)
        assert any(c.drafted for c in cycles[1:])  # drafting began after the first token


