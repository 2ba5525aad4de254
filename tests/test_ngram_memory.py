"""The n-gram memory: drafts from what this machine wrote and read before, bounded on disk,
forgotten with its conversation, and never trusting its file."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from speculum import paths
from speculum.conversations import Conversation, ConversationStore
from speculum.engine.drafting import ngrammemory
from speculum.engine.drafting.draft import Choice
from speculum.engine.loading import load_decoder
from speculum.engine.settings import LoadOptions
from speculum.engine.drafting.ngrammemory import HEADER, MAGIC, NgramMemory
from speculum.engine.sampling import SamplingParams
from speculum.engine.vocabulary import Source
from test_engine_real import generate, tokens_of

QUESTION = "Write a Python function that checks whether a word is a palindrome, with a docstring."


@pytest.fixture
def decoder(smollm_path, data_dirs):
    # Flash attention: SmolLM2 Q4_1's logits do not depend on the batch, so answers compare exactly.
    d = load_decoder(smollm_path, None, LoadOptions(n_ctx=1024, flash_attn=True, prompt_cache_mib=64))
    yield d
    d.target.close()


def test_it_drafts_a_regenerated_answer(decoder):
    prompt = tokens_of(decoder, QUESTION)
    answer, _ = generate(decoder, prompt, max_tokens=64, policy="off", origin="c1")
    memory = decoder.drafters[Source.MEMORY]
    draft = memory.propose(prompt, 8, Choice(Source.MEMORY, 8, min_match=4), SamplingParams(), None)
    assert draft.tokens == answer[:8] and draft.source == Source.MEMORY

    # As in the window, the verify curve is measured while the engine waits for the next request:
    # on this model 2-3 tokens a pass cost what as many plain steps do, and a policy left to
    # time them itself took 10 to 24 one-token copies before it trusted a long one.
    assert decoder.calibrate()
    again, cycles = generate(decoder, prompt, max_tokens=64, policy="auto", origin="c1")
    assert again == answer
    drafted, accepted = decoder.stats.by_source[Source.MEMORY]
    assert accepted >= len(answer) // 2 and accepted >= 0.9 * drafted
    assert decoder.stats.passes_by_source[Source.MEMORY] < len(answer) // 3  # many tokens a pass
    assert any(c.source == "memory" for c in cycles)  # the passes carry the source's name


def test_a_context_seen_whole_before_is_told_apart_from_one_that_shares_only_its_end():
    rng = np.random.default_rng(3)
    text = rng.integers(0, 1000, 300).tolist()
    memory = NgramMemory(1000)
    memory.remember(text, "c1")
    # The same prompt again: agreement measured all the way back, past the candidates' 32.
    end, length, available = memory.match(text[:200])
    assert length == 200 and available == 100 and memory.copy(end, 3) == text[200:203]
    # Another prompt ending in the same 40 tokens (a document resent with a new question first).
    other = rng.integers(0, 1000, 160).tolist() + text[160:200]
    assert memory.match(other)[1] == 40
    # Within the candidates' reach, as before.
    assert memory.match(rng.integers(0, 1000, 50).tolist() + text[180:200])[1] == 20


def test_it_is_bounded_on_disk(tmp_path):
    path = tmp_path / "vocab.bin"
    memory = NgramMemory(1000, path, max_tokens=500)
    rng = np.random.default_rng(0)
    texts = [rng.integers(0, 1000, 120).tolist() for _ in range(12)]
    for n, text in enumerate(texts):
        memory.remember(text, f"c{n}")
        assert memory.n_tokens <= 500
        assert path.stat().st_size <= HEADER.size + 4 * 500 + 40 * 12
    # The latest four fit; the oldest went first.
    assert memory.origins() == {"c8", "c9", "c10", "c11"}
    reread = NgramMemory(1000, path, max_tokens=500)
    assert reread.origins() == memory.origins() and reread.n_tokens == 480
    end, length, _ = reread.match(texts[11][:50])
    assert length >= 16 and reread.copy(end, 5) == texts[11][50:55]
    assert reread.match(texts[0][:50])[0] == -1
    # A conversation's next turn replaces the turn it extends; a text longer than the cap keeps its end.
    memory.remember(texts[11] + texts[10][:30], "c11")
    assert memory.origins() == {"c9", "c10", "c11"} and memory.n_tokens == 120 + 150 + 120
    memory.remember(rng.integers(0, 1000, 900).tolist(), "long")
    assert memory.origins() == {"long"} and memory.n_tokens == 500


def test_it_is_emptied_when_its_conversation_is_deleted(decoder):
    store = ConversationStore()
    kept, deleted = Conversation(title="kept"), Conversation(title="deleted")
    for conversation in (kept, deleted):
        store.save(conversation)
    answers = {}
    for conversation, question in ((deleted, QUESTION), (kept, "Name three rivers in Europe.")):
        prompt = tokens_of(decoder, question)
        answers[conversation.id] = generate(decoder, prompt, max_tokens=24, policy="off", origin=conversation.id)[0]
    assert decoder.memory.origins() == {kept.id, deleted.id}
    prompt = tokens_of(decoder, QUESTION)
    memory = decoder.drafters[Source.MEMORY]
    assert decoder.memory.copy(memory.match(prompt).end, 4) == answers[deleted.id][:4]

    store.delete(deleted.id)  # in the window's process: another copy of the memory than the engine's
    assert not (store.folder / f"{deleted.id}.json").exists()
    on_disk = NgramMemory.for_model(decoder.target)
    assert on_disk.origins() == {kept.id}
    # The engine's memory reads the change when its next generation begins, and drafts nothing of it.
    memory.begin(prompt)
    assert decoder.memory.origins() == {kept.id}
    end, _, _ = memory.match(prompt)
    assert end < 0 or decoder.memory.copy(end, 4) != answers[deleted.id][:4]
    _, cycles = generate(decoder, prompt, max_tokens=24, policy="auto", origin="c3")
    assert decoder.memory.origins() == {kept.id, "c3"}
    deleted_start = answers[deleted.id][:3]
    assert not any(c.source == Source.MEMORY and c.drafted[:3] == deleted_start for c in cycles)


def _valid_file(path, n_vocab=1000) -> bytes:
    memory = NgramMemory(n_vocab, path)
    memory.remember(list(range(40)), "c1")
    return path.read_bytes()


def _damage(kind: str, good: bytes) -> bytes:
    header = json.dumps({"texts": [["c1", 40]]}).encode()
    body = good[HEADER.size + len(header):]
    return {
        "random bytes": bytes(np.random.default_rng(1).integers(0, 256, 300, dtype=np.uint8)),
        "empty": b"",
        "truncated": good[:len(good) - 7],
        "another magic": b"NOTAMEM1" + good[8:],
        "another vocabulary": HEADER.pack(MAGIC, 999, len(header)) + header + body,
        "header length past the end": HEADER.pack(MAGIC, 1000, 10**9) + header + body,
        "header not JSON": HEADER.pack(MAGIC, 1000, len(header)) + b"{" * len(header) + body,
        "texts not a list": (lambda h: HEADER.pack(MAGIC, 1000, len(h)) + h + body)(b'{"texts": 5}'),
        "a count of the wrong type": (lambda h: HEADER.pack(MAGIC, 1000, len(h)) + h + body)(
            b'{"texts": [["c1", "40"]]}'),
        "counts too large": (lambda h: HEADER.pack(MAGIC, 1000, len(h)) + h + body)(b'{"texts": [["c1", 41]]}'),
        "a token outside the vocabulary": HEADER.pack(MAGIC, 1000, len(header)) + header + body[:-4]
        + struct.pack("<i", 5000),
        "a negative token": HEADER.pack(MAGIC, 1000, len(header)) + header + body[:-4] + struct.pack("<i", -3),
    }[kind]


@pytest.mark.parametrize("kind", ["random bytes", "empty", "truncated", "another magic", "another vocabulary",
                                  "header length past the end", "header not JSON", "texts not a list",
                                  "a count of the wrong type", "counts too large", "a token outside the vocabulary",
                                  "a negative token"])
def test_a_damaged_file_starts_it_empty(tmp_path, kind):
    path = tmp_path / "vocab.bin"
    path.write_bytes(_damage(kind, _valid_file(tmp_path / "good.bin")))
    paths.set_aside_notices.clear()
    memory = NgramMemory(1000, path)
    assert memory.n_tokens == 0 and memory.problem
    assert path.with_name("vocab.bin.bad").exists() and paths.set_aside_notices
    memory.remember(list(range(100, 140)), "c2")  # and it works from there
    assert NgramMemory(1000, path).origins() == {"c2"}


def test_a_damaged_file_does_not_stop_the_engine(smollm_path, data_dirs):
    from speculum.engine.llama.model import LlamaModel

    with LlamaModel(smollm_path, LoadOptions(n_ctx=512)) as model:
        path = NgramMemory.for_model(model).path
    path.parent.mkdir(parents=True)
    path.write_bytes(MAGIC + b"\xff" * 64)
    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=512))
    try:
        text, _ = generate(decoder, tokens_of(decoder, "Say hello."), max_tokens=8, policy="auto", origin="c1")
        assert text and decoder.memory.origins() == {"c1"}
        ngrammemory.forget("c1")  # every vocabulary's file, as a deleted conversation does
        assert NgramMemory.for_model(decoder.target).n_tokens == 0
    finally:
        decoder.target.close()


def test_the_setting_clears_it_and_turns_it_off(smollm_path, data_dirs):
    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=512))
    try:
        generate(decoder, tokens_of(decoder, "Say hello."), max_tokens=8, policy="off", origin="c1")
        assert decoder.memory.n_tokens
    finally:
        decoder.target.close()
    ngrammemory.clear()
    off = load_decoder(smollm_path, None, LoadOptions(n_ctx=512, ngram_memory=False))
    try:
        assert off.memory is None and Source.MEMORY not in off.drafters
        generate(off, tokens_of(off, "Say hello."), max_tokens=8, policy="auto", origin="c1")
        assert not list(ngrammemory.folder().glob("*.bin"))
    finally:
        off.target.close()
