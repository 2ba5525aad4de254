"""Stats in one place: merged across runs, and read (not re-derived) by the benchmark."""

import io
from types import SimpleNamespace

import pytest

from speculum import bench
from speculum.engine.decoder import Decoder
from speculum.engine.stats import Stats
from speculum.engine.vocabulary import Mode
from synthetic import FakeClock, SyntheticModel, noisy_copy


def test_merge_equals_adding_every_cycle():
    clock = FakeClock()
    target = SyntheticModel(n_vocab=8, seed=5, order=1, pass_cost=lambda n: 0.01 * (1 + 0.3 * n), clock=clock)
    dec = Decoder(target, noisy_copy(target, seed=6, noise=1.0), clock=clock)
    runs, every = [], Stats()
    for mode, prompt in ((Mode.DRAFT, [1, 2, 3]), (Mode.LOOKUP, [1, 2, 3, 1, 2]), (Mode.OFF, [4, 5])):
        for cycle in dec.generate(prompt, max_tokens=40, policy=mode, k=3):
            every.add(cycle)
        runs.append(dec.stats)
    merged = Stats()
    for s in runs:
        assert merged.merge(s) is merged
    for name in ("tokens", "passes", "drafted", "accepted", "drafted_at", "accepted_at", "by_source",
                 "passes_by_source"):
        assert getattr(merged, name) == getattr(every, name), name
    assert merged.prompt_tokens == sum(s.prompt_tokens for s in runs)
    assert merged.seconds == pytest.approx(every.seconds)
    assert merged.tokens_per_s == pytest.approx(every.tokens_per_s)
    assert merged.acceptance_by_position == pytest.approx(every.acceptance_by_position)
    assert [n for _, n in merged.tokens_over_time] == [n for _, n in every.tokens_over_time]
    assert [t for t, _ in merged.tokens_over_time] == pytest.approx([t for t, _ in every.tokens_over_time])
    assert sum(merged.choices.values()) == pytest.approx(1.0)


def test_bench_repeats_report_the_median_rate(monkeypatch):
    # Per repeat: off, lookup, off again (plain decoding brackets the speculative run).
    rates = iter([10.0, 40.0, 30.0, 20.0, 30.0, 20.0, 30.0, 90.0, 10.0])

    def run_one(decoder, tokens, mode, prompt, max_tokens, k=None, passes=None, choices=None):
        return Stats(tokens=10, passes=5, drafted=4, accepted=2, verify_s=10 / next(rates),
                     passes_by_source={"lookup" if mode == Mode.LOOKUP else "none": 5}), [1] * 10

    monkeypatch.setattr(bench, "run_one", run_one)
    target = SimpleNamespace(apply_chat_template=lambda messages: "", tokenize=lambda text: [1, 2])
    decoder = SimpleNamespace(target=target, drafters={}, policies={}, generate=lambda *a, **kw: iter(()))
    progress = io.StringIO()
    results = bench.run_bench(decoder, [bench.BenchPrompt("p", "hi")], [Mode.OFF, Mode.LOOKUP], repeat=3,
                              progress=progress)
    by_mode = {r["mode"]: r for r in results}
    assert set(by_mode) == {"off", "lookup"}
    assert by_mode["off"]["tokens_per_s"] == 20.0 and by_mode["lookup"]["tokens_per_s"] == 40.0
    assert by_mode["lookup"]["speedup_vs_off"] == 2.0
    assert by_mode["lookup"]["tokens"] == 10 and by_mode["lookup"]["acceptance_rate"] == 0.5
    assert by_mode["off"]["tokens"] == 10
    assert by_mode["lookup"]["choices"] == {"lookup": 1.0}
    assert progress.getvalue().count("[3/3]") == 3


def test_bench_runs_auto_first_and_plain_decoding_around_it():
    assert bench.run_order([Mode.OFF, Mode.DRAFT, Mode.LOOKUP, Mode.AUTO]) == [
        Mode.OFF, Mode.AUTO, Mode.OFF, Mode.DRAFT, Mode.LOOKUP]
    assert bench.run_order([Mode.LOOKUP, Mode.OFF]) == [Mode.OFF, Mode.LOOKUP, Mode.OFF]
    assert bench.run_order([Mode.OFF]) == [Mode.OFF] and bench.run_order([Mode.AUTO]) == [Mode.AUTO]


