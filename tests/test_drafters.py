"""The drafter registry: a new drafter is one class (a ``Drafter``) and one entry, used with no decoder change."""

import numpy as np

from speculum.engine.drafting import drafters
from speculum.engine.decoder import Decoder
from speculum.engine.drafting import copycursor
from speculum.engine.drafting.copycursor import Spelling, renamed_word
from speculum.engine.drafting.draft import Choice, Draft, Drafter, NO_MATCH
from speculum.engine.drafting.lookup import PromptLookup, SuffixIndex
from speculum.engine.drafting.modeldrafter import ModelDrafter
from speculum.engine.policy.fixed import FixedPolicy
from speculum.engine.vocabulary import Source
from synthetic import SyntheticModel


class OracleDrafter(Drafter):
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
    # No draft model: no model drafter (the grammar's drafts only where an answer has a grammar)
    assert set(dec.drafters) == {Source.LOOKUP, Source.PREDICTION, Source.GRAMMAR, "oracle"}
    cycles = list(dec.generate([1, 2, 3], max_tokens=40, policy=FixedPolicy(Choice("oracle", 3))))
    assert [t for c in cycles for t in c.emitted] == plain(args, [1, 2, 3], 40)
    assert cycles[0].drafted == [] and len(cycles[0].emitted) == 1  # the prompt's last row: no pass
    assert all(c.source == "oracle" and c.n_accepted == len(c.drafted) == 3 for c in cycles[1:-1])
    assert dec.stats.acceptance_rate == 1.0 and dec.stats.passes_by_source == {
        Source.NONE: 1, "oracle": len(cycles) - 1}  # (the prompt's last chunk, the first token's pass)
    assert oracle.begun == 1 and oracle.accepted == len(cycles)


def test_hybrid_falls_back_when_the_first_drafter_has_nothing(monkeypatch):
    monkeypatch.setitem(drafters.DRAFTERS, "oracle", OracleDrafter)
    args = dict(n_vocab=6, seed=7, order=1)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 0, 1, 2]
    dec = Decoder(SyntheticModel(**args))
    hybrid = FixedPolicy(Choice(Source.LOOKUP, 4, min_match=3, fallback="oracle"))
    cycles = list(dec.generate(prompt, max_tokens=60, policy=hybrid))
    assert [t for c in cycles for t in c.emitted] == plain(args, prompt, 60)
    sources = {c.source for c in cycles[1:-1]}  # (the first token: the prompt's last row)
    assert sources == {Source.LOOKUP, "oracle"}, sources  # lookup on 3-token matches, the oracle otherwise
    assert all(c.match_length >= 3 for c in cycles if c.source == Source.LOOKUP)


def _longest_earlier_suffix(tokens):
    """Brute force: the longest suffix of ``tokens`` that also ends at an earlier position."""
    n = len(tokens)
    for length in range(n - 1, 0, -1):
        suffix = tokens[n - length:]
        if any(tokens[end - length + 1:end + 1] == suffix for end in range(length - 1, n - 1)):
            return length
    return 0


def test_suffix_index_finds_the_longest_earlier_match_incrementally():
    rng = np.random.default_rng(3)
    for vocab in (2, 3, 7, 50):
        tokens = [int(t) for t in rng.integers(0, vocab, size=120)]
        index = SuffixIndex()
        for i, tok in enumerate(tokens):
            index.extend([tok])  # one token at a time, as a generation grows
            m = index.match
            assert m.length == _longest_earlier_suffix(tokens[:i + 1]), (vocab, i)
            if m.length:  # a real earlier occurrence, with tokens after it to copy
                assert m.end < i and tokens[m.end - m.length + 1:m.end + 1] == tokens[i + 1 - m.length:i + 1]
                assert m.available == i - m.end


def test_lookup_copies_a_long_passage_and_reports_its_full_match_length():
    passage = list(range(100, 160))
    lookup = PromptLookup()
    context = [1, 2] + passage + [3, 4] + passage[:25]
    lookup.begin(context)
    m = lookup.match(context)
    assert m.length == 25 and m.available == 60 - 25 + 2 + 25  # matched far beyond 3 tokens
    draft = lookup.propose(context, 15, Choice(Source.LOOKUP, 15), None, None)
    assert draft.tokens == passage[25:40] and draft.match_length == 25
    # As the copy goes on, the match grows with it.
    context += passage[25:30]
    assert lookup.match(context).length == 30


