"""The speculative engine on real llama.cpp models."""

import threading

import numpy as np
import pytest

from speculum.engine.llama.model import LlamaModel
from speculum.engine.loading import load_decoder
from speculum.engine.settings import LoadOptions
from speculum.errors import SpeculumError
from test_backend import QWEN_MAX_NOISE

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Rename the variable `total` to `running_sum` in this code and show the full result:\n\n"
    "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n",
    "Explain in two sentences what a hash map is.",
]


def tokens_of(decoder, user):
    t = decoder.target
    return t.tokenize(t.apply_chat_template([{"role": "user", "content": user}]))


def generate(decoder, prompt, **kw):
    cycles = list(decoder.generate(prompt, **kw))
    return [t for c in cycles for t in c.emitted], cycles


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(model, tokens):
    model.reset()
    row = np.sort(model.prefill(tokens).astype(np.float64))
    model.reset()
    return row[-1] - row[-2]


@pytest.mark.qwen
@pytest.mark.parametrize("user", PROMPTS)
def test_qwen_greedy_speculation_equals_plain_up_to_ties(qwen_pair, user):
    prompt = tokens_of(qwen_pair, user)
    plain, _ = generate(qwen_pair, prompt, max_tokens=48, policy="off")
    for mode in ("draft", "lookup"):
        spec, cycles = generate(qwen_pair, prompt, max_tokens=48, policy=mode)
        assert any(c.drafted for c in cycles), mode
        i = first_difference(plain, spec)
        if i is not None:
            # Allowed only at a numerical tie of the reference (design notes, "Numerics").
            with LlamaModel(qwen_pair.target.path, LoadOptions(n_ctx=1024)) as ref:
                gap = top2_gap(ref, prompt + plain[:i])
            assert gap < QWEN_MAX_NOISE, (mode, i, gap)


@pytest.mark.qwen
def test_qwen_draft_acceptance_on_the_default_code_prompt(qwen_pair):
    from speculum.bench import load_prompts

    code = next(p for p in load_prompts() if p.name == "code-writing")
    prompt = qwen_pair.target.tokenize(qwen_pair.target.apply_chat_template(code.messages()))
    # One token a cycle: the draft model's own agreement with the target. (Adaptive drafts go
    # longer, into less confident tokens, where acceptance per token is lower by design.)
    generate(qwen_pair, prompt, max_tokens=code.max_tokens, policy="draft", k=1)
    assert qwen_pair.stats.acceptance_rate >= 0.85, qwen_pair.stats.summary()


@pytest.mark.qwen
def test_vocabulary_mismatch_refused_before_decoding(qwen_target_path, gemma_path, smollm_path):
    with pytest.raises(SpeculumError) as err:
        load_decoder(qwen_target_path, gemma_path)
    msg = str(err.value)
    assert "151,936" in msg and "262,144" in msg and "target" in msg and "draft" in msg
    with pytest.raises(SpeculumError, match="49,152"):
        load_decoder(qwen_target_path, smollm_path)


def test_stop_from_another_thread_within_one_pass(smollm_path):
    decoder = load_decoder(smollm_path, smollm_path, LoadOptions(n_ctx=1024))
    prompt = tokens_of(decoder, "Write a long story about a lighthouse keeper.")
    stop = threading.Event()
    seen = []
    after_stop = []

    def consume():
        for c in decoder.generate(prompt, max_tokens=400, policy="draft", stop=stop):
            (after_stop if stop.is_set() else seen).append(c)

    worker = threading.Thread(target=consume)
    worker.start()
    while len(seen) < 5:
        worker.join(0.005)
    stop.set()
    worker.join(30)
    assert not worker.is_alive()
    # At most the pass in flight finishes, then the stop event.
    assert after_stop[-1].finish == "stopped"
    assert len(after_stop) <= 2
    partial = [t for c in seen + after_stop for t in c.emitted]
    assert 5 <= len(partial) < 400

    # The caches are consistent: the same decoder now gives what a fresh one gives.
    again, _ = generate(decoder, prompt, max_tokens=40, policy="draft")
    fresh = load_decoder(smollm_path, smollm_path, LoadOptions(n_ctx=1024))
    expected, _ = generate(fresh, prompt, max_tokens=40, policy="off")
    assert again == expected


