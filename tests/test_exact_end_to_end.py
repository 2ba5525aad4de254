"""Bit for bit, end to end (issue 46, point 2): with --exact every mode's greedy answer is plain
decoding's, token for token, through the API (`speculum serve --exact`, the openai client), from a
cold start and from a prompt-cache hit with the n-gram memory's copy, with a JSON schema's grammar
and with Predicted Outputs; through an RPC worker that computes exactly too (a worker that does not
is refused); after a Continue and in a summary's parts (the window's engine process).

Each model runs in a process of its own started with the switch (ggml reads it once, when
llama.cpp loads; this test process may have loaded it without)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import openai
import pytest

from rpc_workers import ENV, Worker
from test_server_rpc import Server

from speculum.engine.llama import cpu_settings
from speculum.engine.settings import LoadOptions
from speculum.engine_process import EngineProcess
from speculum.protocol import Failed, Finished, Generate, GenerationRequest, Load, LoadFailed, LoadRequest

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "List five facts about the Moon, one per line.",
    "Explain in two sentences what a hash table is.",
]
MAX_TOKENS = 40
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}
COPY = "Repeat exactly, word for word: The keeper lit the lamp at dusk and watched the ships pass the old stone pier."
PREDICTED = "The keeper lit the lamp at dawn and watched the ships pass the old stone pier."  # one word off


def ask(client: openai.OpenAI, prompt: str, **extra) -> tuple[str, dict, dict]:
    """The answer's text, the speculum numbers and OpenAI's usage of one greedy chat completion."""
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}],
                                            max_tokens=MAX_TOKENS, temperature=0, **extra)
    return answer.choices[0].message.content, answer.model_extra["speculum"], answer.usage.model_dump()


def answers(model, draft, mode: str, *extra: str) -> dict:
    """Every request of the suite, answered by `speculum serve --exact --mode MODE` from a fresh
    data folder: each prompt cold, the first again (its prompt cached, its answer in the n-gram
    memory), one held to a JSON schema and one with a prediction."""
    server = Server(model, [], "--exact", "--draft", str(draft), *extra, mode=mode)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
        got = {f"cold {i}": ask(client, p) for i, p in enumerate(PROMPTS)}
        got["again 0"] = ask(client, PROMPTS[0])
        got["schema"] = ask(client, "Give a city and its population as JSON.", response_format={
            "type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}})
        got["predicted"] = ask(client, COPY, prediction={"type": "content", "content": PREDICTED})
        return got
    finally:
        server.stop()


@pytest.fixture(scope="module")
def plain(smollm_path):
    return answers(smollm_path, smollm_path, "off")


@pytest.mark.parametrize("mode", ["auto", "draft", "lookup"])
def test_every_mode_answers_the_api_as_plain_decoding_does(smollm_path, plain, mode):
    got = answers(smollm_path, smollm_path, mode)
    assert {k: text for k, (text, _, _) in got.items()} == {k: text for k, (text, _, _) in plain.items()}
    assert sum(numbers["accepted"] for _, numbers, _ in got.values()) > 0, "nothing was drafted and kept"
    text, numbers, use = got["again 0"]
    assert use["prompt_tokens_details"]["cached_tokens"] > 0  # the repeated prompt came from the cache
    if mode == "auto":  # the repeated answer was copied from the n-gram memory
        assert numbers["drafted_by_drafter"].get("memory", {}).get("accepted", 0) > 0, numbers
    _, numbers, use = got["predicted"]
    kept = use["completion_tokens_details"]["accepted_prediction_tokens"]
    if mode == "auto":  # auto may copy the same words from the prompt instead (its policy's draws decide)
        kept += numbers["drafted_by_drafter"].get("lookup", {}).get("accepted", 0)
    assert kept > 0, numbers  # it drafted
    json.loads(got["schema"][0])  # the grammar held


def test_through_an_exact_rpc_worker_the_answer_is_the_local_plain_one(smollm_path, plain):
    """The worker computes the target's layers with the switch on too (--exact): its rows are then
    the local ones, whatever pass they are in."""
    worker = Worker(extra=("--exact",))
    try:
        assert worker.count("exact rows (--exact)") == 1
        server = Server(smollm_path, [worker], "--exact", mode="lookup")
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
            for i, prompt in enumerate(PROMPTS):
                assert ask(client, prompt)[0] == plain[f"cold {i}"][0], prompt
            assert ask(client, PROMPTS[0])[0] == plain["again 0"][0]
        finally:
            server.stop()
    finally:
        worker.stop()


def test_an_exact_client_refuses_a_worker_that_computes_otherwise(smollm_path):
    worker = Worker(extra=("--no-exact",))
    try:
        assert worker.count("rows as llama.cpp computes them (no --exact)") == 1
        done = subprocess.run([sys.executable, "-m", "speculum.cli", "generate", "--target", str(smollm_path),
                               "--rpc", worker.endpoint, "--exact", "--max-tokens", "4", "Hi."],
                              capture_output=True, text=True, timeout=300, env=ENV)
        assert done.returncode != 0
        assert "does not compute exactly" in done.stderr and "speculum rpc-worker --exact" in done.stderr
    finally:
        worker.stop()


# Rows of the target here and on a worker: the prompt read, then a pass of greedy tokens after it.
ROWS_HERE_AND_THERE = """
import json, sys
import numpy as np
from speculum.engine.llama.model import LlamaModel
from speculum.engine.settings import LoadOptions
path, worker, text = sys.argv[1:4]
rows, follow = [], []
for rpc in ((), (worker,)):
    model = LlamaModel(path, LoadOptions(n_ctx=256, n_threads=1, rpc=rpc, extra_buffer_types=False))
    prompt = model.tokenize(model.apply_chat_template([{"role": "user", "content": text}]))
    first = np.array(model.prefill(prompt), copy=True)
    while len(follow) < 12:
        follow.append(int(np.argmax(first if not follow else model.decode(follow[-1:], rows=[0])[-1])))
    model.trim(len(prompt))
    rows.append(np.vstack([first, model.decode(follow[:-1], rows=range(len(follow) - 1))]))
    answer = model.detokenize(follow)
    model.close()
