"""The window's Qt-free parts and small widgets, without a model: fast."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Signal

from speculum import summarise
from speculum.conversations import Conversation, ConversationStore, Message
from speculum.engine.cycle import Cycle
from speculum.ui import look
from speculum.ui.speculation import SpeculationView, token_runs
from speculum.ui.worker import replay_snapshots


def words(text: str) -> int:
    return len(text.split())


def test_split_keeps_every_character_and_respects_the_budget():
    text = "\n\n".join(f"Paragraph {i}. " + "word " * (i * 7 % 40 + 3) for i in range(60))
    text += "\n\n" + "x" * 500  # one "word" longer than any budget
    parts = summarise.split_by_tokens(text, lambda s: len(s) // 4 + 1, budget=60)
    assert "".join(parts) == text
    assert len(parts) > 10
    assert all(len(p) // 4 + 1 <= 60 for p in parts)
    assert all(p.strip() for p in parts)


def test_split_prefers_paragraph_boundaries():
    text = "one two three.\n\nfour five six.\n\nseven eight nine."
    assert summarise.split_by_tokens(text, words, budget=6) == ["one two three.\n\nfour five six.\n\n",
                                                               "seven eight nine."]


def test_copied_spans_are_found_in_order_and_merged():
    doc = "The tower is made of granite from the Isle of Mull. The keepers lived on the rock."
    spans = summarise.copied_spans(doc, ["tower is made", " made of granite", "of", "nowhere here", "the rock"])
    assert [doc[s:e] for s, e in spans] == ["tower is made of granite", "the rock"]


def test_conversation_store_round_trip_and_delete(data_dirs):
    store = ConversationStore()
    conv = Conversation(title="Lighthouse")
    conv.messages += [Message("user", "hi"), Message("assistant", "hello", cycles=[{"index": 0}], mode="lookup")]
    store.save(conv)
    again = store.load_all()
    assert [c.title for c in again] == ["Lighthouse"]
    assert again[0].messages[1].cycles == [{"index": 0}]
    assert again[0].history() == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    # A damaged file is skipped, not fatal; no temporary files are left behind.
    (store.folder / "broken.json").write_text("{not json")
    assert len(store.load_all()) == 1
    assert not list(store.folder.glob("*.tmp"))
    store.delete(conv.id)
    assert [c.title for c in store.load_all()] == []


def test_qt_calls_cannot_free_none_or_true():
    # PySide6 6.12.0 on Python < 3.12 drops a reference to None per void call and to True
    # per emit; without speculum.ui.qtcompat this loop aborts the interpreter.
    class Source(QObject):
        fired = Signal(object)

    source = Source()
    source.fired.connect(lambda _: None)
    for _ in range(60_000):
        source.setObjectName("x")
    for _ in range(6_000):
        source.fired.emit(1)
    assert sys.getrefcount(None) > 1000 and sys.getrefcount(True) > 1000


def cycle(index, source, drafted, n_accepted, emitted, finish=None):
    return Cycle(index, source, len(drafted), drafted, [f"t{t}" for t in drafted], n_accepted, emitted,
                 [f"t{t}" for t in emitted], "".join(f"t{t}" for t in emitted),
                 p_drafted=[0.5] * len(drafted), p_emitted=[0.25] * len(emitted), verify_s=0.01,
                 n_generated=0, finish=finish, policy={"source": source, "k": len(drafted)})


def test_token_kinds_of_a_cycle():
    rejected = cycle(0, "lookup", [1, 2, 3], 1, [1, 9])
    assert [k for _, k, _ in token_runs(rejected)] == [look.ACCEPTED, look.REJECTED, look.REJECTED, look.CORRECTION]
    full = cycle(1, "model", [4, 5], 2, [4, 5, 6])
    assert [k for _, k, _ in token_runs(full)] == [look.ACCEPTED, look.ACCEPTED, look.BONUS]
    plain = cycle(2, "none", [], 0, [7])
    assert [k for _, k, _ in token_runs(plain)] == [look.PLAIN]
    assert [k for _, k, _ in token_runs(rejected, verified=False)] == [look.PROPOSED] * 3
    tip = token_runs(rejected)[2][2]
    assert tip == "Cycle 1 · draft position 3 of 3 · drafter: prompt lookup · rejected · p = 0.50"


def test_whitespace_is_visible():
    assert look.visible("\n") == "↵\n"
    assert look.visible("  ") == "··"
    assert look.visible("\tx") == "⇥x"
    assert look.visible(" word") == " word"


def test_speculation_view_formats(qtbot):
    view = SpeculationView()
    qtbot.addWidget(view)
    view.append_cycles([cycle(0, "lookup", [1, 2], 1, [1, 9])])
    runs = view.runs()
    assert [k for _, k, _ in runs] == [look.ACCEPTED, look.REJECTED, look.CORRECTION]
    assert runs[1][2].fontStrikeOut() and not runs[0][2].fontStrikeOut()
    assert view.token_at(0)[1] == look.ACCEPTED
    view.show_proposed(cycle(1, "lookup", [3, 4], 0, [5]))
    assert [k for _, k, _ in view.runs()][-2:] == [look.PROPOSED, look.PROPOSED]
    view.append_cycles([cycle(1, "lookup", [3, 4], 0, [5])])  # the proposed draft is replaced, not kept
    assert look.PROPOSED not in [k for _, k, _ in view.runs()]


def test_replay_snapshots_follow_the_cycles():
    snaps = replay_snapshots([cycle(0, "lookup", [1, 2], 1, [1, 9]), cycle(1, "none", [], 0, [7])], 10.0)
    assert [s.tokens for s in snaps] == [2, 3]
    assert snaps[0].acceptance_rate == 0.5 and snaps[1].drafted == 2
    assert snaps[-1].speedup is not None and snaps[-1].speedup_source == "measured"
