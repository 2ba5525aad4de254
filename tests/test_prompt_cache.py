"""The prompt cache: a prompt seen before resumes from its longest saved prefix, in both models,
within the memory budget; on real llama.cpp models, through the runner and over real HTTP."""

from __future__ import annotations

import pytest

from speculum.engine.decoder import Decoder
from speculum.engine.llama.model import LlamaModel
from speculum.engine.loading import load_decoder
from speculum.engine.settings import LoadOptions
from speculum.engine.promptcache import PromptCache
from test_backend import QWEN_MAX_NOISE
from test_engine_real import first_difference, generate, tokens_of, top2_gap

LIGHTHOUSE = " ".join(f"Line {i}: the lighthouse keeper logged the weather, the ships and the tide."
                      for i in range(24))
CODE = "".join(f"def step_{i}(state):\n    state.count += {i}\n    return state.count * {i + 1}\n\n" for i in range(12))


def run(decoder, prompt, **kw):
    """What each cycle drafted and emitted, and the prompt reads reported (read, total)."""
    reads = []
    cycles = list(decoder.generate(prompt, on_prompt=lambda read, total: reads.append((read, total)), **kw))
    return [(c.drafted, c.emitted) for c in cycles], reads


@pytest.mark.qwen
def test_a_cached_prefix_gives_the_cold_starts_greedy_tokens_in_both_models(qwen_pair):
    d = qwen_pair
    assert d.prompt_cache is not None
    document = tokens_of(d, CODE + "\nWhat does step_7 return for a fresh state? Answer with the code path.")
    other = tokens_of(d, "Write a haiku about the sea.")
    d.forget_prompts()
    cold, cold_reads = run(d, document, max_tokens=40, policy="draft", k=3)
    known = len(document) - 1  # the last prompt token goes in with the first pass
    assert cold_reads[-1] == (2 * known, 2 * known)  # the target, then the draft model, read it all
    run(d, other, max_tokens=8, policy="draft", k=3)  # another prompt takes both models' caches
    assert {s.owner for s in d.prompt_cache.states()} == {"target", "draft"}

    warm, warm_reads = run(d, document, max_tokens=40, policy="draft", k=3)
    assert warm_reads == []  # neither model read a token of the prompt again
    # All of it reused, the last token too: its row, read with the cold prompt, was kept with it.
    assert (d.stats.prompt_cached, d.stats.prompt_tokens) == (len(document), 0)
    cold_tokens, warm_tokens = ([t for _, out in cycles for t in out] for cycles in (cold, warm))
    i = first_difference(cold_tokens, warm_tokens)
    if i is None:  # the draft model's drafts, from its restored state, are the cold start's too
        assert warm == cold
        return
    # A difference only at a numerical tie of the cold start (design notes, "Numerics"), and the
    # same drafts up to the cycle that wrote it.
    with LlamaModel(d.target.path, LoadOptions(n_ctx=1024)) as ref:
        assert top2_gap(ref, document + cold_tokens[:i]) < QWEN_MAX_NOISE, i
    written, same = 0, 0
    while written + len(cold[same][1]) <= i:
        written += len(cold[same][1])
        same += 1
    assert warm[:same + 1][:-1] == cold[:same] and warm[same][0] == cold[same][0]


@pytest.fixture
def small_model(smollm_path):
    with LlamaModel(smollm_path, LoadOptions(n_ctx=2048)) as model:
        yield model


def state_size(model, tokens) -> int:
    model.reset()
    model.prefill(tokens)
    size = len(model.save_state())
    model.reset()
    return size


def test_the_budget_keeps_the_latest_states_and_is_never_exceeded(small_model):
    prompts = [small_model.tokenize(f"Note {n}: " + LIGHTHOUSE.replace("weather", f"weather ({n})")[:700])
               for n in range(5)]
    # Room for two saved states (a prompt and the answer's first 7 tokens), never three.
    size = state_size(small_model, prompts[0] + prompts[0][:7])
    cache = PromptCache(budget=int(2.5 * size))
    decoder = Decoder(small_model, prompt_cache=cache)
    for prompt in prompts:
        generate(decoder, prompt, max_tokens=8, policy="off")
        assert cache.size <= cache.budget
        assert decoder.stats.prompt_cached < 8  # each was new
    # Each answer's state was kept as it ended (the fifth's too, while it stays live); two fit:
    # the latest two, the oldest evicted.
    def kept(prompt):
        return any(list(s.tokens[:len(prompt)]) == prompt for s in cache.states())

    assert len(cache) == 2
    assert [kept(p) for p in prompts] == [False, False, False, True, True]
    generate(decoder, prompts[3], max_tokens=8, policy="off")
    assert (decoder.stats.prompt_cached, decoder.stats.prompt_tokens) == (len(prompts[3]), 0)
    generate(decoder, prompts[0], max_tokens=8, policy="off")
    assert decoder.stats.prompt_cached < 8  # evicted: read again
    assert cache.size <= cache.budget

    # A state larger than the whole budget is not kept, and evicts nothing.
    long_prompt = small_model.tokenize(LIGHTHOUSE * 3)
    before = {id(s) for s in cache.states()}
    generate(decoder, long_prompt, max_tokens=4, policy="off")
    assert {id(s) for s in cache.states()} == before and len(before) == 2
    generate(decoder, prompts[4], max_tokens=4, policy="off")
    assert all(len(s.tokens) < len(long_prompt) for s in cache.states())
    assert cache.size <= cache.budget


