"""`speculum serve`: the official openai client and raw HTTP against a real server on 127.0.0.1,
over the real SmolLM2 model."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest

from speculum import cli
from speculum.engine.policy.auto import MAX_K
from speculum.engine.loading import load_decoder
from speculum.engine.settings import LoadOptions
from speculum.protocol import Asker, CycleEvent, Decoded, Failed, Finished, Started
from speculum.server.service import ServedModel, StopSequences
from live_server import MESSAGES, MODEL, LiveServer

KEY = "test-key-123"


def test_chat_with_the_openai_client_streaming_and_not(server):
    client = server().client()
    assert [m.id for m in client.models.list().data] == [MODEL]
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    text = reply.choices[0].message.content
    assert text.strip() and reply.choices[0].finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage.completion_tokens <= 24 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    numbers = reply.model_extra["speculum"]
    assert sum(numbers["passes_by_drafter"].values()) == numbers["passes"]
    assert numbers["tokens_per_pass"] == pytest.approx(usage.completion_tokens / numbers["passes"], abs=1e-3)

    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    pieces, finish, stream_usage = [], None, None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            stream_usage = chunk.usage
    assert "".join(pieces) == text  # greedy: the same answer either way
    assert finish == reply.choices[0].finish_reason
    assert stream_usage.completion_tokens == usage.completion_tokens


def test_text_completions_streaming_and_not(server):
    client = server().client()
    reply = client.completions.create(model=MODEL, prompt="One, two, three, four,", max_tokens=8, temperature=0)
    assert reply.choices[0].text and reply.usage.completion_tokens <= 8
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="One, two, three, four,", max_tokens=8, temperature=0, stream=True) if c.choices)
    assert streamed == reply.choices[0].text


def test_greedy_output_through_the_server_equals_generate(server, smollm_path, capsys):
    client = server(mode="lookup").client()
    prompt = MESSAGES[0]["content"]
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=32, temperature=0)
    assert cli.main(["generate", "--target", str(smollm_path), "--ctx", "1024", "--mode", "off",
                     "--flash-attn", "on", "--max-tokens", "32", "--json", prompt]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert reply.choices[0].message.content == summary["text"]
    # With a prediction (half right: its second half is another text) the answer is the same.
    half = summary["text"][: len(summary["text"]) // 2] + " and then something else entirely."
    predicted = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=32, temperature=0,
                                               prediction={"type": "content", "content": half})
    assert predicted.choices[0].message.content == summary["text"]
    assert predicted.usage.completion_tokens_details.accepted_prediction_tokens > 0


def test_stop_sequences_cut_the_answer_and_finish_with_stop(server):
    client = server().client()
    full = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    text = full.choices[0].message.content
    word = text.split()[2]
    cut = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0, stop=[word])
    assert cut.choices[0].message.content == text[:text.index(word)]
    assert cut.choices[0].finish_reason == "stop"


def test_stop_sequences_hold_back_a_possible_start():
    stops = StopSequences(["END"])
    assert stops.feed("abc E") == "abc "
    assert stops.feed("N") == ""
    assert stops.feed("X") == "ENX"
    assert stops.feed("..EN") == ".."
    assert stops.feed("D more") == "" and stops.stopped


def _post(server, path, body, key=None):
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=data, headers=headers, timeout=120)


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    ({"model": "gpt-4o", "messages": MESSAGES}, "model"),
    ({"model": MODEL}, "messages"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"model": MODEL, "messages": MESSAGES, "temperature": 7}, "temperature"),
    ({"model": MODEL, "messages": MESSAGES, "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "messages": MESSAGES, "top_p": -1}, "top_p"),
    ({"model": MODEL, "messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "messages": MESSAGES, "max_tokens": 10**9}, "max_tokens"),
    ({"model": MODEL, "messages": MESSAGES, "n": 3}, "n"),
    ({"model": MODEL, "messages": MESSAGES, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": MODEL, "messages": MESSAGES, "seed": 1.5}, "seed"),
    ({"model": MODEL, "messages": MESSAGES, "prediction": {"type": "other"}}, "prediction"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "word " * 2000}]}, "messages"),
])
def test_bad_requests_get_400_in_openais_error_shape(server, body, param):
    s = server()
    response = _post(s, "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    err = response.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["param"] == param
    # Nothing crashed: the server still answers.
    assert httpx.get(s.url + "/v1/models", timeout=30).status_code == 200


def test_a_prompt_longer_than_the_context_says_so(server):
    response = _post(server(), "/v1/completions", {"model": MODEL, "prompt": "word " * 2000})
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"


def test_api_key_is_required_and_compared(server):
    s = server(api_key=KEY)
    assert httpx.get(s.url + "/v1/models", timeout=30).status_code == 401
    assert httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer wrong"}, timeout=30).status_code == 401
    assert httpx.get(s.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        s.client("wrong").models.list()
    assert s.client(KEY).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4).choices


def test_serving_beyond_this_machine_needs_an_api_key(smollm_path, capsys):
    assert cli.main(["serve", "--target", str(smollm_path), "--host", "0.0.0.0"]) == 2
    assert "--api-key" in capsys.readouterr().err


def test_serve_answers_at_once_and_measures_auto_modes_costs_in_idle_moments_once_per_machine(smollm_path,
                                                                                              tmp_path):
    from test_server_rpc import Server

    def serve(until: str | None) -> str:
        """One server's life on the same data folder: ready, a request answered, ``until`` said, stopped; its log."""
        s = Server(smollm_path, [], mode="auto", data_dir=str(tmp_path / "data"))
        try:
            answer = s.chat(max_tokens=4)
            assert answer.status_code == 200, answer.text
            deadline = time.monotonic() + 120
            while until is not None and until not in s.output():
                assert s.process.poll() is None and time.monotonic() < deadline, s.output()
                time.sleep(0.2)
        finally:
            s.stop()
        return s.output()

    first = serve("measured in")
    # Ready (and answering) before it measures: measuring waits for a moment without requests.
    assert first.index("Serving ") < first.index("measuring this machine's costs for auto mode")
    assert first.index("measuring this machine's costs") < first.index("measured in")
    second = serve(None)  # the same data folder: measured already
    assert "Serving " in second and "measuring" not in second


