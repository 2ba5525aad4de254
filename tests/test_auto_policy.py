"""Auto mode's policy, driven by synthetic models and a fake clock under two machine profiles."""

from typing import Sequence

import math
import numpy as np

from speculum.engine.policy.auto import AutoPolicy
from speculum.engine.policy.costs import CostModel
from speculum.engine.policy.acceptance import expected_tokens
from speculum.engine.decoder import Decoder
from speculum.engine.policy import acceptance
from speculum.engine.vocabulary import Device
from synthetic import FakeClock, SyntheticModel, noisy_copy

# Seconds per pass with n tokens in the batch.
CPU = dict(verify=lambda n: 0.030 * (1 + 0.5 * (n - 1)), draft=lambda n: 0.020 * n)  # 0.67 of a step
# On a GPU a batch costs about what one token does, the draft model's catching up included.
GPU = dict(verify=lambda n: 0.010 * (1 + 0.02 * (n - 1)), draft=lambda n: 0.001 * (1 + 0.02 * (n - 1)))


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
    # Without a calibration first, trying the draft model once or twice is how it learns.
    assert len(model_cycles) <= 3, [c.source for c in cycles[:10]]
    assert sum(c.k == 0 or c.source == "lookup" for c in cycles[10:]) >= len(cycles[10:]) - 1
    # Never much slower than plain: same tokens; learning costs a few passes once, then
    # the policy it taught is as fast as plain decoding.
    plain = make_pair(CPU)
    run(plain, "off")
    assert dec.stats.tokens == plain.stats.tokens
    assert dec.stats.seconds <= plain.stats.seconds * 1.08
    run(dec, "auto", prompt=(4, 5, 6))
    run(plain, "off", prompt=(4, 5, 6))
    assert dec.stats.seconds <= plain.stats.seconds * 1.03


def test_gpu_profile_drafts_long_with_a_good_draft():
    dec = make_pair(GPU, noise=0.0)
    cycles = run(dec, "auto", n=200)
    # No calibration before the first cycle: it finds out within a few cycles that batches
    # are cheap here, then drafts long (Thompson draws still try something else now and then).
    late = cycles[20:-1]
    long_drafts = [c.source == "model" and len(c.drafted) >= 3 for c in late]
    assert sum(long_drafts) >= 0.85 * len(late), [(c.source, c.k) for c in cycles[:30]]
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
    assert cycles[0].k == 0  # the first token comes from the prompt's last chunk
    assert all(c.source == "model" and 1 <= c.k for c in cycles[1:-1])
    # The early stop never locks at 1.0 (every draft cut after its first token, for good).
    assert all(c.policy.min_confidence <= 0.9 for c in cycles)


def test_forced_draft_mode_is_about_as_fast_as_the_best_fixed_k():
    # On machines and drafts where the best k is 1, 2, 3 or 8: a fresh policy within 12% of
    # it (its learning included), the same policy on its second answer within 7%. The policy's
    # own draws make one answer's speed a sample: the mean over ten policy seeds is judged (on
    # three, a slower draw of one seed moved the mean by 3%).
    for profile, noise in ((CPU, 0.0), (CPU, 1.0), (MID, 0.0), (MID, 2.0), (GPU, 0.0), (GPU, 1.0), (GPU, 2.0)):
        first, second = {}, {}
        for k in (None, 1, 2, 3, 4, 6, 8):
            for seed in (range(14, 24) if k is None else (14,)):  # fixed k draws nothing
                dec = make_pair(profile, noise=noise)
                policy = AutoPolicy(dec.drafters, "draft", clock=dec.clock, seed=seed) if k is None else "draft"
                list(dec.generate([1, 2, 3], max_tokens=200, policy=policy, k=k))
                first.setdefault(k, []).append(dec.stats.tokens_per_s)
                list(dec.generate([4, 5, 6], max_tokens=200, policy=policy, k=k))
                second.setdefault(k, []).append(dec.stats.tokens_per_s)
        first, second = ({k: sum(v) / len(v) for k, v in d.items()} for d in (first, second))
        assert first[None] >= 0.88 * max(v for k, v in first.items() if k), (noise, first)
        assert second[None] >= 0.93 * max(v for k, v in second.items() if k), (noise, second)


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


# Batches cost 0.2 of a step per token and the draft 0.2 of a step per token: long
# drafts of a good draft model pay (k = 8 gives ~2.2x), short ones much less.
MID = dict(verify=lambda n: 0.030 * (1 + 0.2 * (n - 1)), draft=lambda n: 0.006 * n)


def test_a_draft_that_stops_early_is_priced_by_the_decodes_it_made():
    # A draft asked for k tokens that stops below its confidence threshold has decoded one token
    # more than it kept (to judge it). Counted by the tokens kept, a 2-token draft read twice
    # the draft model's step cost, and forced draft mode then stuck at k = 1 on a real pair.
    dec = make_pair(CPU, noise=1.0)
    policy = AutoPolicy(dec.drafters, "draft", clock=dec.clock)
    cycles = list(dec.generate([1, 2, 3], max_tokens=200, policy=policy))
    assert any(0 < len(c.drafted) < c.k for c in cycles)  # early stops happened
    assert abs(policy.costs.draft_step_s - 0.020) <= 0.002, policy.costs.draft_step_s


