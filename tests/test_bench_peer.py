"""scripts/bench_peer.py's pure logic: rates, the table, the issue's comparisons (no servers)."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_peer.py"
spec = importlib.util.spec_from_file_location("bench_peer", SCRIPT)
bench_peer = importlib.util.module_from_spec(spec)
sys.modules["bench_peer"] = bench_peer  # (its dataclasses look their module up)
spec.loader.exec_module(bench_peer)
Result, Table, PLAIN = bench_peer.Result, bench_peer.Table, bench_peer.PLAIN


def result(ttft, seconds, tokens, text="same"):
    return Result(ttft_s=ttft, seconds=seconds, tokens=tokens, prompt_tokens=100, cached_tokens=0, text=text)


def test_rates_count_decoding_after_the_first_token_and_the_whole_request():
    r = result(ttft=1.0, seconds=5.0, tokens=41)
    assert r.decode_tok_s == 10.0  # 40 tokens after the first, in the 4 s after it
    assert r.e2e_tok_s == 41 / 5.0
    assert result(1.0, 1.0, 1).decode_tok_s == 0.0  # one token: no decoding time to speak of


def two_rounds() -> Table:
    table = Table()
    for row, rates in {"code, first time": {"speculum auto": (20, 30), "speculum off": (9.5, 10.5),
                                            PLAIN: (10, 10), "llama-server ngram-mod": (12, 12)},
                       "code, again": {"speculum auto": (25, 8), "speculum off": (10, 10),
                                       PLAIN: (10, 10), "llama-server ngram-mod": (20, 20)}}.items():
        for config, (first, second) in rates.items():
            for rate in (first, second):
                ttft = 0.5 if config == "speculum auto" else 0.2 if "again" in row else 1.0
                text = "other" if config == "llama-server ngram-mod" and "again" in row else "same"
                table.add(row, config, result(ttft, ttft + 100 / rate, int(100 / rate * rate) + 1, text))
    return table


def test_agreement_compares_each_round_with_plain():
    table = two_rounds()
    assert bench_peer.agreement(table, "speculum off") == (4, 4)
    assert bench_peer.agreement(table, "llama-server ngram-mod") == (2, 4)


def test_the_verdicts_pair_rows_within_a_round():
    table = two_rounds()
    ratios = bench_peer.paired(table, "speculum off", PLAIN, lambda r: r.decode_tok_s)
    assert sorted(round(x, 2) for x in ratios) == [0.95, 1.0, 1.0, 1.05]
    verdicts = bench_peer.verdicts(table)
    # auto loses the second round of "again" (8 against ngram-mod's 20): 3 of 4 won, worst named.
    assert verdicts["auto >= best llama-server, end-to-end (requests won)"] == "3 of 4"
    worst = verdicts["auto / best llama-server, end-to-end, worst"]
    assert "code, again, round 2, vs llama-server ngram-mod" in worst
    # Repeated prompts: auto's 0.5 s against the fastest llama-server's 0.2 s.
    assert verdicts["auto / fastest llama-server, time to first token, repeated prompts"].startswith("median 2.500")
    assert verdicts["off / plain, time to first token, first time"].startswith("median 1.000")


def test_the_bars_hold_each_kind_of_request_to_its_own_and_name_the_worst():
    table = two_rounds()
    bars = bench_peer.bars(table, copy_heavy={"code"})
    # off against plain decode: 0.95 in one request misses "every >= 0.97"; the median is 1.00
    assert bars["off / plain decode, median >= 1.00"].startswith("met: 1.000")
    assert bars["off / plain decode, every request >= 0.97"].startswith("NOT met: 0.950")
    assert bars["auto / best, again >= 1.0"].startswith("NOT met") and "code, again, round 2" in \
        bars["auto / best, again >= 1.0"]
    assert "auto / best, first time, copy-heavy >= 1.2" in bars
    assert "auto / best, first time, nothing to copy >= 0.99" not in bars  # no such request here
    busy = bench_peer.bars(table, copy_heavy={"code"}, busy=True)
    assert list(busy) == ["busy core: off / plain decode, median >= 1.5"] and busy[list(busy)[0]].startswith("NOT")


def test_the_table_shows_every_round_and_a_dash_where_a_configuration_did_not_run():
    table = two_rounds()
    table.add("switch back", "speculum auto", result(0.1, 1.1, 11))
    text = bench_peer.render(table, "e2e")
    lines = text.splitlines()
    assert lines[0].startswith("end-to-end tok/s")
    assert "code, first time" in lines[2] and " / " in lines[2]
    assert lines[-1].startswith("switch back") and lines[-1].rstrip().endswith("-")
    report = bench_peer.report(table, {"target": "t"})
    assert {r["config"] for r in report["rows"] if r["request"] == "switch back"} == {"speculum auto"}
    assert all(r["same_as_plain"] is None for r in report["rows"] if r["request"] == "switch back")


def test_llama_server_configurations_follow_what_the_build_offers_and_the_draft_model():
    configs = bench_peer.llama_server_configs("llama-server", "t.gguf", "d.gguf", 4096, 2,
                                              ["none", "draft-simple", "ngram-mod", "ngram-cache"])
    names = [c.name for c in configs if not c.optional]
    assert names == [PLAIN, "llama-server draft-simple", "llama-server ngram-mod", "llama-server ngram-cache",
                     "llama-server draft-simple+ngram-mod"]
    combined = configs[4].command
    assert combined[combined.index("--spec-type") + 1] == "draft-simple,ngram-mod" and "-md" in combined
    assert "-md" not in configs[2].command
    plain = configs[0].command
    assert plain[plain.index("-t") + 1] == plain[plain.index("-tb") + 1] == "2" and "-np" in plain
    alone = bench_peer.llama_server_configs("llama-server", "t.gguf", None, 4096, 2, ["ngram-mod"])
    assert [c.name for c in alone if not c.optional] == [PLAIN, "llama-server ngram-mod"]
    assert dict(configs[-1].env)["GOMP_SPINCOUNT"] == "1000" and configs[-1].optional


def test_cases_build_later_turns_from_each_configurations_own_answers():
    class Prompt:
        def __init__(self, name):
            self.name, self.max_tokens, self.json_schema = name, 64, None

        def messages(self):
            return [{"role": "user", "content": self.name}]

    steps = bench_peer.cases([Prompt("code-editing"), Prompt("open-chat"), Prompt("verbatim-extraction")], None)
    assert [s.row for s in steps[0]] == ["code-editing, first time", "code-editing, again"]
    regenerate, switch = steps[-2], steps[-1]
    assert regenerate[0].row is None and regenerate[1].messages(["A1"]) == regenerate[2].messages(["A1"])
    assert regenerate[1].messages(["A1"])[1] == {"role": "assistant", "content": "A1"}
    assert [m["content"] for m in switch[1].messages([])] == ["open-chat"]
    assert switch[2].messages(["edit answer", "chat answer"])[:2] == [
        {"role": "user", "content": "code-editing"}, {"role": "assistant", "content": "edit answer"}]


def test_the_load_average_is_unknown_where_the_system_keeps_none(monkeypatch):
    import os

    from speculum.engine.backend import load_average, one_minute_load

    assert one_minute_load((0.54, 0.2, 0.1)) == "0.5"
    monkeypatch.delattr(os, "getloadavg")  # (Windows has none)
    assert load_average() is None
    assert one_minute_load(load_average()) == "unknown"
