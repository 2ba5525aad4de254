"""The window over the prompt cache: switching back to a conversation reads only its new turn."""

from __future__ import annotations

from live_window import send

LOG = " ".join(f"Line {i}: the lighthouse keeper logged the weather, the ships and the tide." for i in range(14))


def test_switching_back_to_a_conversation_reads_only_its_new_turn(qtbot, open_window, smollm_path):  # noqa: F811
    w = open_window(smollm_path, mode="lookup", max_tokens=16)
    first = send(qtbot, w, LOG + "\nWhat did the keeper log?")
    first_id = w.current.id
    w.new_conversation()
    send(qtbot, w, "Name three colours of the rainbow.")  # another conversation takes the model's cache
    w.open_conversation(first_id)
    again = send(qtbot, w, "And then?")
    assert w.current.id == first_id and len(w.current.messages) == 4
    # The first turn came back from the prompt cache: only the new one was read.
    assert again.stats["prompt_reused"] >= first.stats["prompt_total"] - 1
    assert again.stats["prompt_tokens"] < again.stats["prompt_total"] - first.stats["prompt_total"] + 8
    stats = w.speculation_pane.stats
    shown = stats.value(stats.PROMPT)
    assert f"{again.stats['prompt_reused']:,} reused from the cache" in shown
