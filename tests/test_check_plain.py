"""An answer checked against plain decoding (engine/plaincheck.py): in the engine on a real model,
and through `speculum generate --check-plain` as a user runs it.

The forced difference is a real one: SmolLM2 drafting for itself at k = 8 sends nearly every row
through a 9-row verify pass; with the row-invariance switch off, those rows differ from single
steps (up to 0.66 of a logit, docs/notes/issue46-exact.md), and this prompt's answer meets a near
tie where the pass's row takes the other token (on this project's Zen 4 CPU: token 44, 0.007
apart). Which prompt meets such a tie depends on the CPU's kernels (on an AVX-512 Zen 4 the first
answer below is plain decoding's even so, the second parts at token 12), so the forced difference
is looked for over a few prompts: one of them must part. With the switch on, every answer is
plain decoding's."""

import json

import numpy as np
import pytest

from test_cli import speculum

PROMPT = "Write a Python function that reverses a string."
# Prompts whose answers meet a near tie on one CPU or another, the first one above
TIED_PROMPTS = (PROMPT, "Write a Python function that checks whether a number is prime.",
                "Write a Python class for a bank account.")
SELF_DRAFT = ("--mode", "draft", "--fixed-k", "-k", "8", "--ctx", "1024", "--max-tokens", "64")


@pytest.fixture
def plain_answer(smollm):
    """A decoder over SmolLM2, the prompt's tokens and the plain answer's."""
    from speculum.engine.chat import chat_tokens
    from speculum.engine.decoder import Decoder
    from speculum.engine.vocabulary import Mode

    decoder = Decoder(smollm)
    prompt = chat_tokens(smollm, [{"role": "user", "content": PROMPT}])
    answer = [t for cycle in decoder.generate(prompt, max_tokens=24, policy=Mode.OFF) for t in cycle.emitted]
    yield decoder, prompt, answer
    smollm.reset()


def test_plain_decoding_checks_as_identical_and_an_altered_token_is_found_with_its_row(plain_answer):
    from speculum.engine.plaincheck import Outcome, check_plain

    decoder, prompt, answer = plain_answer
    seen = []
    same = check_plain(decoder, prompt, answer, lambda checked, total: seen.append((checked, total)))
    assert (same.outcome, same.tokens, same.checked, same.index) == (Outcome.IDENTICAL, 24, 24, None)
    assert seen[0] == (0, 24) and seen[-1] == (24, 24)
    assert same.words().startswith("Identical to plain decoding (24 tokens).")

    # The same answer with its 10th token swapped for the row's second choice: found there, with both
    # tokens' logits from that row (plain decoding's is the larger: it is the row's argmax).
    altered = list(answer)
    second = _second_choice(decoder, prompt, answer, 10)
    altered[10] = second
    parted = check_plain(decoder, prompt, altered)
    assert (parted.outcome, parted.index, parted.checked) == (Outcome.DIFFERS, 10, 10)
    assert (parted.answer.token, parted.plain.token) == (second, answer[10])
    assert parted.answer.logit < parted.plain.logit
    assert parted.plain.text == decoder.target.token_text(answer[10])
    words = parted.words()
    before = decoder.target.detokenize(answer[:10])
    assert parted.before == before[-40:] and before.strip()
    assert words.startswith(f"Differs from plain decoding at token 10 of 24, after {'…' * (len(before) >= 40)}"
                            f"{parted.before!r}: {parted.answer.text!r} (id {second}, ")
    assert f"vs plain {parted.plain.text!r} (id {answer[10]}, logit {parted.plain.logit:.4f})" in words


def _second_choice(decoder, prompt, answer, index) -> int:
    """The token a plain row at ``index`` ranks second (read here on a fresh sequence)."""
    decoder.sequence.sync([])
    logits = decoder.sequence.feed(prompt + answer[:index], last_row=True)
    return int(np.argsort(logits[0])[-2])


def test_a_check_is_cancelled_between_tokens_and_foreign_tokens_are_refused(plain_answer):
    from speculum.engine.plaincheck import Outcome, check_plain
    from speculum.errors import SpeculumError

    decoder, prompt, answer = plain_answer
    progress = []
    stopped = check_plain(decoder, prompt, answer, lambda checked, total: progress.append(checked),
                          cancelled=lambda: len(progress) > 5)
    assert (stopped.outcome, stopped.checked) == (Outcome.CANCELLED, 5)
    assert "Check cancelled: the first 5 of 24 tokens are plain decoding's." in stopped.words()
    with pytest.raises(SpeculumError, match="not this model's"):
        check_plain(decoder, prompt, answer[:3] + [decoder.target.n_vocab + 7])
    with pytest.raises(SpeculumError, match="nothing to check"):
        check_plain(decoder, prompt, [])
    # After the check the decoder writes on as before: the cache holds what the check left.
    again = [t for c in decoder.generate(prompt, max_tokens=24) for t in c.emitted]
    assert again == answer


def test_generate_check_plain_exact_prints_identical(smollm_path):
    proc = speculum("generate", "--target", smollm_path, "--draft", smollm_path, *SELF_DRAFT, "--exact",
                    "--check-plain", PROMPT)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("Identical to plain decoding (") and last.endswith(" tokens).")
    assert "not promised" not in last


def test_generate_check_plain_forced_non_invariant_exits_1_at_the_first_difference(smollm_path, monkeypatch):
    monkeypatch.setenv("SPECULUM_FOLLOW_CORES", "0")  # one kernel path: its near tie does not move with the load
    for prompt in TIED_PROMPTS:
        proc = speculum("generate", "--target", smollm_path, "--draft", smollm_path, *SELF_DRAFT, "--no-exact",
                        "--check-plain", "--json", prompt)
        assert proc.returncode in (0, 1), proc.stderr
        if proc.returncode == 1:
            break
    assert proc.returncode == 1, f"no answer of {len(TIED_PROMPTS)} parted from plain decoding"
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    check, summary = records[-1], records[-2]
    answer = [t for r in records if r["type"] == "cycle" for t in r["emitted"]]
    assert check["type"] == "check_plain" and check["outcome"] == "differs" and not check["promised"]
    assert check["tokens"] == summary["tokens"] == len(answer)
    index = check["index"]
    assert 0 < index < len(answer) and check["checked"] == index
    assert check["answer"]["token"] == answer[index] != check["plain"]["token"]
    assert check["answer"]["logit"] <= check["plain"]["logit"]  # plain decoding takes the row's argmax
    assert check["plain"]["logit"] - check["answer"]["logit"] < 0.7  # a near tie, as the switch's rows differ
    assert check["words"].startswith(f"Differs from plain decoding at token {index} of {len(answer)}, after ")
    assert check["before"] and check["words"].count(repr(check["before"])) == 1
    assert "Identity is not promised with exact speculation off" in check["words"]


def test_check_plain_needs_greedy_and_one_prompt(smollm_path, tmp_path):
    hot = speculum("generate", "--target", smollm_path, "--temperature", "0.7", "--check-plain", PROMPT)
    assert hot.returncode == 2 and "needs --temperature 0" in hot.stderr
    doc = tmp_path / "d.txt"
    doc.write_text("Some text.")
    parts = speculum("generate", "--target", smollm_path, "--document", doc, "--check-plain", PROMPT)
    assert parts.returncode == 2 and "--check-plain checks one answer" in parts.stderr
