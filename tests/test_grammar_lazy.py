"""The lazy grammar (tool calls under ``tool_choice: auto``), over a real llama.cpp vocabulary:
free text until a trigger is written, then exactly the grammar, from the trigger's first
character; a token that ends a trigger and goes on is allowed only where what follows the
trigger in it is what the grammar allows. A state is a function of the tokens followed alone,
so a clone walked down a draft and dropped leaves the answer's state as it was."""

import numpy as np
import pytest

from grammar_vocab import CharModel
from speculum.engine.grammar.lazy import LazyGrammar, Trigger
from speculum.engine.grammar.state import Grammar

CHARS = [chr(c) for c in range(32, 127)]
MULTI = ["<call>", ">{", ">x", "l>", "hello", '{"', "x{"]
PIECES = ["<unk>", "<s>", "</s>"] + CHARS + MULTI
EOS = 2
GRAMMAR = Grammar('root ::= "<call>" "{" [a-z]+ "}" | "{" "\\"" [a-z]+ "\\"" "}"')


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return CharModel(tmp_path_factory.mktemp("vocab") / "lazy.gguf", PIECES)


def lazy(model):
    return LazyGrammar(GRAMMAR, (Trigger("<call>"), Trigger("{", at_start=True))).start(model)


def write(state, pieces):
    for piece in pieces:
        state.accept(PIECES.index(piece))
    return state


def test_free_text_until_a_trigger_then_exactly_the_grammar(model):
    state = write(lazy(model), list("Let me see. "))
    assert state.allowed().all()  # anything, the end included
    write(state, list("<call"))
    assert not state.triggered and state.allows(PIECES.index("!"))
    write(state, [">"])
    assert state.triggered
    assert state.allows(PIECES.index("{")) and not state.allows(PIECES.index("a")) and not state.allows(EOS)
    write(state, list("{ab}"))
    assert state.allows(EOS) and not state.allows(PIECES.index("x"))


def test_the_trigger_as_one_token_and_tokens_reaching_past_it(model):
    assert write(lazy(model), ["<call>"]).triggered
    state = write(lazy(model), list("ok <cal"))
    # "l>" ends the trigger exactly; after "<call", ">{" goes on as the grammar says, ">x" does not
    assert state.allows(PIECES.index("l>"))
    write(state, ["l"])
    assert state.allows(PIECES.index(">{")) and not state.allows(PIECES.index(">x"))
    mask = state.allowed()
    assert mask[PIECES.index(">{")] and not mask[PIECES.index(">x")] and mask.sum() == len(PIECES) - 1
    write(state, [">{"])
    assert state.triggered and not state.allows(PIECES.index("}")) and state.allows(PIECES.index("q"))


def test_an_at_start_trigger_holds_only_as_the_first_text(model):
    state = write(lazy(model), list("  "))
    assert state.allows(PIECES.index('{"')) and state.allows(PIECES.index("x{"))  # (only "{" first starts it)
    write(state, ['{"'])
    assert state.triggered and state.allows(PIECES.index("a")) and not state.allows(PIECES.index("1"))
    later = write(lazy(model), list("see {"))
    assert not later.triggered and later.allows(PIECES.index("1"))


def test_clones_walk_on_their_own(model):
    state = write(lazy(model), list("<cal"))
    walk = state.clone()
    write(walk, ["l>", "{", "a"])
    assert walk.triggered and not state.triggered and state.allows(PIECES.index("!"))
    assert state.allowed_prefix([PIECES.index(p) for p in ["l", ">", "x"]]) == 2


def test_the_greedy_pick_skips_what_the_grammar_forbids_once_triggered(model):
    state = write(lazy(model), list("<call>"))
    logits = np.zeros(len(PIECES), dtype=np.float32)
    logits[PIECES.index("x")] = 5.0
    logits[PIECES.index("{")] = 1.0
    assert state.best(logits) == PIECES.index("{")
    free = lazy(model)
    assert free.best(logits) == PIECES.index("x")
