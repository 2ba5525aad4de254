"""scripts/agent_record.py's pure logic (no agents, no servers): the scrubber takes paths, ids and
dates out of a recorded session and keeps what the prompt cache needs (the same value, the same
placeholder); an answer's tool calls mark the turns that edit code; scripts/bench_agent.py tells a
call the client received from a call that reached it as text."""

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "agent_record.py"
spec = importlib.util.spec_from_file_location("agent_record", SCRIPT)
agent_record = importlib.util.module_from_spec(spec)
sys.modules["agent_record"] = agent_record  # (its dataclasses look their module up)
spec.loader.exec_module(agent_record)
spec = importlib.util.spec_from_file_location("bench_agent", SCRIPT.with_name("bench_agent.py"))
bench_agent = importlib.util.module_from_spec(spec)
sys.modules["bench_agent"] = bench_agent
spec.loader.exec_module(bench_agent)


def test_the_scrubber_replaces_paths_ids_and_dates_with_the_same_placeholder_for_the_same_value():
    work = "/tmp/bench-agent-record-x1y2/project"
    scrub = agent_record.Scrubber(paths={work: "/home/user/project", "/root": "/home/user"})
    call = "call_" + "3f9a0c1d2e4b5a6978f0e1d2"
    body = {"system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.e51; cch=a5145;"}],
            "metadata": {"user_id": "session_9b2c3d4e-1111-4222-8333-abcdefabcdef"},
            "messages": [{"role": "user", "content": f"Today's date is 2026-12-07. cwd: {work}, at 02:11:33; "
                                                     "logs in /tmp/tmpab12cd/x and /root/.claude"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": call, "name": "Read",
                                                            "input": {"file_path": f"{work}/greet.py"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": "ok"}]}],
            "max_tokens": 32000}
    out = scrub.json(body)
    text = json.dumps(out)
    for secret in ("x1y2", "tmpab12cd", "/root", "2026-12-07", "02:11:33", "a5145", "9b2c3d4e", "3f9a0c1d"):
        assert secret not in text, secret
    assert out["messages"][1]["content"][0]["input"]["file_path"] == "/home/user/project/greet.py"
    assert out["messages"][1]["content"][0]["id"] == out["messages"][2]["content"][0]["tool_use_id"]  # still paired
    assert out["max_tokens"] == 32000 and "cc_version=2.1.197" in text  # what is no id stays
    assert scrub.text(call) == out["messages"][1]["content"][0]["id"]  # the same value, the same placeholder later
    assert scrub.text("call_" + "0" * 8 + "abcdefabcdefabcd") != scrub.text(call)  # another id, another one


def test_an_answers_calls_are_read_from_either_api_and_mark_edit_turns():
    anthropic = "\n".join("data: " + json.dumps(e) for e in [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "name": "Edit", "id": "t"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"a\""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": ": 1}"}}])
    responses = "\n".join("data: " + json.dumps(e) for e in [
        {"type": "response.output_item.done", "item": {"type": "function_call", "name": "exec_command",
                                                       "arguments": "{\"cmd\": \"cat greet.py\"}"}}])
    writes = responses.replace("cat greet.py", "sed -i s/Hello/Goodbye/ greet.py")
    assert agent_record.calls_in(anthropic) == [("Edit", "{\"a\": 1}")]
    assert agent_record.edits(agent_record.calls_in(anthropic))
    assert not agent_record.edits(agent_record.calls_in(responses))  # reading is no edit
    assert agent_record.edits(agent_record.calls_in(writes))
    assert agent_record.calls_in("event: ping\ndata: {}\n") == []


def test_ttft_is_compared_apart_where_a_server_sent_a_call_as_text():
    # llama-server streamed Qwen's bare {"name": ...} calls to Codex as output text: its first event
    # came with the first token, and Codex got no call.
    assert bench_agent.called({"type": "content_block_start", "content_block": {"type": "tool_use", "name": "Read"}}) == "Read"
    assert bench_agent.called({"type": "response.output_item.added",
                               "item": {"type": "function_call", "name": "write_stdin"}}) == "write_stdin"
    assert bench_agent.called({"type": "response.output_item.added", "item": {"type": "message"}}) is None
    turns = [bench_agent.Turn("codex", i, "/v1/responses", False, {}) for i in (1, 2)]

    def result(ttft, calls=()):
        return bench_agent.Result(ttft_s=ttft, seconds=ttft + 1, tokens=10, prompt_tokens=100, cached_tokens=0,
                                  calls=calls)
    results = {("codex 1", "speculum auto"): result(2.0, ("write_stdin",)), ("codex 1", "plain"): result(1.0),
               ("codex 2", "speculum auto"): result(1.0), ("codex 2", "plain"): result(2.0)}
    said = bench_agent.verdicts(results, turns, ["speculum auto", "plain"])
    assert said["TTFT speculum / plain"].startswith("median 1.25 (min 0.50, max 2.00, n 2)")
    assert said["TTFT speculum / plain, turns answered alike"] == (
        "median 0.50 (min 0.50, max 0.50, n 1); plain sent as text what speculum sent as a call on: codex 1")
    assert "call write_stdin" in bench_agent.render(results, turns, ["speculum auto", "plain"], "received")