def test_lookup_starts_over_when_the_context_is_not_an_extension():
    lookup = PromptLookup()
    lookup.begin([5, 6, 7, 8, 5, 6, 7])
    assert lookup.match([5, 6, 7, 8, 5, 6, 7]).length == 3
    # A new conversation (or an edited one): nothing of the old text may be matched.
    lookup.begin([9, 10, 11, 9])
    assert lookup.tokens == [9, 10, 11, 9]
    m = lookup.match([9, 10, 11, 9])
    assert (m.length, m.end) == (1, 0)
    # A context truncated behind the index's back is caught by match() itself.
    assert lookup.match([9, 10, 9, 10]).length == 2 and lookup.tokens == [9, 10, 9, 10]
    assert lookup.match([1, 2, 3]) == NO_MATCH


def test_the_draft_model_counts_a_new_prompt_as_unread_after_a_longer_one():
    # Its cache holds an earlier, longer prompt sharing only a template prefix with the new one:
    # the new prompt is all to read (a guess from the end once said 8 tokens, and auto mode
    # tried the draft model on a long document as if it were nearly free).
    drafter = ModelDrafter(SyntheticModel(n_vocab=64, seed=3))
    earlier = [1, 2, 3] + [5] * 60
    drafter.sequence.feed(earlier)
    new = [1, 2, 3] + [7] * 40
    assert drafter.behind(new) == 40
    assert drafter.behind(earlier[:50]) == 0  # a prefix of what it read: nothing to read
    assert drafter.behind(earlier[:30] + [9, 9]) == 2  # diverged late: only the new tail
    assert drafter.sequence.common(new) == 3 and drafter.sequence.tokens == earlier  # counting trims nothing


# -- an edit that repeats itself: lookup learns it at its first occurrence --

OLD, NEW = 199, (113, 7)  # a rename: 199 became two tokens, the first of them also a token of the text
CODE = [OLD if i in (10, 30, 50) else t for i, t in enumerate(range(100, 160))]
PROMPT = [1, 2, *CODE, 3]


def renamed(upto):
    """The answer: CODE up to (not including) index ``upto``, with the name changed."""
    return [t for c in CODE[:upto] for t in (NEW if c == OLD else (c,))]


def answered(lookup, upto):
    """The lookup after the answer so far was written token by token, as the decoder's cycles would."""
    lookup.begin(PROMPT)
    context = list(PROMPT)
    for t in renamed(upto):
        lookup.match(context)
        context.append(t)
    return lookup.match(context), context


def test_lookup_learns_a_rename_and_copies_its_next_occurrence_with_the_new_name():
    lookup = PromptLookup()
    answered(lookup, 12)
    assert lookup.substitutions == {}  # one token followed after the change: not sure yet
    answered(lookup, 14)
    assert lookup.substitutions == {OLD: {(OLD,): NEW}}
    m, context = answered(lookup, 30)  # just before the name's second occurrence
    draft = lookup.propose(context, 6, Choice(Source.LOOKUP, 6, min_match=m.length), None, None)
    assert draft.tokens == [*NEW, *CODE[31:35]]  # the new name, then the code after it
    # Written so, the copy goes on from the code (not from the new name's first place in the answer)
    # and is trusted as one long copy.
    m, context = answered(lookup, 31)
    assert lookup.copy(3) == CODE[31:34] and m.length > 16


def test_lookup_without_a_repeated_edit_copies_as_the_longest_match_says():
    lookup = PromptLookup()
    lookup.begin(PROMPT)
    context = PROMPT + CODE[:20]  # no edit: the longest match is the copy
    m = lookup.match(context)
    assert m.length == 20 and lookup.copy(4) == CODE[20:24] and lookup.substitutions == {}


def test_the_oracle_counts_a_renamed_copy_as_right():
    from speculum.bench import copy_fates

    output = renamed(len(CODE))
    fates = copy_fates(PROMPT, output)
    second = len(renamed(30))  # where the second occurrence's new name starts
    assert fates[second][1] == 15  # the whole copy right, the new name in it