def test_switching_back_to_a_conversation_reads_only_its_new_turn(smollm_path, data_dirs):
    from speculum.protocol import Finished, GenerationRequest, LoadRequest
    from speculum.runner import EngineRunner

    events = []
    runner = EngineRunner(events.append)
    assert runner.load(LoadRequest(str(smollm_path), options=LoadOptions(n_ctx=2048)))

    def answer(conversation, messages):
        events.clear()
        runner.generate(GenerationRequest(conversation, messages, max_tokens=12))
        assert isinstance(events[-1], Finished)
        return events[-1].result

    first = [{"role": "user", "content": LIGHTHOUSE + "\nWhat did the keeper log?"}]
    one = answer("c1", first)
    answer("c2", [{"role": "user", "content": CODE + "\nWhat does step_3 return?"}])
    follow_up = first + [{"role": "assistant", "content": one.text}, {"role": "user", "content": "And then?"}]
    again = answer("c1", follow_up)
    target = runner.decoder.target
    before = len(target.tokenize(target.apply_chat_template(first)))
    total = len(target.tokenize(target.apply_chat_template(follow_up)))
    snap = again.snapshot
    assert snap.prompt_total == total
    # The first turn came back from the cache; only the new turn was read.
    assert snap.prompt_reused >= before - 1
    # (processed + reused = total: the prompt's last token counts as read, issue 49's point 12)
    assert snap.prompt_tokens == total - snap.prompt_reused <= total - before + 8


def test_a_repeated_api_request_reads_only_its_new_tokens(smollm_path, data_dirs):
    from speculum.server.service import ServedModel
    from live_server import LiveServer

    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=2048, flash_attn=True))
    server = LiveServer(ServedModel(decoder, "smol", mode="auto"))
    try:
        client = server.client()

        def ask(messages):
            reply = client.chat.completions.create(model="smol", messages=messages, max_tokens=8, temperature=0)
            return reply, decoder.stats.prompt_tokens

        system = {"role": "system", "content": "Answer from this log only.\n" + LIGHTHOUSE}
        first, read = ask([system, {"role": "user", "content": "What did the keeper log?"}])
        assert read == first.usage.prompt_tokens - 1  # cold: all of it
        ask([{"role": "user", "content": "Write a haiku about the sea."}])  # another client's request
        # The same request again: nothing read, the last token's row kept with the saved state.
        again, read = ask([system, {"role": "user", "content": "What did the keeper log?"}])
        assert read == 0 and again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens
        assert again.choices[0].message.content == first.choices[0].message.content
        # The system prompt and log resent with a new question: only the question is read.
        other, read = ask([system, {"role": "user", "content": "Which line mentions line 7?"}])
        cached = other.usage.prompt_tokens_details.cached_tokens
        assert cached > first.usage.prompt_tokens - 20
        assert read == other.usage.prompt_tokens - 1 - cached < 20
    finally:
        server.stop()
        decoder.target.close()


def test_without_a_budget_nothing_is_kept(small_model):
    decoder = Decoder(small_model, prompt_cache=PromptCache(budget=0))
    for text in ("First: " + LIGHTHOUSE[:400], "Second: " + LIGHTHOUSE[:400], "First: " + LIGHTHOUSE[:400]):
        generate(decoder, small_model.tokenize(text), max_tokens=4, policy="off")
    assert len(decoder.prompt_cache) == 0 and decoder.stats.prompt_cached < 8


def test_an_answers_state_is_kept_as_it_ends_so_a_regenerated_prompt_copies_nothing_first(small_model, monkeypatch):
    # The copy of the live KV state is made after the answer is out (between requests), not
    # when the next prompt arrives: a regenerated answer's first token waits for no copy.
    cache = PromptCache(budget=256 << 20)
    decoder = Decoder(small_model, prompt_cache=cache)
    prompt = list(small_model.tokenize("Note: " + LIGHTHOUSE[:700]))
    first, _ = generate(decoder, prompt, max_tokens=8, policy="off")
    assert len(cache) == 1 and list(cache.states()[0].tokens) == prompt + first[:-1]  # kept as it ended
    # The first token of a prompt sent again comes from the row its cold read gave, kept with it:
    # no pass, and the same token, however near a tie it was.
    passes = []
    decode = small_model.decode
    monkeypatch.setattr(small_model, "decode", lambda tokens, rows=None: passes.append(len(tokens)) or decode(tokens, rows))
    second, _ = generate(decoder, prompt, max_tokens=8, policy="off")
    assert second == first and len(passes) == len(first) - 1  # one pass a token after the first
    copies = []
    save_state = small_model.save_state
    monkeypatch.setattr(small_model, "save_state", lambda: copies.append(1) or save_state())
    again, _ = generate(decoder, prompt, max_tokens=8, policy="off")
    assert again == first and copies == []  # the same answer: held already, before and after
    assert (decoder.stats.prompt_cached, decoder.stats.prompt_tokens) == (len(prompt), 0)


def test_a_new_decoder_on_loaded_models_starts_from_an_empty_cache(smollm_path, data_dirs):
    # Flash attention: SmolLM2 Q4_1's logits do not depend on the batch, so answers compare exactly.
    first = load_decoder(smollm_path, None, LoadOptions(n_ctx=512, flash_attn=True))
    try:
        prompt = tokens_of(first, "Name three rivers in Europe.")
        answer, _ = generate(first, prompt, max_tokens=16, policy="off")
        assert first.target.n_past > 0
        again = Decoder(first.target, None)  # (a benchmark's fresh run, a reloaded engine's)
        assert again.target.n_past == 0  # the old sequence's tokens would sit before the new prompt
        assert generate(again, prompt, max_tokens=16, policy="off")[0] == answer
    finally:
        first.target.close()
