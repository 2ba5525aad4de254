"""Predicted Outputs as drafts: alignment with the output, and what auto mode makes of them."""

import numpy as np

from speculum.engine.decoder import Decoder
from speculum.engine.drafting.draft import Choice
from speculum.engine.drafting.prediction import PredictionDrafter
from speculum.engine.sampling import SamplingParams
from speculum.engine.vocabulary import Source
from synthetic import FakeClock, SyntheticModel

PREDICTED = list(range(100, 160))
PROMPT = [1, 2, 3]


def following(outputs):
    """A drafter that expects PREDICTED after PROMPT and has seen ``outputs`` written."""
    d = PredictionDrafter()
    d.expect(PREDICTED)
    d.begin(PROMPT)
    context = list(PROMPT)
    for piece in outputs:
        context += piece
        d.accept(context)
    return d, context


def proposal(d, context, k=4):
    return d.propose(context, k, Choice(Source.PREDICTION, k), SamplingParams(), np.random.default_rng(0)).tokens


def test_the_answer_starts_with_the_prediction_and_follows_it():
    d, context = following([])
    assert proposal(d, context) == [100, 101, 102, 103]
    d, context = following([[100, 101, 102], [103]])
    assert proposal(d, context) == [104, 105, 106, 107]
    assert d.match(context).length > 4  # a run of followed tokens is trusted more


def test_after_an_insertion_copying_resumes_where_the_output_rejoins():
    d, context = following([list(range(100, 110)), [7, 8]])  # two tokens the prediction lacks
    assert proposal(d, context) == []  # lost: nothing to copy yet
    d.accept(context := context + [110])
    assert proposal(d, context) == [111, 112, 113, 114]


def test_after_a_deletion_copying_skips_ahead_not_back():
    d, context = following([list(range(100, 110)), [130, 131]])  # 110..129 deleted
    assert proposal(d, context, 3) == [132, 133, 134]


def test_a_changed_token_resumes_copying_after_it():
    # A rename: 110 became 7; the output then goes on as predicted.
    d, context = following([list(range(100, 110)), [7, 111]])
    assert proposal(d, context, 2) == [112, 113]


def test_no_prediction_drafts_nothing():
    d = PredictionDrafter()
    d.expect([])
    d.begin(PROMPT)
    assert proposal(d, PROMPT) == []


# -- in the decoder, under auto mode (synthetic model, fake clock: a 2-core CPU's costs) --

def verify_cost(n):
    return 0.030 * (1 + 0.2 * (n - 1))


def decoder():
    clock = FakeClock()
    # A wide vocabulary: the answer rarely repeats itself, so prompt lookup has little to copy.
    return Decoder(SyntheticModel(n_vocab=64, seed=5, order=3, sharpness=6.0, pass_cost=verify_cost, clock=clock),
                   clock=clock)


def generate(prediction=(), n=150, mode="auto"):
    dec = decoder()
    cycles = list(dec.generate(PROMPT, max_tokens=n, policy=mode, prediction=prediction))
    return [t for c in cycles for t in c.emitted], cycles, dec.stats


def test_an_edit_with_the_original_as_prediction_is_faster_and_exact():
    plain, _, plain_stats = generate(mode="off")
    original = plain[:40] + [9, 9, 9] + plain[43:90] + plain[100:]  # the edit changed 3 tokens, deleted 10
    tokens, cycles, stats = generate(original)
    assert tokens == plain  # a prediction changes speed, never the text
    predicted = [c for c in cycles if c.source == Source.PREDICTION]
    # 13 of the answer's tokens are not in the prediction; nearly all others are copied from it.
    assert sum(c.n_accepted for c in predicted) >= 0.75 * len(plain)
    assert max(c.k for c in predicted) >= 8  # long copies once the output follows the prediction
    assert stats.by_source[Source.PREDICTION][1] == sum(c.n_accepted for c in predicted)
    assert stats.tokens_per_s > 2 * plain_stats.tokens_per_s


def test_an_unrelated_prediction_costs_almost_nothing():
    plain, _, plain_stats = generate(mode="auto")
    unrelated = list(np.random.default_rng(3).integers(0, 64, size=300))
    tokens, cycles, stats = generate(unrelated)
    assert tokens == plain
    assert stats.tokens_per_s >= 0.97 * plain_stats.tokens_per_s


def test_a_prediction_is_forgotten_by_the_next_generation():
    dec = decoder()
    plain = [t for c in dec.generate(PROMPT, max_tokens=60, policy="off") for t in c.emitted]
    list(dec.generate(PROMPT, max_tokens=60, policy="auto", prediction=plain))
    again = list(dec.generate(PROMPT, max_tokens=60, policy="auto"))
    assert not any(c.source == Source.PREDICTION for c in again)


# -- an edit that repeats itself: learned once, drafted from then on --

OLD, NEW = 199, (7, 8)  # a rename: the token 199 became the two tokens 7, 8 wherever it stood
WITH_OLD = [OLD if i in (10, 20, 40) else t for i, t in enumerate(PREDICTED)]  # it stands three times


def renamed(upto):
    """The edited answer: WITH_OLD up to (not including) index ``upto``, renamed."""
    return [t for p in WITH_OLD[:upto] for t in (NEW if p == OLD else (p,))]


def edited_so_far(upto):
    d = PredictionDrafter()
    d.expect(WITH_OLD)
    d.begin(PROMPT)
    context = list(PROMPT)
    for t in renamed(upto):
        d.accept(context := context + [t])
    return d, context


def test_a_rename_is_learnt_once_and_drafted_with_its_new_name_after():
    d, context = edited_so_far(12)  # the first rename, and one token after it
    assert d.substitutions == {}  # not confirmed yet
    d, context = edited_so_far(15)
    assert d.substitutions == {OLD: {(OLD,): NEW}}
    assert proposal(d, context, 8) == [115, 116, 117, 118, 119, *NEW, 121]  # drafted with its new name
    for t in [115, 116, 117, 118, 119, *NEW, 121]:  # the output writes it: the cursor stays aligned
        d.accept(context := context + [t])
        assert d.match(context).length > 0
    assert proposal(d, context, 2) == [122, 123]


def test_a_learnt_change_the_output_does_not_repeat_is_left():
    d, context = edited_so_far(15)
    for t in WITH_OLD[15:21]:  # this time the old name is kept
        d.accept(context := context + [t])
    assert proposal(d, context, 3) == [121, 122, 123]  # still aligned: the prediction's own token matched


def test_an_insertion_teaches_nothing():
    d, context = following([list(range(100, 110)), [7, 8], list(range(110, 116))])
    assert d.substitutions == {}


def test_a_rename_whose_new_name_starts_with_a_token_of_the_text_is_still_learnt():
    # The new name's first token also stands a little further on in the prediction: the cursor
    # is found there and lost at once; the edit still began at the old name.
    d = PredictionDrafter()
    d.expect(WITH_OLD)
    d.begin(PROMPT)
    context = list(PROMPT)
    new = (113, 7)
    for t in [t for p in WITH_OLD[:15] for t in (new if p == OLD else (p,))]:
        d.accept(context := context + [t])
    assert d.substitutions == {OLD: {(OLD,): new}}
