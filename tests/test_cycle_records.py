"""The engine's words and records: str enums that serialise as the old strings, and
stored cycles (old ones with a policy dict included) that load and save unchanged."""

import json

from speculum.engine.cycle import Cycle, PolicyReport
from speculum.engine.decoder import Decoder
from speculum.engine.vocabulary import Finish, Mode, Source
from synthetic import FakeClock, SyntheticModel, noisy_copy

# A cycle as the version before PolicyReport stored it (cli --json, conversation files).
OLD_CYCLE = {
    "index": 3, "source": "lookup", "k": 2, "drafted": [5, 6], "drafted_text": ["a", "b"], "n_accepted": 1,
    "emitted": [5, 9], "emitted_text": ["a", "c"], "text": "ac", "p_drafted": [0.9, 0.1], "p_emitted": [0.9, 0.5],
    "draft_confidence": [1.0, 1.0], "match_length": 2, "draft_s": 1e-05, "draft_first_s": 0.0,
    "verify_s": 0.031, "overhead_s": 0.0004, "n_generated": 12, "finish": "max_tokens", "message": "",
    "policy": {"source": "lookup", "k": 2, "mode": "auto", "plain_tokens_per_s": 33.1,
               "verify_cost": {"2": 1.41, "3": 1.62, "5": 2.1, "9": 3.3}, "draft_cost": {"1": 0.61, "3": 1.4},
               "model_acceptance": [0.6, 0.6, 0.6, 0.6], "min_confidence": 0.0, "expected_tokens_per_s": 41.2,
               "expected_tokens_per_pass": 1.52, "lookup_match": 2, "expected_speedup": 1.245},
    "rejected": [6],
}


def test_words_equal_and_serialise_as_their_old_strings():
    for member, old in [(Mode.AUTO, "auto"), (Mode.OFF, "off"), (Mode.DRAFT, "draft"), (Mode.LOOKUP, "lookup"),
                        (Mode.MTP, "mtp"), (Source.MODEL, "model"), (Source.LOOKUP, "lookup"), (Source.MTP, "mtp"),
                        (Source.NONE, "none"),
                        (Finish.EOG, "eog"), (Finish.MAX_TOKENS, "max_tokens"), (Finish.STOPPED, "stopped"),
                        (Finish.CONTEXT_FULL, "context_full")]:
        assert member == old and isinstance(member, str)
        assert json.dumps(member) == json.dumps(old) and json.dumps({member: member}) == json.dumps({old: old})
        assert f"{member}" == str(member) == old and f"{member:<14}|" == f"{old:<14}|"
        assert {old: 1}[member] == 1 and {member: 1}[old] == 1
        assert type(member)(old) is member
    assert [m.value for m in Mode] == ["auto", "off", "draft", "lookup", "mtp"]  # the CLI's --mode choices, in order


def test_an_old_stored_cycle_with_a_policy_dict_loads_and_saves_unchanged():
    cycle = Cycle.from_json(json.loads(json.dumps(OLD_CYCLE)))
    assert cycle.source is Source.LOOKUP and cycle.finish is Finish.MAX_TOKENS
    policy = cycle.policy
    assert isinstance(policy, PolicyReport)
    assert policy.source is Source.LOOKUP and policy.mode is Mode.AUTO and policy.k == 2
    assert policy.verify_cost[3] == 1.62 and policy.lookup_match == 2 and policy.expected_speedup == 1.245
    assert json.dumps(cycle.to_json(), sort_keys=True) == json.dumps(OLD_CYCLE, sort_keys=True)
    # A fixed policy stored only its choice; a cycle from before policies stored none.
    fixed = Cycle.from_json({**OLD_CYCLE, "policy": {"source": "model", "k": 4}})
    assert fixed.policy == PolicyReport(Source.MODEL, 4) and fixed.to_json()["policy"] == {"source": "model", "k": 4}
    bare = Cycle.from_json({**OLD_CYCLE, "policy": {}})
    assert bare.policy is None and bare.to_json()["policy"] == {}


def test_cycles_round_trip_through_json():
    clock = FakeClock()
    target = SyntheticModel(n_vocab=8, seed=3, order=1, pass_cost=lambda n: 0.01 * n, clock=clock)
    dec = Decoder(target, noisy_copy(target, seed=4, noise=1.0), clock=clock)
    cycles = [c for mode in (Mode.AUTO, Mode.DRAFT, Mode.LOOKUP, Mode.OFF)
              for c in dec.generate([1, 2, 3, 1, 2], max_tokens=30, policy=mode, want_probs=True)]
    assert {c.source for c in cycles} >= {Source.MODEL, Source.NONE}
    for c in cycles:
        stored = json.loads(json.dumps(c.to_json()))
        again = Cycle.from_json(stored)
        assert again == c
        assert json.dumps(again.to_json()) == json.dumps(c.to_json())