def test_a_wrong_prior_about_untried_positions_is_found_out_within_30_cycles():
    # The policy believes positions 2 and beyond are almost never accepted: k = 1 looks
    # best, so a policy acting on its prior would never draft there to learn otherwise.
    dec = make_pair(MID, noise=0.0)
    policy = AutoPolicy(dec.drafters, "draft", clock=dec.clock)
    for rate in policy.model_rates[1:]:
        rate.prior = 0.05
    cycles = list(dec.generate([1, 2, 3], max_tokens=300, policy=policy))
    first = next(i for i, c in enumerate(cycles) if len(c.drafted) >= 3 and c.n_accepted >= 3)
    assert first < 30, [(c.k, c.n_accepted) for c in cycles[:30]]
    later = cycles[40:-1]
    assert sum(len(c.drafted) >= 3 for c in later) >= 0.8 * len(later), [c.k for c in later]


def test_a_learning_run_never_locks_in():
    # The draft is useless for the first 80 tokens, then perfect: after the bad stretch,
    # the policy must come back to long drafts (the old policy, sure of its low estimates,
    # never drafted again to find out).
    clock = FakeClock()
    target = SyntheticModel(n_vocab=64, seed=1, order=3, sharpness=4.0, pass_cost=GPU["verify"], clock=clock)
    draft = noisy_copy(target, seed=101, noise=0.0)

    def logits_after(history: Sequence[int]) -> np.ndarray:
        good = target.logits_after(history)
        return -good if len(history) <= 80 else good

    draft.logits_after = logits_after
    draft.pass_cost, draft.clock = GPU["draft"], clock
    dec = Decoder(target, draft, clock=clock)
    cycles = run(dec, "auto", n=400)
    bad = [c for c in cycles if 20 < c.n_generated <= 80]
    assert sum(c.source == "model" for c in bad) <= 0.3 * len(bad)  # it did back off
    recovered = next(i for i, c in enumerate(cycles) if c.n_generated > 80 and c.source == "model"
                     and c.n_accepted >= 3)
    after = [c for c in cycles[recovered:-1]]
    # Evidence against a drafter not tried halves in ~70 cycles: it is tried again well before 100.
    assert recovered - next(i for i, c in enumerate(cycles) if c.n_generated > 80) <= 100
    assert sum(c.source == "model" and len(c.drafted) >= 3 for c in after) >= 0.8 * len(after)


def test_policy_randomness_is_its_own():
    # Thompson draws come from the policy's RNG, seeded: two runs choose alike, and the
    # sampling RNG (drafts, verification) never feeds the policy.
    runs = []
    for _ in range(2):
        dec = make_pair(MID, noise=0.5)
        runs.append([(c.source, c.k) for c in run(dec, "auto", n=80)])
    assert runs[0] == runs[1]


def test_first_generation_on_a_fresh_store_runs_no_calibration(tmp_path):
    dec = make_pair(CPU)
    policy = AutoPolicy(dec.drafters, store=tmp_path / "p.json", clock=dec.clock)
    assert policy.needs_calibration and policy.learning
    prompt = list(range(1, 40))
    cycles = list(dec.generate(prompt, max_tokens=30, policy=policy))
    # One pass for the prompt (its last token's row gives the first token), then one per cycle
    # after the first: nothing measured beyond them.
    assert dec.target.passes == len(cycles)
    assert cycles[0].policy.learning is True
    assert policy.costs.verify_s  # it learned from the passes it made anyway


def test_idle_calibration_stops_when_interrupted_and_leaves_the_caches_as_they_were():
    dec = make_pair(CPU)
    list(dec.generate([1, 2, 3, 4], max_tokens=5, policy="off"))
    cached = list(dec.sequence.tokens)
    passes = dec.target.passes
    asked = []
    assert dec.calibrate(interrupted=lambda: asked.append(1) or len(asked) > 4) is False
    assert dec.target.passes - passes <= 4  # the warm-up and at most one pass per question
    assert dec.calibrate() is True
    policy = dec.policy_for("auto")
    assert not policy.needs_calibration and not policy.learning
    assert abs(policy.costs.verify(5) / policy.costs.verify(1) - 3.0) < 1e-6
    assert dec.sequence.tokens == cached and dec.target.n_past == len(cached)
    assert [t for c in dec.generate([1, 2, 3, 4], max_tokens=5, policy="off") for t in c.emitted]


def test_an_old_policy_file_loads(tmp_path):
    # Written before match-length buckets: lookup rates by n-gram length 1..3.
    old = {"costs": {"verify_s": {"1": 0.03, "2": 0.045, "5": 0.09}, "draft_first_s": 0.02,
                     "draft_step_s": 0.02, "gpu": False},
           "model": [0.9, 0.8], "lookup": {"1": [0.1, 0.2], "2": [0.3], "3": [0.77, 0.66]}}
    (tmp_path / "p.json").write_text(__import__("json").dumps(old))
    policy = AutoPolicy(make_pair(CPU).drafters, store=tmp_path / "p.json")
    assert policy.costs.verify(2) == 0.045 and policy.model_rates[0].prior == 0.9
    assert policy.lookup_rates[2][0].prior == 0.77 and policy.lookup_rates[0][1].prior == 0.2
    (tmp_path / "p.json").write_text("{not json")
    assert AutoPolicy(make_pair(CPU).drafters, store=tmp_path / "p.json").needs_calibration