def test_oracle_speedup_knows_how_much_of_each_copy_is_right():
    # The prompt holds 1..6 after a 7; the output copies 1..6, then departs from the copy.
    prompt, output = [7, 1, 2, 3, 4, 5, 6, 8, 7], [1, 2, 3, 4, 5, 6, 0]
    linear = lambda n: 1 + 0.25 * (n - 1)  # noqa: E731
    # One pass: 6 copied tokens accepted and the target's own 0, for verify(7) = 2.5 steps.
    assert bench.oracle_speedup(prompt, output, linear) == pytest.approx(7 / 2.5)
    # Where a batch costs as much as its tokens one by one, knowing in advance gains nothing.
    assert bench.oracle_speedup(prompt, output, lambda n: float(n)) == pytest.approx(1.0)
    # Nothing to copy: plain decoding.
    assert bench.oracle_speedup([1, 2, 3], [4, 5, 6, 7], linear) == pytest.approx(1.0)
    # The best path may copy fewer tokens than it could: a batch of 3 costs more than 3 steps
    # here, so the oracle copies 1 token per pass (2 tokens for 1.5 steps).
    steep = {1: 1.0, 2: 1.5, 3: 3.5, 4: 5.0, 5: 6.5, 6: 8.0, 7: 9.5}
    assert bench.oracle_speedup(prompt, output, steep.__getitem__) == pytest.approx(7 / (1.5 * 3 + 1.0))


def test_a_run_priced_on_the_verify_curve_counts_its_passes_not_the_clock():
    linear = lambda n: 0.1 * (1 + 0.25 * (n - 1))  # noqa: E731
    C = bench.CycleChoice
    # Plain steps: exactly plain decoding, however long each step really took.
    assert bench.priced_speedup([C(1, 1, 0.0)] * 5, linear) == pytest.approx(1.0)
    # A copy of 6 accepted (7 tokens for 2.5 steps), then a draft of 3 all refused (1 token, 1.75 steps)
    # that took 0.05 s to make.
    run = [C(7, 7, 0.0), C(4, 1, 0.05)]
    assert bench.priced_speedup(run, linear) == pytest.approx(8 * 0.1 / (0.25 + 0.175 + 0.05))
    assert bench.priced_speedup([], linear) is None


def test_a_verify_curve_from_passes_as_they_ran_takes_medians_and_draws_lines_between_them():
    # passes of 1, 4 and 8 tokens; one slow outlier among the single steps
    passes = [(1, 0.10), (1, 0.10), (1, 0.90), (4, 0.25), (8, 0.45), (8, 0.45), (0, 1.0), (3, 0.0)]
    verify = bench.curve_from_passes(passes)
    assert verify(1) == pytest.approx(0.10)  # the median, not the outlier
    assert verify(4) == pytest.approx(0.25) and verify(8) == pytest.approx(0.45)
    assert verify(2) == pytest.approx(0.15) and verify(6) == pytest.approx(0.35)  # between sizes seen
    assert verify(16) == pytest.approx(0.85)  # beyond them: the last line goes on
    # the oracle on it: a copy right all the way, 8 tokens a pass at 4.5 steps
    assert bench.oracle_speedup([5, 6, 7, 8, 9, 10, 11, 12, 13, 5], [6, 7, 8, 9, 10, 11, 12, 13], verify,
                                max_batch=9) == pytest.approx(8 * 0.10 / 0.45)
    assert bench.curve_from_passes([(1, 0.1), (1, 0.1)]) is None  # one size: no curve
    assert bench.curve_from_passes([(4, 0.3), (8, 0.4)]) is None  # no single step to compare with


def test_departure_says_where_an_answer_first_leaves_plain_decodings():
    assert bench.departure([1, 2, 3], [1, 2, 3]) == (True, None)
    assert bench.departure([1, 2, 3], [1, 5, 3]) == (False, 1)
    assert bench.departure([1, 2, 3], [1, 2]) == (False, 2)  # stopped early
    assert bench.departure([1, 2], [1, 2, 3]) == (False, 2)
