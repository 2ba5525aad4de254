"""A seed holds across the three APIs: `seed`, `temperature`, `top_p` and `top_k` reach the sampler
the same way through chat completions, Anthropic Messages and the Responses API (each is read
by ``params.sampling_params``), so with speculation off the same seed writes the same text
through each, on the real SmolLM2 model; another seed writes another. With speculation on (auto),
drafter-invariant sampling writes that same text again, whatever auto mode drafted."""

from __future__ import annotations

import httpx

from live_server import MODEL

ASK = "Write a short poem about the sea."
SAMPLING = {"temperature": 0.9, "top_p": 0.95, "top_k": 40}


def _chat(url: str, seed: int, ask: str = ASK) -> str:
    reply = httpx.post(url + "/v1/chat/completions", timeout=300, json={
        "model": MODEL, "messages": [{"role": "user", "content": ask}], "max_tokens": 24, "seed": seed, **SAMPLING})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


def _messages(url: str, seed: int, ask: str = ASK) -> str:
    reply = httpx.post(url + "/v1/messages", timeout=300, json={
        "model": MODEL, "messages": [{"role": "user", "content": ask}], "max_tokens": 24, "seed": seed, **SAMPLING})
    assert reply.status_code == 200, reply.text
    return "".join(block["text"] for block in reply.json()["content"] if block["type"] == "text")


def _responses(url: str, seed: int, ask: str = ASK) -> str:
    reply = httpx.post(url + "/v1/responses", timeout=300, json={
        "model": MODEL, "input": ask, "max_output_tokens": 24, "seed": seed, **SAMPLING})
    assert reply.status_code == 200, reply.text
    return "".join(part["text"] for item in reply.json()["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


def test_one_seed_one_text_through_every_api(server):
    url = server(mode="off").url
    texts = {api.__name__: api(url, 7) for api in (_chat, _messages, _responses)}
    assert len(set(texts.values())) == 1 and texts["_chat"], texts
    assert _chat(url, 8) != texts["_chat"]  # the seed is what holds it


COPY = "Copy this line exactly, twice: the lighthouse keeper counts the ships at dawn and again at dusk."


def test_auto_and_lookup_modes_write_off_s_text_for_a_seed_through_every_api(server):
    """What auto mode drafts follows its timings, and lookup drafts whatever repeats: the text
    follows neither."""
    urls = {mode: server(mode=mode).url for mode in ("off", "auto", "lookup")}
    for ask in (ASK, COPY):
        texts = {(mode, api.__name__): api(url, 7, ask) for mode, url in urls.items()
                 for api in (_chat, _messages, _responses)}
        texts["auto again", "_chat"] = _chat(urls["auto"], 7, ask)
        assert len(set(texts.values())) == 1 and texts["off", "_chat"], texts
    drafted = accepted = 0
    for ask in (ASK, COPY):  # (a copy may keep all its drafts, as the timings choose their lengths: both summed)
        numbers = httpx.post(urls["lookup"] + "/v1/chat/completions", timeout=300, json={
            "model": MODEL, "messages": [{"role": "user", "content": ask}], "max_tokens": 24, "seed": 7,
            **SAMPLING}).json()["speculum"]
        drafted, accepted = drafted + numbers["drafted"], accepted + numbers["accepted"]
    assert drafted > accepted > 0, (drafted, accepted)  # drafts were made, some kept and some not