def test_a_request_while_the_server_measures_stops_the_measuring_within_a_pass(smollm_path, data_dirs):
    from speculum.engine.vocabulary import Mode
    from speculum.server.idle import IdleMeasuring

    decoder = load_decoder(smollm_path, None, LoadOptions(n_ctx=1024, ngram_memory=False))
    assert decoder.policy_for(Mode.AUTO).needs_calibration  # a fresh data folder: never measured here
    served = ServedModel(decoder, MODEL, mode="auto")
    held, go_on = threading.Event(), threading.Event()

    def stopping() -> bool:  # asked before each measuring pass: the first one, inside a run, waits for the test
        if measuring.measuring and not go_on.is_set():
            held.set()
            go_on.wait(60)
        return False

    said: list[str] = []
    measuring = IdleMeasuring(served, Mode.AUTO, stopping, say=said.append, quiet_s=0)
    s = LiveServer(served)
    try:
        measuring.start()
        assert held.wait(60)  # a measuring run holds the model now
        replies = []
        asking = threading.Thread(target=lambda: replies.append(_post(s, "/v1/chat/completions", {
            "model": MODEL, "messages": MESSAGES, "max_tokens": 4})))
        asking.start()
        deadline = time.monotonic() + 30
        while not served.asked:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        go_on.set()  # the next pass sees the request waiting: the run gives way
        asking.join(120)
        assert replies and replies[0].status_code == 200, replies
        assert measuring.interruptions >= 1
        assert measuring.done.wait(120)  # taken up again once the server is quiet, to the end
        assert said[-1].startswith("measured in") and not decoder.policy_for(Mode.AUTO).needs_calibration
    finally:
        go_on.set()
        s.stop()
        decoder.target.close()