def test_the_draft_model_catching_up_is_priced_in():
    # The first draft after plain steps reads every token it missed: learned per token, and
    # charged to a model draft that would start that far behind.
    c = CostModel()
    c.observe_verify(1, 0.030)
    c.observe_draft(0, 0.010, 0.010, first=True)  # an ordinary cycle: two tokens caught up
    c.observe_draft(0, 0.052, 0.052, first=False, caught_up=44)  # 42 more tokens: 1 ms each
    assert c.draft_first_s == 0.010 and abs(c.catch_up_s - 0.001) < 1e-9
    assert c.catch_up(2) == 0.0 and abs(c.catch_up(22) - 0.020) < 1e-9
    # The very first draft read a 10-token prompt with its first token: that token alone is
    # priced as two tokens read at once, on the target's curve; the rest is catching up.
    c = CostModel()
    c.observe_verify(1, 0.030)
    c.observe_verify(2, 0.036)
    c.observe_draft(1, 0.066, 0.060, first=False, caught_up=10)
    assert abs(c.draft_step_s - 0.006) < 1e-9 and abs(c.draft_first_s - 0.0072) < 1e-9
    assert abs(c.catch_up_s - (0.060 - 0.0072) / 8) < 1e-9
    dec = make_pair(CPU)
    list(dec.generate([1, 2, 3], max_tokens=40, policy="off"))  # the draft model read nothing
    assert dec.drafters["model"].behind(list(range(43))) == 43


def test_costs_stay_positive_below_the_smallest_size_timed():
    # Forced draft mode never times a single token; two noisy sizes once sloped to zero there.
    c = CostModel()
    c.observe_verify(2, 0.010)
    c.observe_verify(3, 0.030)
    assert 0.010 / 1.6 <= c.verify(1) < 0.010
    assert abs(c.verify(4) - 0.050) < 1e-12 and c.verify(16) > c.verify(4)


def test_the_curve_follows_the_machine_speed_keeping_its_shape():
    c = CostModel()
    c.observe_verify(1, 0.030)
    c.observe_verify(5, 0.060)
    for _ in range(30):  # the machine got twice as slow: only single steps are timed
        c.observe_verify(1, 0.060)
    assert abs(c.verify(1) - 0.060) < 1e-3 and abs(c.verify(5) / c.verify(1) - 2.0) < 1e-9


def test_a_size_timed_alone_moves_the_rest_of_the_curve_too():
    # Forced draft mode never times a single step: when the machine speeds up, two tokens
    # must not come to look cheaper than one (k stuck at 1 on the demo pair).
    c = CostModel()
    c.observe_verify(1, 0.060)
    c.observe_verify(2, 0.090)
    c.observe_verify(3, 0.120)
    for _ in range(40):  # twice as fast now; only 2-token passes are timed
        c.observe_verify(2, 0.045)
    assert c.verify(1) < c.verify(2) < c.verify(3)
    assert c.verify(1) < 0.045


def _auto_over_off(seed: int, n: int = 128, taught: bool = False) -> float:
    """Auto's time over plain decoding's for the same answer: a random prompt full of short
    matches that rarely continue as the model writes (lookup's exploration is all cost).
    ``taught``: by an earlier answer (a document) in which every copy was right."""
    prompt = [int(t) for t in np.random.default_rng(seed).integers(1, 64, 200)]
    seconds = {}
    for mode in ("off", "auto"):
        clock = FakeClock()
        target = SyntheticModel(n_vocab=64, seed=seed, order=3, sharpness=4.0, pass_cost=CPU["verify"], clock=clock)
        dec = Decoder(target, None, clock=clock)
        policy = mode
        if mode == "auto":
            policy = dec.policy_for(mode)
            policy.store = None
            for table in policy.lookup_rates if taught else ():
                for rate in table:
                    rate.accepted, rate.rejected = 5.0, 0.0  # as many right as decaying counts hold
        list(dec.generate(prompt, max_tokens=n, policy=policy))
        assert dec.stats.tokens == n
        seconds[mode] = dec.stats.seconds
    return seconds["auto"] / seconds["off"]


def test_exploring_copies_never_costs_an_answer_more_than_its_loss_share(monkeypatch):
    from speculum.engine.policy import auto

    n = 128
    bound = 1 + auto.LOSS_SHARE * (1 + auto.LOSS_HORIZON / n)  # the budget, counted in plain steps
    ratios = [_auto_over_off(seed, n) for seed in range(1, 9)]
    assert max(ratios) <= bound + 1e-6, ratios
    # The same answers without the budget, exploring every match: exploration alone costs more
    # than it allows.
    monkeypatch.setattr(auto, "LOSS_SHARE", 10.0)
    monkeypatch.setattr(auto, "EXPLORE_MATCH", 1)
    assert max(_auto_over_off(seed, n) for seed in range(1, 9)) > bound