def test_the_target_verifies_without_flash_attention_on_the_cpu(smollm_path):
    # The CPU's flash attention walks the whole cache once per row of a verification pass
    # (cpu_settings): off for the target there; the draft model, one row at a time, keeps it.
    from speculum.engine.llama.native import gpu_backend

    decoder = load_decoder(smollm_path, smollm_path, LoadOptions(n_ctx=256))
    assert decoder.target.flash_attn is (False if gpu_backend() is None else None)
    assert decoder.draft.flash_attn is None
    decoder.target.close()
    decoder.draft.close()
    # (its answers are plain decoding's up to ties: the Qwen tests above, the self-test's)
    chosen = load_decoder(smollm_path, None, LoadOptions(n_ctx=256, flash_attn=True))  # the user's choice stands
    assert chosen.target.flash_attn is True
    chosen.target.close()


@pytest.mark.qwen
def test_without_flash_attention_a_long_context_reads_in_smaller_micro_batches(qwen_target_path):
    # Its attention scores, n_ctx x micro-batch x heads, are reserved with the context: at 32k
    # tokens a 512-token micro-batch would hold 0.8 GB of them (cpu_settings.attention).
    from speculum.engine.llama import cpu_settings
    from speculum.engine.llama import native

    with LlamaModel(qwen_target_path, LoadOptions(n_ctx=32768), verifies=True) as model:
        if native.gpu_backend() is None:
            assert model.flash_attn is False and model.n_ubatch == 128  # 32768 x 128 x 12 heads x 4 bytes
            buffer = next(line for line in native._log_lines if "compute buffer size" in line)
            assert float(buffer.split("=")[1].split()[0]) < 400  # MiB (1,000 and more at 512)
        prompt = model.tokenize("def f(x):\n    return x * 2\n" * 40)
        assert model.prefill(prompt).shape == (model.n_vocab,)  # a prompt of several micro-batches
    assert model.n_batch == 512  # a decode may still send 512 tokens at once
    # Where even 128 tokens would not fit (a 7B's 32 heads at 32k), flash attention stays
    assert cpu_settings.attention(None, True, True, False, n_ctx=32768, n_head=32, n_ubatch=512) == (None, 512)
    assert cpu_settings.attention(None, True, True, False, n_ctx=8192, n_head=32, n_ubatch=512) == (False, 256)
    assert cpu_settings.attention(False, True, True, False, n_ctx=32768, n_head=32, n_ubatch=512) == (False, 128)
    assert cpu_settings.attention(None, False, True, False, n_ctx=4096, n_head=12, n_ubatch=512) == (None, 512)


def test_context_full_keeps_what_was_generated(smollm_path):
    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=128))
    prompt = tokens_of(decoder, "List the numbers from one to two hundred, one per line.")
    out, cycles = generate(decoder, prompt, max_tokens=500, policy="lookup")
    assert cycles[-1].finish == "context_full"
    assert "context" in cycles[-1].message and "kept" in cycles[-1].message
    assert len(prompt) + len(out) == decoder.target.n_ctx  # llama.cpp may round the size up
    with pytest.raises(SpeculumError, match="prompt is"):
        list(decoder.generate(prompt * (decoder.target.n_ctx // len(prompt) + 1), max_tokens=4))


def test_lookup_copies_from_the_prompt(smollm_path):
    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=2048, flash_attn=True))
    text = ("alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike "
            "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu")
    prompt = tokens_of(decoder, f"Repeat exactly, word for word: {text}")
    # Both read the prompt cold, its last token in its last chunk (a cached prompt's last token is
    # read alone, and a row computed in a long batch may differ from a short one's in the last bits).
    plain, _ = generate(decoder, prompt, max_tokens=60, policy="off")
    decoder.forget_prompts()
    spec, cycles = generate(decoder, prompt, max_tokens=60, policy="lookup")
    s = decoder.stats
    assert spec == plain  # with flash attention SmolLM2 Q4_1 logits do not depend on a short batch's shape
    assert s.acceptance_rate > 0.5 and s.tokens_per_pass > 1.5, s.summary()
    assert any(c.n_accepted < len(c.drafted) for c in cycles)  # some drafts were rejected too


def test_second_turn_reuses_the_kv_cache(smollm_path):
    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=2048))
    t = decoder.target
    first = [{"role": "user", "content": "Name three colours."}]
    p1 = t.tokenize(t.apply_chat_template(first))
    out, cycles = generate(decoder, p1, max_tokens=30, policy="off")
    assert decoder.stats.prompt_tokens == len(p1) - 1
    answer = "".join(c.text for c in cycles)
    second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And three animals?"}]
    p2 = t.tokenize(t.apply_chat_template(second))
    generate(decoder, p2, max_tokens=10, policy="off")
    assert decoder.stats.prompt_tokens < len(p2) - len(p1)  # the first turn was not re-processed


