"""A stopped request cuts llama.cpp's decode in flight short (its abort callback), and leaves
the caches as if the cut chunk had never been read."""

import multiprocessing
import sys
import threading
import time

import pytest

from speculum.engine.backend import DecodeAborted
from speculum.engine.decoder import PROMPT_CHUNK
from speculum.engine.llama.model import LlamaModel
from speculum.engine.loading import load_decoder
from speculum.engine.settings import LoadOptions


def long_prompt(decoder, lines=80):
    t = decoder.target
    document = " ".join(f"Line {i}: the lighthouse keeper logged wind, rain and {i % 7} ships." for i in range(lines))
    return t.tokenize(t.apply_chat_template([{"role": "user", "content": document + "\nSummarise."}]))


def greedy(decoder, prompt, n=24, **kw):
    return [t for c in decoder.generate(prompt, max_tokens=n, **kw) for t in c.emitted]


def stop_inside_a_decode(feeder: threading.Thread, stop: threading.Event, started: threading.Event) -> None:
    """Set ``stop`` once the feeding thread is inside a decode call, past the check between chunks."""
    started.wait()
    while feeder.is_alive():
        frame = sys._current_frames().get(feeder.ident)
        if frame is not None and frame.f_code is LlamaModel.decode.__code__:
            stop.set()
            return
        time.sleep(0.001)


def test_a_stop_aborts_the_prompt_chunk_in_flight_and_the_cache_stays_consistent(smollm_path):
    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=4096))
    prompt = long_prompt(decoder)
    assert len(prompt) > 6 * PROMPT_CHUNK
    stop, first_chunk = threading.Event(), threading.Event()
    reads = []

    def on_prompt(read, total):
        reads.append(read)
        if read > 0:
            first_chunk.set()

    result = {}

    def run():
        generation = decoder.generate(prompt, max_tokens=8, stop=stop, on_prompt=on_prompt)
        result["cycles"] = list(generation)
        result["stats"] = generation.stats

    feeder = threading.Thread(target=run)
    feeder.start()
    stopper = threading.Thread(target=stop_inside_a_decode, args=(feeder, stop, first_chunk))
    stopper.start()
    feeder.join(300)
    stopper.join(5)
    assert not feeder.is_alive()

    target = decoder.target
    read = len(decoder.sequence.tokens)
    # The decode in flight was aborted, not finished: only whole chunks read before the stop count.
    assert target.decodes_aborted == 1
    assert read == reads[-1] and read % PROMPT_CHUNK == 0 and 0 < read < len(prompt) - 1
    assert target.n_past == read and result["stats"].prompt_tokens == read
    assert decoder.sequence.tokens == prompt[:read]
    assert [c.finish for c in result["cycles"]] == ["stopped"] and not result["cycles"][0].emitted

    # The next request resumes from what was read, and answers as a fresh model does.
    again = greedy(decoder, prompt)
    assert result["stats"].prompt_tokens == read  # (its own stats were not touched)
    assert decoder.latest.stats.prompt_cached == read
    fresh = load_decoder(smollm_path, None, LoadOptions(n_ctx=4096))
    assert again == greedy(fresh, prompt)
    fresh.target.close()
    decoder.target.close()


@pytest.mark.parametrize("events", [threading, multiprocessing.get_context("spawn")], ids=["thread", "process"])
def test_an_abort_needs_a_stop_that_is_set_and_ends_with_its_region(smollm, events):
    """The window's Stop is a multiprocessing Event set in another process; the server's a threading one."""
    smollm.reset()
    chunk = list(range(100, 100 + 64))
    stopped, never = events.Event(), events.Event()
    stopped.set()
    with smollm.abortable(stopped), pytest.raises(DecodeAborted):
        smollm.decode(chunk, rows=())
    assert smollm.n_past == 0
    # The flag went with its region: a stopped event outside one, or an unset one inside, cuts nothing.
    smollm.decode(chunk, rows=())
    with smollm.abortable(never):
        smollm.decode(chunk, rows=())
    assert smollm.n_past == 2 * len(chunk)
    smollm.reset()


def test_a_stop_aborts_plain_decodings_last_chunk_too(smollm_path):
    """Plain decoding reads the prompt's last chunk asking for its last row (the first token's):
    that decode is cut short as well."""
    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=4096))
    prompt = long_prompt(decoder, lines=4)
    assert 8 < len(prompt) < PROMPT_CHUNK  # one chunk, the one whose last row gives the first token
    stop, reading = threading.Event(), threading.Event()
    result = {}

    def run():
        generation = decoder.generate(prompt, max_tokens=8, policy="off", stop=stop,
                                      on_prompt=lambda read, total: reading.set())
        result["cycles"] = list(generation)

    feeder = threading.Thread(target=run)
    feeder.start()
    stop_inside_a_decode(feeder, stop, reading)
    feeder.join(300)
    assert not feeder.is_alive()
    assert decoder.target.decodes_aborted == 1 and decoder.target.n_past == 0 and decoder.sequence.tokens == []
    assert [c.finish for c in result["cycles"]] == ["stopped"] and not result["cycles"][0].emitted
    assert greedy(decoder, prompt, policy="off") == greedy(load_decoder(smollm_path, None, LoadOptions(n_ctx=4096)),
                                                          prompt, policy="off")
    decoder.target.close()