def _answers_over_off(noise: float, answers: int = 4, n: int = 128) -> list[float]:
    """Auto's time over plain decoding's, answer by answer, with one policy and a draft model
    of this noise on the MID machine (a new short prompt each time)."""
    clock = FakeClock()
    target = SyntheticModel(n_vocab=64, seed=3, order=3, sharpness=4.0, pass_cost=MID["verify"], clock=clock)
    draft = noisy_copy(target, seed=103, noise=noise)
    draft.pass_cost, draft.clock = MID["draft"], clock
    dec = Decoder(target, draft, clock=clock)
    policy = dec.policy_for("auto")
    policy.store = None
    ratios = []
    for a in range(answers):
        prompt = [int(t) for t in np.random.default_rng(a).integers(1, 64, 3)]
        seconds = []
        for mode in ("off", policy):
            list(dec.generate(prompt, max_tokens=n, policy=mode))
            # After the first token: plain decoding reads it with the prompt (the prompt's time).
            seconds.append(dec.stats.seconds - dec.stats.tokens_over_time[0][0])
        ratios.append(seconds[1] / seconds[0])
    return ratios


def test_a_draft_model_that_does_not_pay_is_explored_within_the_loss_budget():
    # Half its drafts right at the first token: on its draws alone it was tried again and again
    # (one answer 12% slower than plain). Its first try times its cost; after that its drafts are
    # exploration like a short copy's, within the answer's budget, until its means pay.
    from speculum.engine.policy import auto

    n = 128
    bound = 1 + auto.LOSS_SHARE * (1 + auto.LOSS_HORIZON / n)
    assert max(_answers_over_off(noise=2.0, n=n)) <= bound + 0.002
    # ... while a draft model that pays is soon sure, and doubles the speed.
    assert max(_answers_over_off(noise=0.0, n=n)[1:]) < 0.6


def test_copies_an_earlier_answer_taught_to_trust_keep_within_the_budget_where_they_fail(monkeypatch):
    # After a document whose every copy was right, short matches look sure on the means; in the
    # chat that follows they fail, and they may then cost no more than the budget allows.
    from speculum.engine.policy import auto

    n = 128
    bound = 1 + auto.LOSS_SHARE * (1 + auto.LOSS_HORIZON / n)
    ratios = [_auto_over_off(seed, n, taught=True) for seed in range(1, 9)]
    assert max(ratios) <= bound + 0.01, ratios  # within a pass of the budget: the one that overdrew it
    monkeypatch.setattr(auto, "SURE_MATCH", 0)  # sure on the means alone, as before
    assert max(_auto_over_off(seed, n, taught=True) for seed in range(1, 9)) > bound + 0.01


def _copy_heavy(store=None):
    """A prompt that holds the very text the target writes next, and a decoder on a CPU profile."""
    def model(clock):
        return SyntheticModel(n_vocab=64, seed=4, order=2, sharpness=6.0, pass_cost=CPU["verify"], clock=clock)

    text = [t for c in Decoder(model(None)).generate([7, 8], max_tokens=150, policy="off") for t in c.emitted]
    clock = FakeClock()
    dec = Decoder(model(clock), None, clock=clock)
    policy = AutoPolicy(dec.drafters, store=store, clock=clock)
    return dec, policy, [7, 8] + text + [7, 8]


def _store(tmp_path, verify_s):
    (tmp_path / "p.json").write_text(__import__("json").dumps(
        {"costs": {"verify_s": {str(n): s for n, s in verify_s.items()}, "gpu": False, "observations": 500}}))
    return tmp_path / "p.json"


def test_a_curve_timed_while_the_machine_was_busy_is_dropped(tmp_path):
    # A calibration while another program held the cores: 3 tokens at 67 single steps.
    busy = {n: 0.030 * (67 * n if n > 2 else 1 + 0.5 * (n - 1)) for n in (1, 2, 3, 4, 5, 6, 8, 16)}
    dec, policy, prompt = _copy_heavy(_store(tmp_path, busy))
    assert sorted(policy.costs.verify_s) == [1, 2]  # no pass of n tokens costs more than n single steps
    assert policy.needs_calibration  # so the sizes are timed again
    cycles = list(dec.generate(prompt, max_tokens=140, policy=policy))
    assert sum(c.source == "lookup" for c in cycles) > len(cycles) / 2


def test_small_batches_do_not_drift_below_what_they_were_timed_at_toward_a_prompt_chunks_slope():
    # A 128-token chunk read at 25 single steps (0.25 steps per token, 1.3x that as a hint): fits
    # large batches; 2 tokens here cost 1.6 steps. Drifting toward the chunk's line, 2 tokens
    # read 1.33 steps after 50 plain steps, and losing one-token copies looked cheap to explore.
    c = CostModel()
    c.observe_verify(1, 0.030)
    c.observe_verify(2, 0.048)
    c.observe_prefill(128, 0.030 * 25)
    for _ in range(50):
        c.observe_verify(1, 0.030)
        c.age(1)
    assert c.verify(2) >= 1.5 * 0.030
    # ... while a size timed in a bad moment still comes back within reach.
    c.observe_verify(3, 0.030 * 20)
    for _ in range(100):
        c.age(1)
    assert c.verify(3) < 0.030 * 3