def test_a_renamed_word_is_renamed_in_every_token_that_spells_it(smollm):
    # " area" after "def" is one token, "area" after "(" another: a substitution of tokens alone
    # copied "print(area(2, 3))" after the answer had written "def surface(w, h):".
    from speculum.bench import copy_fates

    def tokens(text):
        return smollm.tokenize(text)

    prompt = tokens("Rename it:\n```python\ndef area(w, h):\n    return w * h\n\nprint(area(2, 3))\nx = area(4, 5)\n")
    answer = tokens("```python\ndef surface(w, h):\n    return w * h\n\nprint(surface(2, 3))\nx = surface(4, 5)\n")
    spelt = [smollm.token_bytes(t) for t in prompt]
    assert b" area" in spelt and b"area" in spelt
    at = answer.index(tokens("print")[0]) + 2  # just after "print(": the renamed word comes next
    for spelling, right in ((None, False), (Spelling.of(smollm), True)):
        lookup = PromptLookup(spelling=spelling)
        lookup.begin(prompt)
        context = list(prompt)
        for t in answer[:at]:
            lookup.match(context)
            context.append(t)
        lookup.match(context)
        assert (lookup.copy(6) == answer[at:at + 6]) == right, smollm.detokenize(lookup.copy(6))
    fates = copy_fates(prompt, answer, spelling=Spelling.of(smollm))
    assert fates[at][1] >= 6  # the oracle counts it right too
    assert copy_fates(prompt, answer)[at][1] == 0


def test_a_rename_is_forgotten_where_the_answer_keeps_the_old_word(smollm):
    spelling = Spelling.of(smollm)
    prompt = smollm.tokenize("Rename it:\n```python\ndef area(w, h):\n    return w * h\n\nprint(area(2, 3))\n"
                             "print(area(4, 5))\n")
    answer = smollm.tokenize("```python\ndef surface(w, h):\n    return w * h\n\nprint(area(2, 3))\nprint(")
    lookup = PromptLookup(spelling=spelling)
    lookup.begin(prompt)
    context = list(prompt)
    for t in answer:
        lookup.match(context)
        context.append(t)
    lookup.match(context)
    assert smollm.detokenize(lookup.copy(2)).startswith("area")  # kept once: the old word copied again


def test_only_one_word_for_another_is_a_rename():
    assert renamed_word(" area", " surface") == ("area", "surface")
    assert renamed_word("(area", "(surface") == ("area", "surface")
    assert renamed_word(" area", "surface") is None  # framed otherwise
    assert renamed_word(" area", " total area") is None and renamed_word(" a", " a") is None


def test_lookup_forgets_a_change_the_answer_does_not_repeat():
    lookup = PromptLookup()
    lookup.begin(PROMPT)
    context = list(PROMPT)
    answer = renamed(14) + CODE[14:45]  # changed once, then the old name kept at its second place
    for t in answer:
        lookup.match(context)
        context.append(t)
    assert lookup.substitutions == {}
    lookup.match(context)
    assert lookup.copy(8) == CODE[45:53]  # the third place copied as the text has it


def test_a_copy_rejoined_right_after_a_local_change_goes_on_as_the_same_copy():
    # A typo fixed: three tokens of the text ([50, 51, 52]) written as one ([99]), then the text
    # again. The next token after the fix finds the copy a few tokens on from where it was left,
    # and the copy goes on there with some of the trust of its run before the change (not as a
    # new match of one token, copied only after three more were written plainly).
    text = list(range(10, 30)) + [50, 51, 52] + list(range(30, 60))
    prompt = [1, 2, *text, 3, 4]

    def written(answer: list[int]):
        lookup = PromptLookup()
        lookup.begin(prompt)
        context = list(prompt)
        for t in answer:  # the policy asks for the match each cycle
            lookup.match(context)
            context.append(t)
        return lookup, lookup.match(context)

    lookup, m = written(text[:20] + [99, 30])
    assert lookup.copy(4) == [31, 32, 33, 34]
    assert m.length == 1 + copycursor.REJOIN_TRUST
    _, m = written(text[:10] + [99, 30])  # a short copy before the change: a chance rejoin, maybe
    assert m.length == 1
    # Nothing near where it left: no rejoining (a token found further on is no such copy).
    _, m = written(text[:20] + [99, 45])
    assert m.length <= 1