class ModelTurn:
    """The models' turn lock (``ServedModel.turn``), telling when a request's engine thread asks for it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.asked = threading.Event()

    def __enter__(self):
        self.asked.set()
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


def test_requests_queue_in_order_and_a_full_queue_answers_429(server):
    s = server(mode="off", max_waiting=1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 8}
    results, order = {}, []
    s.served.on_event = lambda event: order.append(type(event).__name__)

    def call(name):
        results[name] = _post(s, "/v1/chat/completions", dict(body, messages=[
            {"role": "user", "content": f"Write a long story ({name})."}]))

    model = s.served.turn = ModelTurn()
    model.lock.acquire()  # the model is busy (the window's own answer, say): the first request waits on it
    try:
        first = threading.Thread(target=call, args=("first",))
        first.start()
        assert model.asked.wait(60)  # the first holds the queue's turn: it asks for the model's
        deadline = time.monotonic() + 60
        second = threading.Thread(target=call, args=("second",))
        second.start()
        while s.served.waiting < 1:  # the second waits behind it (as /health's "waiting" says)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        call("third")  # the queue is full
    finally:
        model.lock.release()
    first.join(300)
    second.join(300)
    assert results["first"].status_code == 200 and results["second"].status_code == 200
    # One at a time: each request has left llama.cpp before the next one starts. (A whole answer is
    # out before the engine has kept it in the n-gram memory and says it is done.)
    while order.count("Decoded") < 2 and time.monotonic() < deadline + 300:
        time.sleep(0.01)
    assert [kind for kind in order if kind not in ("CycleEvent", "Finished")] == ["Started", "Decoded"] * 2
    assert order.count("Finished") == 2
    busy = results["third"]
    assert busy.status_code == 429 and int(busy.headers["Retry-After"]) >= 1
    assert busy.json()["error"]["type"] == "rate_limit_error"


def test_an_api_request_tells_its_life_with_the_windows_own_event_types(server):
    s = server(mode="off")
    events = []
    s.served.on_event = events.append
    reply = s.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0)
    # The answer is out (Finished) as its last cycle comes; the engine lets go of llama.cpp
    # (Decoded) once it has kept the answer (n-gram memory, prompt cache): either may come first.
    deadline = time.monotonic() + 60
    while Decoded not in [type(e) for e in events] and time.monotonic() < deadline:
        time.sleep(0.01)
    kinds = [type(e) for e in events]
    assert kinds[0] is Started and sorted(k.__name__ for k in kinds[-2:]) == ["Decoded", "Finished"]
    assert CycleEvent in kinds and kinds.count(Finished) == kinds.count(Decoded) == 1
    assert all(e.asker == Asker.API for e in events)  # tagged with who asked
    cycles = [e for e in events if isinstance(e, CycleEvent)]
    assert all(e.stage == "API request" for e in cycles)
    finished = next(e for e in events if isinstance(e, Finished))
    assert cycles[-1].snapshot.prompt_total == events[0].prompt_tokens == reply.usage.prompt_tokens
    assert cycles[-1].snapshot.tokens == finished.usage["completion_tokens"] == reply.usage.completion_tokens
    # A request that fails in the decoder says so, after letting go of the models.
    events.clear()
    s.served.mode = "mtp"  # SmolLM2 has no MTP head
    assert _post(s, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}).status_code >= 400
    assert [type(e) for e in events] == [Started, Decoded, Failed] and "MTP" in events[-1].message
    assert events[-1].asker == Asker.API


def test_a_client_that_disconnects_stops_its_generation_within_a_pass(server):
    s = server(mode="off")
    seen = []
    s.served.on_event = lambda event: seen.append(event.cycle) if isinstance(event, CycleEvent) else None
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 600, "stream": True}
    with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=120) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i >= 6:
                break  # leave mid-answer: the connection closes here
    deadline = time.monotonic() + 60
    while not (seen and seen[-1].finish):
        assert time.monotonic() < deadline, "the generation did not stop after the client left"
        time.sleep(0.05)
    assert seen[-1].finish == "stopped" and len(seen) < 300
    # The model is free again at once.
    reply = s.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert reply.choices[0].message.content


def test_a_follow_up_request_reuses_the_conversation_in_the_kv_cache(server, decoder):
    client = server().client()
    first = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0)
    follow = MESSAGES + [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": "Now say it backwards."}]
    second = client.chat.completions.create(model=MODEL, messages=follow, max_tokens=4, temperature=0)
    # Only what was new was decoded: the earlier turns came from the cache.
    assert decoder.stats.prompt_tokens < second.usage.prompt_tokens / 2


CODE = "def average(values):\n    total = 0\n    for value in values:\n    total += value\n    return total / len(values)\n"
ASK = [{"role": "user", "content": "Write a Python function that returns the average of a list of numbers."}]


def prediction_usage(usage) -> tuple[int, int]:
    details = usage.completion_tokens_details
    return details.accepted_prediction_tokens, details.rejected_prediction_tokens


@pytest.mark.parametrize("mode", ["auto", "lookup"])
def test_a_prediction_drafts_the_answer_and_never_changes_it(server, mode):
    client = server(mode=mode).client()
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=80, temperature=0)
    assert prediction_usage(plain.usage) == (0, 0)  # no prediction: none accepted, none rejected
    answer = plain.choices[0].message.content
    # The client expects the answer with its middle line missing (as an editor's older copy would).
    lines = answer.splitlines(keepends=True)
    expected = "".join(lines[: len(lines) // 2] + lines[len(lines) // 2 + 1:])
    predicted = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=80, temperature=0,
                                               prediction={"type": "content", "content": expected})
    assert predicted.choices[0].message.content == answer
    accepted, rejected = prediction_usage(predicted.usage)
    # Much of the answer was copied from it (how much the policy drafts at once follows this
    # machine's measured verify curve), and the one line it lacks failed at most two drafts, where
    # the answer left it and where it came back (refused tokens count by the draft: 12-14 of 60
    # on a busy machine, where the policy drafts long).
    assert accepted > 0.3 * predicted.usage.completion_tokens and rejected <= 2 * MAX_K
    # The usage is what the cycles say: prediction drafts the target verified, kept or refused.
    by_drafter = predicted.model_extra["speculum"]["drafted_by_drafter"]["prediction"]
    assert (accepted, rejected) == (by_drafter["accepted"], by_drafter["drafted"] - by_drafter["accepted"])
    assert predicted.model_extra["speculum"]["passes"] < 0.8 * plain.model_extra["speculum"]["passes"]


def test_a_prediction_as_text_parts_streams_with_its_usage(server):
    client = server(mode="auto").client()
    answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=60,
                                            temperature=0).choices[0].message.content
    whole = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=60, temperature=0,
                                           prediction={"type": "content", "content": answer})
    parts = [{"type": "text", "text": answer[:40]}, {"type": "text", "text": answer[40:]}]
    stream = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=60, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            prediction={"type": "content", "content": parts})
    pieces, usage = [], None
    for chunk in stream:
        pieces += [c.delta.content or "" for c in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(pieces) == whole.choices[0].message.content == answer
    # The policy's timing-led choices may differ between the two requests; both copy most of it.
    assert prediction_usage(usage)[0] > 15 and prediction_usage(whole.usage)[0] > 15


def test_an_unrelated_prediction_changes_nothing_but_its_counts(server):
    client = server(mode="auto").client()
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=32, temperature=0)
    other = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=32, temperature=0,
                                           prediction={"type": "content", "content": CODE * 3})
    assert other.choices[0].message.content == plain.choices[0].message.content
    accepted, rejected = prediction_usage(other.usage)
    assert accepted <= 2  # a word or bracket in common at most


def test_a_streaming_client_gone_before_its_first_token_stops_the_prompt_within_a_chunk(server, decoder):
    s = server(mode="off")
    reads, read_in_request, first_chunk = [], [], threading.Event()

    def on_prompt(read, total):  # on the engine thread, after each chunk of the prompt
        reads.append((read, total))
        if len(reads) == 2:  # the first chunk is in: the client leaves now
            first_chunk.set()
            deadline = time.monotonic() + 60
            while not s.served.stopping:  # until the server has seen it go
                assert time.monotonic() < deadline
                time.sleep(0.01)

    s.served.on_prompt = on_prompt
    s.served.on_event = lambda event: (read_in_request.append(decoder.stats.prompt_tokens)
                                       if isinstance(event, Decoded) else None)
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "Summarise: " + "many words here " * 220}]})
    with socket.create_connection(("127.0.0.1", s.port), timeout=60) as sock:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        assert first_chunk.wait(120)
    deadline = time.monotonic() + 60
    while not read_in_request:
        assert time.monotonic() < deadline, "the prompt's reading did not stop"
        time.sleep(0.02)
    first, total = reads[0][0], reads[0][1]
    assert total - first > 3 * (reads[1][0] - first)  # the prompt was several chunks long...
    assert read_in_request == [reads[1][0] - first]  # ...and one was read: the one under way when the client left
    # The model is free at once for the next client.
    stream = s.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