print(json.dumps({"text": answer, "identical": bool(np.array_equal(*rows)),
                  "apart": float(np.abs(rows[0] - rows[1]).max())}))
"""


def test_the_issue_s_prime_function_is_the_same_through_a_worker(qwen_target_path):
    """The issue's example: `generate --mode off` on the demo target wrote is_prime(number) here and
    is_prime(num) through a loopback worker. With --exact on both sides and plain weights here, as
    a worker holds them, the rows are bit for bit the same, so every mode's tokens are. (A Q4_K
    target keeps its repacked weights locally under the switch, and their rows round as gemm's do,
    unlike plain weights' vec_dot: 0.69 of a logit apart here; the safe profile loads plain ones.)"""
    worker = Worker(extra=("--exact",))
    try:
        done = subprocess.run([sys.executable, "-c", ROWS_HERE_AND_THERE, str(qwen_target_path), worker.endpoint,
                               PROMPTS[0]], capture_output=True, text=True, timeout=900,
                              env={**ENV, cpu_settings.ROW_INVARIANT: "1"})
    finally:
        worker.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "def is_prime(" in found["text"]
    assert found["identical"], found


class EngineSession:
    """The window's engine process, started with the switch, the pair (SmolLM2 twice) loaded."""

    def __init__(self, monkeypatch, model, n_ctx: int = 1024):
        monkeypatch.setenv(cpu_settings.ROW_INVARIANT, "1")  # the child inherits it
        self.results, self.done = [], threading.Event()
        self.engine = EngineProcess(self._on_event, lambda code: self.done.set())
        self.engine.send(Load(LoadRequest(str(model), str(model), options=LoadOptions(n_ctx=n_ctx))))

    def _on_event(self, event) -> None:
        if isinstance(event, (Finished, Failed, LoadFailed)):
            self.results.append(event)
            self.done.set()

    def answer(self, request: GenerationRequest):
        self.done.clear()
        self.engine.send(Generate(request))
        assert self.done.wait(600), "no answer"
        assert isinstance(self.results[-1], Finished), self.results[-1]
        return self.results[-1].result

    def end(self) -> None:
        self.engine.end()


def tokens_of(result) -> list[int]:
    return [t for cycle in result.cycles for t in cycle.emitted]


def test_an_answer_continued_is_the_plain_answer(smollm_path, data_dirs, monkeypatch):
    messages = [{"role": "user", "content": PROMPTS[1]}]
    session = EngineSession(monkeypatch, smollm_path)
    try:
        whole = tokens_of(session.answer(GenerationRequest("c", messages, mode="off", max_tokens=48)))
        first = tokens_of(session.answer(GenerationRequest("c", messages, mode="auto", max_tokens=20)))
        rest = tokens_of(session.answer(GenerationRequest("c", messages, mode="lookup", max_tokens=28,
                                                          continues=first)))
    finally:
        session.end()
    assert len(whole) == 48 and first + rest == whole


def test_a_summary_in_parts_is_the_plain_one_part_for_part(smollm_path, data_dirs, monkeypatch):
    document = " ".join(f"Paragraph {i}: the lighthouse keeper logged ship {i} passing at dawn, wind from the "
                        f"{['north', 'south', 'east', 'west'][i % 4]}, sea calm, lamp trimmed." for i in range(60))
    session = EngineSession(monkeypatch, smollm_path, n_ctx=512)
    try:
        plain_answer, auto_answer = (session.answer(GenerationRequest(
            "d", [{"role": "user", "content": "Summarise it."}], mode=mode, max_tokens=32, document=document))
            for mode in ("off", "auto"))
    finally:
        session.end()
    assert len(plain_answer.part_summaries) >= 2
    assert auto_answer.part_summaries == plain_answer.part_summaries
    assert auto_answer.text == plain_answer.text
    assert sum(c.n_accepted for c in auto_answer.cycles) > 0


def test_bench_every_greedy_row_is_plain_decoding_cold_and_regenerated(smollm_path, tmp_path):
    """`speculum bench --exact --remember`, twice from one data folder: the second run finds every
    plain answer in the n-gram memory (auto mode copies it), and every row, both times, is plain
    decoding's answer (the second plain run of each prompt reads it from the prompt cache)."""
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"name": f"p{i}", "user": p, "max_tokens": 32}) + "\n"
                             for i, p in enumerate(PROMPTS[:2])))

    def bench() -> list[dict]:
        done = subprocess.run([sys.executable, "-m", "speculum.cli", "bench", "--target", str(smollm_path),
                               "--draft", str(smollm_path), "--threads", "1", "--prompts", str(suite), "--modes",
                               "off,auto,draft,lookup", "--exact", "--remember", "--json"],
                              capture_output=True, text=True, timeout=900,
                              env={**ENV, "SPECULUM_DATA_DIR": str(tmp_path / "data")})
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)["results"]

    for run in (bench(), bench()):
        assert len(run) == 8 and all(r["same_as_off"] is True for r in run), run
    assert all("memory" not in r["choices"] for r in run if r["mode"] == "off")
    assert all(r["choices"].get("memory", 0) > 0 for r in run if r["mode"] == "auto"), run
