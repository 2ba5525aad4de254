"""The drafter registry: a new drafter is one class and one entry, used with no decoder change."""

import numpy as np

from speculum.engine import drafters
from speculum.engine.decoder import Decoder
from speculum.engine.drafters import Choice, Draft
from speculum.engine.policy import FixedPolicy
from speculum.engine.vocabulary import Source
from synthetic import SyntheticModel


class OracleDrafter:
    """Drafts the target's own greedy continuation: a drafter the engine has never seen."""

    source = "oracle"

    def __init__(self, target):
        self.target = target
        self.begun = 0
        self.accepted = 0

    @classmethod
    def build(cls, inputs):
        return cls(inputs.target)

    def begin(self, context):
        self.begun += 1

    def propose(self, context, k, choice, sampling, rng):
        ctx = list(context)
        for _ in range(k):
            ctx.append(int(np.argmax(self.target.logits_after(ctx))))
        return Draft(ctx[len(context):], self.source)

    def accept(self, context):
        self.accepted += 1


def plain(model_args, prompt, n):
    return [t for c in Decoder(SyntheticModel(**model_args)).generate(prompt, max_tokens=n) for t in c.emitted]


def test_a_registered_drafter_is_built_and_used(monkeypatch):
    monkeypatch.setitem(drafters.DRAFTERS, "oracle", OracleDrafter)
    args = dict(n_vocab=16, seed=2)
    dec = Decoder(SyntheticModel(**args))
    oracle = dec.drafters["oracle"]
    assert set(dec.drafters) == {Source.LOOKUP, Source.PREDICTION, "oracle"}  # no draft model: no model drafter
    cycles = list(dec.generate([1, 2, 3], max_tokens=40, policy=FixedPolicy(Choice("oracle", 3))))
    assert [t for c in cycles for t in c.emitted] == plain(args, [1, 2, 3], 40)
    assert all(c.source == "oracle" and c.n_accepted == len(c.drafted) == 3 for c in cycles[:-1])
    assert dec.stats.acceptance_rate == 1.0 and dec.stats.passes_by_source == {"oracle": len(cycles)}
    assert oracle.begun == 1 and oracle.accepted == len(cycles)


def test_hybrid_falls_back_when_the_first_drafter_has_nothing(monkeypatch):
    monkeypatch.setitem(drafters.DRAFTERS, "oracle", OracleDrafter)
    args = dict(n_vocab=6, seed=7, order=1)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 0, 1, 2]
    dec = Decoder(SyntheticModel(**args))
    hybrid = FixedPolicy(Choice(Source.LOOKUP, 4, min_match=3, fallback="oracle"))
    cycles = list(dec.generate(prompt, max_tokens=60, policy=hybrid))
    assert [t for c in cycles for t in c.emitted] == plain(args, prompt, 60)
    sources = {c.source for c in cycles[:-1]}
    assert sources == {Source.LOOKUP, "oracle"}, sources  # lookup on 3-token matches, the oracle otherwise
    assert all(c.match_length >= 3 for c in cycles if c.source == Source.LOOKUP)
