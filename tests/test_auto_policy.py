"""Auto mode's policy, driven by synthetic models and a fake clock under two machine profiles."""

from typing import Sequence

import numpy as np

from speculum.engine.auto import AutoPolicy, CostModel, expected_tokens
from speculum.engine.decoder import Decoder
from synthetic import FakeClock, SyntheticModel, noisy_copy

# Seconds per pass with n tokens in the batch.
CPU = dict(verify=lambda n: 0.030 * (1 + 0.5 * (n - 1)), draft=lambda n: 0.020 * n)  # 0.67 of a step
GPU = dict(verify=lambda n: 0.010 * (1 + 0.02 * (n - 1)), draft=lambda n: 0.001 * n)


def make_pair(profile, noise=0.0, seed=1, collapse_after=None):
    # A wide vocabulary and order-3 logits: the text rarely repeats, so lookup has little to copy.
    clock = FakeClock()
    target = SyntheticModel(n_vocab=64, seed=seed, order=3, sharpness=4.0, pass_cost=profile["verify"], clock=clock)
    draft = noisy_copy(target, seed=seed + 100, noise=noise)
    if collapse_after is not None:
        base = draft.logits_after

        def logits_after(history: Sequence[int]) -> np.ndarray:
            if len(history) > collapse_after:  # from here on the draft is useless
                return -target.logits_after(history)
            return base(history)

        draft.logits_after = logits_after
    draft.pass_cost, draft.clock = profile["draft"], clock
    return Decoder(target, draft, clock=clock)


def run(decoder, mode, n=120, prompt=(1, 2, 3)):
    return list(decoder.generate(list(prompt), max_tokens=n, policy=mode))


def test_cpu_profile_prefers_plain_decoding_even_with_a_good_draft():
    dec = make_pair(CPU, noise=0.0)
    cycles = run(dec, "auto")
    model_cycles = [c for c in cycles if c.source == "model"]
    assert len(model_cycles) <= 2, [c.source for c in cycles[:10]]
    assert all(c.k == 0 or c.source == "lookup" for c in cycles[3:])
    # Never slower than plain: same tokens, no more time than plain decoding needs.
    plain = make_pair(CPU)
    run(plain, "off")
    assert dec.stats.tokens == plain.stats.tokens
    assert dec.stats.seconds <= plain.stats.seconds * 1.03


def test_gpu_profile_drafts_long_with_a_good_draft():
    dec = make_pair(GPU, noise=0.0)
    cycles = run(dec, "auto", n=200)
    late = cycles[5:]
    assert all(c.source == "model" and c.k >= 3 for c in late[:-1]), [(c.source, c.k) for c in late[:8]]
    plain = make_pair(GPU)
    run(plain, "off", n=200)
    assert dec.stats.tokens_per_s > 2.5 * plain.stats.tokens_per_s


def test_backs_off_within_a_few_cycles_when_acceptance_collapses():
    dec = make_pair(GPU, noise=0.0, collapse_after=60)
    cycles = run(dec, "auto", n=200)
    after = [c for c in cycles if c.n_generated > 60 + 8]
    first_bad = next(i for i, c in enumerate(cycles) if c.n_generated > 60)
    # Within a few cycles of the collapse the model is no longer drafting.
    drafting = [c.source == "model" for c in cycles[first_bad:first_bad + 12]]
    assert drafting.index(False) <= 5, drafting
    assert sum(c.source == "model" for c in after) <= len(after) * 0.2


def test_forced_draft_mode_adapts_k_but_keeps_drafting():
    dec = make_pair(CPU, noise=0.0)
    cycles = run(dec, "draft")
    assert all(c.source == "model" and 1 <= c.k for c in cycles[:-1])
    ks = {c.k for c in cycles[3:-1]}
    assert max(ks) <= 2  # on the CPU profile long drafts do not pay


def test_lookup_pays_on_cpu_for_copy_heavy_text():
    # The prompt holds the very text the target will write next: a verbatim copy.
    def model(clock):
        return SyntheticModel(n_vocab=64, seed=4, order=2, sharpness=6.0, pass_cost=CPU["verify"], clock=clock)

    text = [t for c in Decoder(model(None)).generate([7, 8], max_tokens=150, policy="off") for t in c.emitted]
    prompt = [7, 8] + text + [7, 8]
    clock = FakeClock()
    dec = Decoder(model(clock), None, clock=clock)
    cycles = list(dec.generate(prompt, max_tokens=140, policy="auto"))
    assert sum(c.source == "lookup" for c in cycles) > len(cycles) / 2
    assert max(c.k for c in cycles) >= 3  # the proposal length follows the measured acceptance
    clock2 = FakeClock()
    plain = Decoder(model(clock2), clock=clock2)
    list(plain.generate(prompt, max_tokens=140, policy="off"))
    assert dec.stats.tokens_per_s > 1.5 * plain.stats.tokens_per_s


def test_cost_model_interpolates_and_the_formula():
    c = CostModel()
    c.observe_verify(1, 1.0)
    c.observe_verify(5, 3.0)
    assert c.verify(3) == 2.0
    assert c.verify(9) == 5.0
    assert expected_tokens([]) == 1.0
    assert abs(expected_tokens([0.5, 0.5]) - 1.75) < 1e-12


def test_policy_is_remembered_between_runs(tmp_path):
    dec = make_pair(CPU)
    policy = AutoPolicy(dec.drafters, store=tmp_path / "p.json", clock=dec.clock)
    list(dec.generate([1, 2, 3], max_tokens=30, policy=policy))
    assert (tmp_path / "p.json").is_file()
    again = AutoPolicy(make_pair(CPU).drafters, store=tmp_path / "p.json")
    assert abs(again.costs.verify(1) - 0.030) < 0.003
    assert again.costs.verify(5) > 2 * again.costs.verify(1)


def test_auto_mode_picks_k_itself_even_when_a_fixed_k_is_given():
    # `speculum bench --fixed-k` runs every mode with k: auto must not fail on it (it did).
    dec = make_pair(CPU)
    assert isinstance(dec.policy_for("auto", 3), AutoPolicy)
    assert [c.emitted for c in dec.generate([1, 2, 3], max_tokens=20, policy="auto", k=3)]