def test_cycles_carry_texts_timings_and_probabilities(smollm_path):
    decoder = load_decoder(smollm_path, smollm_path, LoadOptions(n_ctx=1024))
    prompt = tokens_of(decoder, "Say hello.")
    _, cycles = generate(decoder, prompt, max_tokens=20, policy="draft", want_probs=True)
    for c in cycles:
        assert len(c.drafted_text) == len(c.drafted) and len(c.emitted_text) == len(c.emitted)
        assert len(c.p_emitted) == len(c.emitted) and all(0 <= p <= 1 for p in c.p_emitted)
        assert c.draft_s >= 0 and (c.verify_s > 0 or c.index == 0)  # (the first row came with the prompt)
    assert cycles[0].verify_s == 0 and cycles[0].drafted == [] and all(c.drafted for c in cycles[1:-1])
    assert sum(len(c.emitted) for c in cycles) == decoder.stats.tokens


def test_prompt_progress_is_reported_chunk_by_chunk_and_stop_cancels_it(smollm_path):
    from speculum.engine.decoder import PROMPT_CHUNK
    from speculum.protocol import CycleEvent, Finished, GenerationRequest, LoadRequest, PromptProgress
    from speculum.runner import EngineRunner

    events = []
    runner = EngineRunner(events.append)
    assert runner.load(LoadRequest(smollm_path, options=LoadOptions(n_ctx=2048)))
    document = " ".join(f"Line {i}: the lighthouse keeper logged the weather." for i in range(60))
    request = GenerationRequest("c1", [{"role": "user", "content": document + "\nSummarise."}], max_tokens=4)
    runner.generate(request)
    progress = [(e.read, e.total) for e in events if isinstance(e, PromptProgress)]
    total = progress[-1][1]
    assert total > 3 * PROMPT_CHUNK
    assert progress[0] == (0, total) and progress[-1] == (total, total)  # all read, the last token with the first pass
    reads = [read for read, _ in progress]
    assert reads == sorted(reads) and len(reads) >= 4  # one report per chunk, in order
    kinds = [type(e) for e in events]
    assert kinds.index(PromptProgress) < kinds.index(CycleEvent)  # shown before the first token
    assert isinstance(events[-1], Finished)

    # Stop while the prompt is read: the reading ends at the next chunk.
    events.clear()
    runner.decoder.forget_prompts()  # nothing cached (the prompt cache kept the answer's state): all read again

    def report(event):
        events.append(event)
        if isinstance(event, PromptProgress) and event.read > 0:
            runner.stop.set()

    runner.report = report
    runner.generate(request)
    runner.stop.clear()
    progress = [(e.read, e.total) for e in events if isinstance(e, PromptProgress)]
    assert progress[-1][0] == PROMPT_CHUNK < total  # one chunk read, then it stopped
    assert isinstance(events[-1], Finished) and events[-1].result.finish == "stopped"
    assert len(runner.decoder.sequence.tokens) == PROMPT_CHUNK
    # What the stats and the answer's note say of it: the chunk read, not the whole prompt.
    from speculum.ui.chat.answer import stopped_note

    stopped = events[-1].result
    assert (stopped.snapshot.prompt_tokens, stopped.snapshot.prompt_reused) == (PROMPT_CHUNK, 0)
    assert stopped_note(stopped.text, stopped.snapshot) == (
        f"Stopped while reading the prompt ({PROMPT_CHUNK:,} of {total:,} tokens read); nothing was written.")  # as the bar counts
    # Asked again, the chunk read is reused and the rest is read.
    events.clear()
    runner.report = events.append
    runner.generate(request)
    again = events[-1].result.snapshot
    assert (again.prompt_reused, again.prompt_tokens) == (PROMPT_CHUNK, total - PROMPT_CHUNK)


def test_cancel_pressed_as_the_load_ends_still_cancels_it(smollm_path, monkeypatch):
    # The window's Cancel can reach the engine after llama.cpp's last progress call; a load
    # that finished then is dropped, not reported as loaded.
    from speculum import runner as runner_module
    from speculum.protocol import Loaded, LoadFailed, LoadRequest
    from speculum.runner import EngineRunner

    events = []
    runner = EngineRunner(events.append)
    real = runner_module.load_decoder

    def load_then_cancel(*args, **kwargs):
        decoder = real(*args, **kwargs)
        runner.cancel_load.set()
        return decoder

    monkeypatch.setattr(runner_module, "load_decoder", load_then_cancel)
    assert not runner.load(LoadRequest(smollm_path, options=LoadOptions(n_ctx=512)))
    assert events[-1] == LoadFailed("Loading was cancelled.")
    assert runner.decoder is None and not any(isinstance(e, Loaded) for e in events)