def test_a_pessimistic_curve_drifts_back_within_reach_and_is_timed_again(tmp_path):
    # Possible but wrong (every size as dear as its tokens one at a time), and complete: nothing
    # left to calibrate, and no draft ever looks worth a pass. The true curve is half that slope.
    pessimistic = {n: 0.030 * n for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16)}
    dec, policy, prompt = _copy_heavy(_store(tmp_path, pessimistic))
    assert not policy.needs_calibration and not policy.learning
    cycles = list(dec.generate(prompt, max_tokens=140, policy=policy))
    assert sum(c.source == "lookup" for c in cycles[-len(cycles) // 2:]) > len(cycles) / 4  # drafting again
    # The sizes used lately, timed for what they are (one used only early on drifts back toward
    # the prompt chunks' line until it is timed again, as it should).
    timed = {1 + c.k for c in cycles[len(cycles) // 2:] if c.source == "lookup"}
    assert timed & set(range(2, 17))
    for n in timed & set(range(2, 17)):
        assert abs(policy.costs.verify(n) / CPU["verify"](n) - 1) < 0.15, n


def test_forced_draft_mode_times_again_the_sizes_a_slow_moment_made_too_dear(tmp_path):
    # Forced modes never time a single step. Sizes from 3 tokens up timed as dear as their tokens
    # one at a time (plausible, wrong: the true slope is 0.2 steps per token): one-token drafts
    # look best, and no longer draft ever ran to time its size again.
    store = tmp_path / "p.json"
    store.write_text(__import__("json").dumps({"costs": {
        "verify_s": {"2": MID["verify"](2), **{str(n): 0.030 * n for n in (3, 4, 5, 6, 7, 8, 9, 12, 16)}},
        "draft_first_s": 0.012, "draft_step_s": 0.006, "gpu": False, "observations": 500}}))
    dec = make_pair(MID, noise=0.0)
    policy = AutoPolicy(dec.drafters, "draft", store=store, clock=dec.clock)
    cycles = list(dec.generate([1, 2, 3], max_tokens=400, policy=policy))
    later = cycles[2 * len(cycles) // 3:-1]  # (when a draw first tries a longer draft is chance)
    assert sum(len(c.drafted) >= 3 for c in later) >= 0.8 * len(later), [c.k for c in cycles]


def test_a_draft_step_timed_while_the_machine_was_busy_does_not_stop_every_draft_after_one_token(tmp_path):
    # A draft model step read at 7 target steps: forced draft mode would draft one token per
    # cycle, and a one-token draft never times a step again.
    store = tmp_path / "p.json"
    store.write_text(__import__("json").dumps({"costs": {
        "verify_s": {str(n): GPU["verify"](n) for n in (1, 2, 3, 4, 5, 6, 8, 16)},
        "draft_first_s": 0.002, "draft_step_s": 0.07, "gpu": True, "observations": 500}}))
    dec = make_pair(GPU, noise=0.0)  # cheap batches, a good draft: long drafts pay
    policy = AutoPolicy(dec.drafters, store=store, clock=dec.clock, mode="draft")
    assert policy.costs.draft_step_s <= policy.costs.draft_first_s
    cycles = list(dec.generate([1, 2, 3], max_tokens=120, policy=policy))
    assert max(len(c.drafted) for c in cycles) >= 3


def test_a_policy_file_with_impossible_numbers_keeps_only_what_could_be_true(tmp_path):
    # Another version, a hand edit or a damaged disk: JSON that parses but cannot be a cost.
    (tmp_path / "p.json").write_text(
        '{"costs": {"verify_s": {"1": 1e309, "2": NaN, "3": -0.5, "4": 0.05, "0": 0.01, "99": 0.2, "x": 0.1},'
        ' "draft_first_s": Infinity, "draft_step_s": "fast", "mtp_first_s": -1, "mtp_step_s": 0.01,'
        ' "gpu": false, "observations": "many"}, "model": [1e309, NaN]}')
    dec, policy, prompt = _copy_heavy(tmp_path / "p.json")
    c = policy.costs
    assert c.verify_s == {4: 0.05}  # sizes 1..16 with a finite positive cost
    assert c.draft_first_s is None and c.draft_step_s is None and c.mtp_first_s is None
    assert c.mtp_step_s == 0.01
    assert all(0 < r.prior < 1 for r in policy.model_rates)
    cycles = list(dec.generate(prompt, max_tokens=60, policy=policy))  # and it decodes, learning again
    assert sum(len(cy.emitted) for cy in cycles) == 60
    assert all(math.isfinite(policy.costs.verify(n)) and policy.costs.verify(n) > 0 for n in range(1, 17))


def test_draft_mode_reads_the_prompt_into_the_draft_model_with_the_target_and_shows_it():
    # Where the draft model drafts every cycle, its first draft read a whole new document inside
    # the first cycle (seconds, no progress shown). It now reads with the prompt, counted.
    prompt = [1 + (i * 7) % 60 for i in range(300)]
    for mode, k in (("draft", None), ("draft", 3)):
        dec = make_pair(CPU)
        progress = []
        cycles = list(dec.generate(prompt, max_tokens=8, policy=mode, k=k, on_prompt=lambda r, t: progress.append((r, t))))
        assert progress[0] == (0, 2 * 299) and progress[-1] == (2 * 299, 2 * 299), progress
        assert [r for r, _ in progress] == sorted(r for r, _ in progress)
        first = next(c for c in cycles if c.drafted)
        assert first.source == "model"
        assert first.draft_s < 0.25 * dec.stats.prompt_s  # the document was read before, not inside it
    dec = make_pair(CPU)  # auto mode: the draft model reads only when it is chosen
    progress = []
    list(dec.generate(prompt, max_tokens=2, policy="off", on_prompt=lambda r, t: progress.append((r, t))))
    assert progress[-1] == (299, 299) and dec.drafters["model"].behind(prompt) == 300


def test_a_long_copy_is_sure_only_once_its_match_length_has_been_seen():
    # A fresh policy's prior says a 12-token match copies well; on that alone its first copy
    # stays within the loss budget (a restated function signature, copied 14 tokens long and
    # wrong, cost a first answer 5%). One copy seen from such a match, the next may be long.
    from speculum.engine.drafting.draft import Draft
    from speculum.engine.drafting.lookup import PromptLookup
    from speculum.engine.vocabulary import Source

    policy = AutoPolicy({Source.LOOKUP: PromptLookup()}, "auto", Device.CPU)
    policy.calibrated(CostModel({n: 0.030 * (1 + 0.35 * (n - 1)) for n in range(1, 17)}))
    phrase = list(range(10, 40))
    context = [1, 2] + phrase + [3, 4] + phrase[:12]  # the last 12 tokens were seen: 18 follow them
    worst = max(0.030 * 0.35 * policy.choose(context).k for _ in range(20))  # its pass minus one plain step
    from speculum.engine.policy import auto

    assert worst <= auto.LOSS_SHARE * auto.LOSS_HORIZON * 0.030 + 1e-9  # what the answer's start allows
    policy.observe(Draft(tokens=phrase[12:13], source=Source.LOOKUP, match_length=12), 1, 0.0, 0.030 * 1.35)
    assert max(policy.choose(context).k for _ in range(20)) >= 8  # seen now: sure, and long


def test_a_recalled_context_copies_long_at_once_and_a_shared_ending_only_probes():
    # The same prompt again (the memory began a text as this whole context does): the earlier
    # greedy answer is written again, so its copy is sure on a fresh policy's prior; a resent
    # document after another question shares only its end, and its first copy stays a probe.
    from speculum.engine.policy import auto
    from speculum.engine.drafting.lookup import MemoryLookup
    from speculum.engine.drafting.ngrammemory import NgramMemory
    from speculum.engine.vocabulary import Source

    rng = np.random.default_rng(5)
    earlier = rng.integers(0, 1000, 400).tolist()  # a prompt (250 tokens) and its answer
    memory = NgramMemory(1000)
    memory.remember(earlier, "api")

    def longest(context) -> int:
        policy = AutoPolicy({Source.MEMORY: MemoryLookup(memory)}, "auto", Device.CPU)
        policy.calibrated(CostModel({n: 0.030 * (1 + 0.35 * (n - 1)) for n in range(1, 17)}))
        return max(policy.choose(context).k for _ in range(20))

    assert longest(earlier[:250]) >= 8
    shared_end = rng.integers(0, 1000, 150).tolist() + earlier[150:250]
    room = auto.LOSS_SHARE * auto.LOSS_HORIZON * 0.030
    assert 0.030 * 0.35 * longest(shared_end) <= room + 1e-9


def remembering_policy(rng, n: int) -> tuple[AutoPolicy, list[int]]:
    """A policy drafting from a memory of one earlier text of ``n`` tokens (a prompt and its
    answer), whose copies have all been right, on the demo target's 2-core verify curve."""
    from speculum.engine.drafting.lookup import MemoryLookup
    from speculum.engine.drafting.ngrammemory import NgramMemory
    from speculum.engine.vocabulary import Source

    earlier = rng.integers(0, 1000, n).tolist()
    memory = NgramMemory(1000)
    memory.remember(earlier, "api")
    policy = AutoPolicy({Source.MEMORY: MemoryLookup(memory)}, "auto", Device.CPU)
    policy.calibrated(CostModel({n: 0.030 * (1 + 0.145 * (n - 1)) for n in (1, 2, 3, 4, 5, 6, 8, 16, 32, 64)}))
    for table in policy._match_rates[Source.MEMORY]:
        for rate in table:
            rate.accepted, rate.rejected = 5.0, 0.0
    return policy, earlier


def test_a_recalled_text_is_copied_past_fifteen_tokens_where_long_passes_pay_and_no_other_copy_is():
    # A pass of 64 tokens costs 10.3 single steps on Qwen2.5 1.5B (2 cores), 16 cost 3.3: where
    # every copied token is right (the same prompt again), long passes write more per step.
    from speculum.engine.policy import auto

    rng = np.random.default_rng(6)
    policy, earlier = remembering_policy(rng, 500)
    recalled = earlier[:250]
    assert max(policy.choose(recalled).k for _ in range(20)) > auto.MAX_K
    shared_end = rng.integers(0, 1000, 150).tolist() + earlier[150:250]  # only its end seen before
    assert max(policy.choose(shared_end).k for _ in range(20)) == auto.MAX_K


def test_short_copies_are_sure_again_once_this_answer_has_shown_them_right():
    # A 3-token match's copy is budgeted (how often it is right depends on the text) until this
    # answer's own short copies were right; the next answer starts budgeted again.
    from speculum.engine.policy import auto
    from speculum.engine.drafting.draft import Draft
    from speculum.engine.drafting.lookup import PromptLookup
    from speculum.engine.vocabulary import Source

    policy = AutoPolicy({Source.LOOKUP: PromptLookup()}, "auto", Device.CPU)
    policy.calibrated(CostModel({n: 0.030 * (1 + 0.35 * (n - 1)) for n in range(1, 17)}))
    for rate in policy.lookup_rates[2]:
        rate.accepted, rate.rejected = 5.0, 0.0  # an earlier document: 3-token matches always right
    phrase = list(range(10, 40))
    context = [1, 2] + phrase + [3, 4] + phrase[:3]
    room = auto.LOSS_SHARE * auto.LOSS_HORIZON * 0.030

    def longest() -> int:
        return max(policy.choose(context).k for _ in range(20))

    assert 0.030 * 0.35 * longest() <= room + 1e-9  # within the answer's budget
    for _ in range(2):  # two short copies right in this answer (each its pass: 2 tokens for 1.35 steps)
        policy.observe(Draft(tokens=phrase[3:4], source=Source.LOOKUP, match_length=3), 1, 0.0, 0.030 * 1.35)
    policy._plain_s = policy._spent_s = 0.0  # the same room as before: only the evidence changed
    assert longest() >= 8  # sure now
    policy.finish()
    assert 0.030 * 0.35 * longest() <= room + 1e-9


def test_the_curve_in_one_sweep_is_verify_size_by_size():
    # The policy reads the whole curve each cycle in one sweep (CostModel.curve); it must be
    # what verify(n) says for every size, timed or not, drawn or estimated.
    from speculum.engine.policy.costs import CURVE_BATCH, MAX_BATCH

    states = [{}, {1: 0.03}, {4: 0.08}, {1: 0.03, 4: 0.07}, {1: 0.03, 2: 0.05, 8: 0.13, 16: 0.16},
              {2: 0.05, 3: 0.06}, {1: 0.03, 16: 0.15}]
    for verify_s in states:
        for gpu in (False, True):
            c = CostModel(dict(verify_s), gpu=gpu, prefill=(128, 0.9))
            c.slope_guess, c.extrapolation_scale = 0.3, 0.6
            for drawn in (True, False):
                for largest in (CURVE_BATCH, MAX_BATCH):  # (every cycle's, and a recalled copy's)
                    sweep = c.curve(drawn, largest)
                    assert len(sweep) == largest + 1 and sweep[0] == 0.0
                    assert sweep[1:] == [c.verify(n, drawn) for n in range(1, largest + 1)], (verify_s, gpu, drawn)
            # and a drawn guess is not the estimate where something is untimed beyond the timed sizes
            if len(verify_s) >= 2 and max(verify_s) < MAX_BATCH:
                assert c.curve(True, MAX_BATCH)[MAX_BATCH] < c.curve(False, MAX_BATCH)[MAX_BATCH]


def test_tables_not_drafted_from_age_by_the_cycles_they_sat_idle_and_the_one_drafted_from_does_not():
    # Idle aging is applied when a table is next read, not to every table every cycle: what
    # it reads must be what aging each cycle would have left (IDLE_DECAY per idle cycle).
    from speculum.engine.drafting.draft import Draft
    from speculum.engine.drafting.lookup import PromptLookup
    from speculum.engine.vocabulary import Source

    policy = AutoPolicy({Source.LOOKUP: PromptLookup()}, "auto", Device.CPU)
    for rate in policy.model_rates:
        rate.accepted, rate.rejected = 4.0, 2.0
    for rate in policy.lookup_rates[3]:
        rate.accepted, rate.rejected = 3.0, 1.0
    copy = Draft(tokens=[7, 8], source=Source.LOOKUP, match_length=4)  # bucket 3: matches of 4-5
    for _ in range(5):
        policy.observe(Draft(), 0, 0.0, 0.03)  # plain steps: every table idle
    policy.observe(copy, 2, 0.0, 0.05)  # drafted from bucket 3: it learns, it does not idle
    for _ in range(2):
        policy.observe(Draft(), 0, 0.0, 0.03)
    idle = acceptance.IDLE_DECAY ** 8
    assert all(math.isclose(r.accepted, 4.0 * idle) and math.isclose(r.rejected, 2.0 * idle)
               for r in policy.model_rates)
    assert all(r.accepted == 0.0 for r in policy.lookup_rates[2])  # nothing to age
    first = policy.lookup_rates[3][0]
    assert math.isclose(first.accepted, (3.0 * acceptance.IDLE_DECAY ** 5 * acceptance.DECAY + 1) * acceptance.IDLE_DECAY ** 2)
    assert math.isclose(first.rejected, 1.0 * acceptance.IDLE_DECAY ** 5 * acceptance.DECAY * acceptance.IDLE_DECAY ** 2)
    # read twice, aged once
    assert math.isclose(policy.model_rates[0].accepted, 4.0 * idle)


def test_a_plain_step_reports_the_speed_of_plain_decoding_even_when_its_pass_was_its_first_timing():
    # The report follows the pass it chose, which is timed first: a fresh machine's first plain
    # step, weighed against a default cost and shown against the measured one, read 0.86x plain.
    from speculum.engine.drafting.draft import Draft
    from speculum.engine.drafting.lookup import PromptLookup
    from speculum.engine.vocabulary import Source

    policy = AutoPolicy({Source.LOOKUP: PromptLookup()}, "auto", Device.CPU)
    for seconds in (0.043, 0.031, 0.052):
        choice = policy.choose([1, 2, 3, 4])  # nothing to copy: a plain step
        assert choice.k == 0
        policy.observe(Draft(), 0, 0.0, seconds)
        report = policy.report()
        assert report.expected_speedup == 1.0, report
        assert report.expected_tokens_per_s == round(report.plain_tokens_per_s, 2)


def test_copies_from_one_or_two_tokens_of_context_are_not_explored_but_from_three_they_are():
    # A newline or a bracket in common says little of what follows it: such copies spent the
    # loss budget that copies of longer matches could use. Until this answer's short copies
    # have been right, only a match of three tokens or more is tried on the draws.
    from speculum.engine.drafting.lookup import PromptLookup
    from speculum.engine.vocabulary import Source

    def drafted(context, slope=0.35, tries=60):
        policy = AutoPolicy({Source.LOOKUP: PromptLookup()}, "auto", Device.CPU)
        policy.calibrated(CostModel({n: 0.030 * (1 + slope * (n - 1)) for n in range(1, 17)}))
        return sum(policy.choose(context).k > 0 for _ in range(tries))

    text = list(range(10, 40))
    assert drafted(text + [1, 10]) == 0  # one token of context matched
    assert drafted(text + [1, 10, 11]) == 0  # two
    assert drafted(text + [1, 10, 11, 12]) > 0  # three: explored within the budget
    # Where a pass of a few tokens costs about one (a GPU), a failed probe costs next to nothing.
    assert drafted(text + [1, 10], slope=0.02) > 0


def test_calibration_times_again_a_size_a_busy_moment_spoiled_in_every_round():
    # Something else held the cores through the first three 2-token passes (the rounds'):
    # dropped as impossible, the size would leave the curve unmeasured; it is timed again.
    dec = make_pair(CPU)
    list(dec.generate([1, 2, 3, 4], max_tokens=5, policy="off"))
    cost, busy = dec.target.pass_cost, [3]

    def pass_cost(n: int) -> float:
        if n == 2 and busy[0]:
            busy[0] -= 1
            return 10 * cost(n)
        return cost(n)

    dec.target.pass_cost = pass_cost
    assert dec.calibrate() is True
    assert abs(dec.policy_for("auto").costs.verify_s[2] - cost(2)) < 1e-9


def test_calibration_on_a_machine_whose_speed_keeps_changing_prices_a_size_at_most_n_single_steps():
    # Another program on the cores: every 3-token pass reads slower than three single steps. The
    # size is priced at the most it can cost instead of being left out, so the curve is measured.
    dec = make_pair(CPU)
    list(dec.generate([1, 2, 3, 4], max_tokens=5, policy="off"))
    cost = dec.target.pass_cost
    dec.target.pass_cost = lambda n: 4 * cost(1) if n == 3 else cost(n)
    assert dec.calibrate() is True
    verify_s = dec.policy_for("auto").costs.verify_s
    assert abs(verify_s[3] - 3 * cost(1)) < 1e-9 and abs(verify_s[4] - cost(4)) < 1e-9


def test_a_recalled_text_is_copied_long_only_while_the_answer_repeats_the_remembered_one():
    # The same prompt at T > 0 without a seed writes another answer: the remembered one is a copy
    # like any other (its first copy a probe within the budget). Greedy, it is recalled whole
    # until a recalled copy fails; from then on it is an ordinary copy too.
    from speculum.engine.policy import auto
    from speculum.engine.drafting.draft import Draft
    from speculum.engine.vocabulary import Source

    policy, earlier = remembering_policy(np.random.default_rng(7), 400)
    recalled = earlier[:250]

    policy.begin(repeatable=False)
    assert max(policy.choose(recalled).k for _ in range(20)) <= auto.MAX_K
    policy.finish()

    policy.begin(repeatable=True)
    choice = policy.choose(recalled)
    assert choice.k > auto.MAX_K
    policy.observe(Draft(tokens=earlier[250:250 + choice.k], source=Source.MEMORY, match_length=250), 3,
                   0.0, 0.030 * (1 + 0.145 * choice.k))
    # Three copied tokens were right, the fourth not: still the remembered text's start, no repeat.
    assert max(policy.choose(earlier[:253]).k for _ in range(20)) <= auto.MAX_K
    policy.finish()
    policy.begin(repeatable=True)  # the next answer recalls again
    assert policy.choose(recalled).k > auto.MAX_K
