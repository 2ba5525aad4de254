"""The window's Qt-free parts and small widgets, without a model: fast."""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace

import pytest

from PySide6.QtCore import QObject, Signal

from speculum import summarise
from speculum.conversations import Conversation, ConversationStore, Message
from speculum.documents import html_to_text
from speculum.engine.cycle import Cycle, PolicyReport
from speculum.ui import look
from speculum.ui.chat.answer import StagedCycle, answer_so_far, cycle_records, staged_cycles, with_stages
from speculum.ui.speculation.tokenview import SpeculationView, token_runs
from speculum.ui.speculation.stats import StatsPanel
from speculum.ui.chat.codeblocks import code_blocks_in
from speculum.ui.chat.transcript import Transcript, settled_length
from speculum.protocol import StatsSnapshot, replay_snapshots
from speculum.ui.worker import CycleBatcher, ui_cpu_budget


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


def test_html_entities_are_decoded_once():
    text = html_to_text("<p>Write &amp;lt;b&amp;gt; for bold; 3 &lt; 4 &amp; 5</p><script>x()</script>")
    assert text == "Write &lt;b&gt; for bold; 3 < 4 & 5"


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
                 n_generated=0, finish=finish, policy=PolicyReport(source, len(drafted)))


def test_engine_messages_speak_of_the_windows_controls():
    from speculum.engine.policy.fixed import NO_MTP

    assert look.window_words("Draft mode needs a draft model: pass --draft, or use --mode lookup.") == (
        "Draft mode needs a draft model: pick a draft model, or use Mode: Prompt lookup.")
    assert "--" not in look.window_words(NO_MTP) and "Mode: Draft model" in look.window_words(NO_MTP)
    assert look.window_words("in MTP mode (--mode mtp), on") == "in MTP mode (Mode: Built-in (MTP)), on"


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


def test_drafts_from_the_ngram_memory_are_named_as_such():
    memory = cycle(0, "memory", [1, 2], 2, [1, 2, 3])
    assert token_runs(memory)[0][2] == "Cycle 1 · draft position 1 of 2 · drafter: n-gram memory · accepted · p = 0.50"


def test_mtp_drafts_have_their_own_label_colour_and_hover_text(qtbot):
    mtp = cycle(0, "mtp", [1, 2], 1, [1, 9])
    assert token_runs(mtp)[0][2] == ("Cycle 1 · draft position 1 of 2 · drafter: MTP head (the model's own NextN "
                                     "layer) · accepted · p = 0.50")
    view = SpeculationView()
    qtbot.addWidget(view)
    view.append_cycles([StagedCycle(cycle(0, "model", [1], 1, [1, 2]))])
    assert "from MTP head" not in view.legend.toPlainText()  # named once an MTP draft shows
    view.append_cycles([StagedCycle(mtp)])
    runs = view.runs()
    assert [k for _, k, _ in runs] == [look.ACCEPTED, look.BONUS, look.MTP_ACCEPTED, look.REJECTED, look.CORRECTION]
    assert runs[2][2].background().color().name() == look.COLOURS[look.MTP_ACCEPTED][1]
    assert runs[2][2].background().color() != runs[0][2].background().color()
    assert "from MTP head" in view.legend.toPlainText()
    assert look.MODE_NAMES["mtp"] == "Built-in (MTP)"


def test_status_bar_names_a_built_in_mtp_head_as_the_draft(qtbot):
    from speculum.ui.library.loadstatus import LoadStatus

    status = LoadStatus()
    qtbot.addWidget(status)
    target = SimpleNamespace(name="Qwen3.6 27B", quantization="Q4_K_M", n_ctx=4096, nextn_layers=1, assistant="")
    status.show_pair(target, None)
    assert "built-in (its own MTP head)" in status.model_label.text()
    gemma = SimpleNamespace(name="Gemma 4 E4B", quantization="Q4_K_M", n_ctx=4096, nextn_layers=0,
                            assistant="Gemma 4 E4B assistant")
    status.show_pair(gemma, None)
    assert "←  Gemma 4 E4B assistant (Gemma 4 assistant, on the target's KV cache)" in status.model_label.text()
    status.show_pair(SimpleNamespace(name="SmolLM2", quantization="Q4_1", n_ctx=2048, nextn_layers=0, assistant=""), None)
    assert "no draft model" in status.model_label.text()
    # The demo draft's GGUF calls itself "… AWQ": it is a Q4_K_M GGUF, and shown as one.
    status.show_pair(SimpleNamespace(name="Qwen2.5 Coder 1.5B Instruct GGUF", quantization="Q4_K_M", n_ctx=4096,
                                     nextn_layers=0, assistant=""),
                     SimpleNamespace(name="Qwen2.5 Coder 0.5B Instruct AWQ", quantization="Q4_K_M"))
    assert status.model_label.text().startswith(
        "Qwen2.5 Coder 1.5B Instruct (Q4_K_M)  ←  Qwen2.5 Coder 0.5B Instruct (Q4_K_M)  ·")


def test_whitespace_is_visible():
    assert look.visible("\n") == "↵\n"
    assert look.visible("  ") == "··"
    assert look.visible("\tx") == "⇥x"
    assert look.visible(" word") == " word"


def test_speculation_view_formats(qtbot):
    view = SpeculationView()
    qtbot.addWidget(view)
    view.append_cycles([StagedCycle(cycle(0, "lookup", [1, 2], 1, [1, 9]))])
    runs = view.runs()
    assert [k for _, k, _ in runs] == [look.ACCEPTED, look.REJECTED, look.CORRECTION]
    assert runs[1][2].fontStrikeOut() and not runs[0][2].fontStrikeOut()
    assert view.token_at(0)[1] == look.ACCEPTED
    view.show_proposed(StagedCycle(cycle(1, "lookup", [3, 4], 0, [5])))
    assert [k for _, k, _ in view.runs()][-2:] == [look.PROPOSED, look.PROPOSED]
    view.append_cycles([StagedCycle(cycle(1, "lookup", [3, 4], 0, [5]))])  # the proposed draft is replaced, not kept
    assert look.PROPOSED not in [k for _, k, _ in view.runs()]


def test_each_cycle_keeps_its_stage_in_the_answer_and_its_stored_record():
    staged = [StagedCycle(cycle(0, "none", [], 0, [1]), "Part 1 of 2"),
              StagedCycle(cycle(1, "none", [], 0, [2]), "Part 2 of 2"), StagedCycle(cycle(2, "none", [], 0, [3]), "Part 2 of 2")]
    assert answer_so_far(staged) == "*Part 1 of 2*\n\nt1\n\n*Part 2 of 2…*\n\nt2t3"  # part 1 stays
    assert answer_so_far([StagedCycle(cycle(0, "none", [], 0, [1]))]) == "t1"
    records = cycle_records(staged + [StagedCycle(cycle(3, "none", [], 0, [4]))])
    assert [r.get("stage") for r in records] == ["Part 1 of 2", "Part 2 of 2", "Part 2 of 2", None]
    assert staged_cycles(records)[1] == StagedCycle(Cycle.from_json(records[1]), "Part 2 of 2")
    assert staged_cycles(records)[3].stage == ""  # one-part answers, and conversations saved before stages
    events = [SimpleNamespace(cycle=s.cycle, stage=s.stage, snapshot=StatsSnapshot()) for s in staged[:2]]
    assert [s.stage for s in with_stages([s.cycle for s in staged], events)] == ["Part 1 of 2", "Part 2 of 2", ""]


def test_each_part_keeps_its_own_prompt_counts_in_the_records_and_in_replay():
    from speculum.protocol import PartPrompt

    one, two = PartPrompt("Part 1 of 2", 301, 310, 9), PartPrompt("Part 2 of 2", 251, 260, 9)
    combine = PartPrompt("Combining", 1, 90, 89)
    staged = [StagedCycle(cycle(0, "none", [], 0, [1]), "Part 1 of 2", one),
              StagedCycle(cycle(1, "none", [], 0, [2]), "Part 1 of 2", one),
              StagedCycle(cycle(0, "none", [], 0, [3]), "Part 2 of 2", two),
              StagedCycle(cycle(0, "none", [], 0, [4]), "Combining", combine)]
    records = cycle_records(staged)
    assert [r.get("prompt") for r in records] == [[301, 310, 9], None, [251, 260, 9], [1, 90, 89]]  # once a part
    assert staged_cycles(records) == staged  # read back: each cycle knows its part's prompt
    snaps = replay_snapshots([s.cycle for s in staged], None, 999, 999, 0, [s.prompt for s in staged])
    assert [s.part_prompt for s in snaps] == [one, one, two, combine]
    # The answer's counts grow part by part, as they did live; after the last part: all together.
    assert [(s.prompt_tokens, s.prompt_total, s.prompt_reused) for s in snaps] == [
        (301, 310, 9), (301, 310, 9), (552, 570, 18), (553, 660, 107)]
    panel = StatsPanel()
    panel.show_snapshot(snaps[1])
    assert panel.value(panel.PROMPT) == "Part 1 of 2: 301 of 310 tokens (9 reused from the cache)"
    assert "553 of 660" not in panel.readout.tips[panel.PROMPT]
    panel.show_snapshot(snaps[2])
    assert panel.value(panel.PROMPT) == "Part 2 of 2: 251 of 260 tokens (9 reused from the cache)"
    assert panel.readout.tips[panel.PROMPT].endswith("All of this answer's prompts so far: 552 of 570 tokens "
                                                     "(18 reused from the cache).")
    # Stored counts are outside input: what makes no sense is left out, never a crash.
    for damaged in ([1, 2], [5, 2, 0], [-1, 2, 0], "300", [1.5, 2, 0], [True, 2, 0], None, {"a": 1}):
        records[0]["prompt"] = damaged
        assert staged_cycles(records)[1] == StagedCycle(staged[1].cycle, "Part 1 of 2", None)
    records[0]["stage"] = ["not", "text"]
    assert staged_cycles(records)[0].stage == ""


def test_replay_names_the_part_and_counts_cycles_over_the_whole_answer():
    from speculum.ui.speculation.replaycontroller import describe_step

    staged = [StagedCycle(cycle(0, "none", [], 0, [1]), "Part 1 of 2"),
              StagedCycle(cycle(0, "none", [], 0, [2]), "Part 2 of 2"), StagedCycle(cycle(1, "none", [], 0, [3]), "Part 2 of 2")]
    assert describe_step(staged, 6).startswith("Part 2 of 2 · Cycle 3 of 3: ")


def test_replay_bar_seeks_where_clicked_jumps_to_either_end_and_plays_at_three_speeds(qtbot):
    from PySide6.QtCore import QPoint, Qt

    from speculum.ui.speculation.replay import ReplayBar

    bar = ReplayBar()
    qtbot.addWidget(bar)
    bar.resize(600, 40)
    bar.show()
    qtbot.waitExposed(bar)
    bar.start(50)  # 100 steps, at the end: the final answer
    assert bar.step == 100 and bar.at_end
    slider = bar.slider
    qtbot.mouseClick(slider, Qt.LeftButton, pos=QPoint(slider.width() // 4, slider.height() // 2))
    assert 15 <= bar.step <= 35, bar.step  # where the click was, not one page from the handle
    qtbot.mouseClick(bar.first, Qt.LeftButton)
    assert bar.step == 0
    qtbot.mouseClick(bar.last, Qt.LeftButton)
    assert bar.step == 100
    assert [bar.speed.itemText(i) for i in range(bar.speed.count())] == ["1×", "4×", "Instant"]
    bar.speed.setCurrentText("4×")
    assert bar.pace == 4.0  # four times the answer's own pace (test_gui_issue49_truths)
    bar.speed.setCurrentText("Instant")
    bar.play.click()  # from the end: starts over, and plays through without a wait per step
    assert bar.timer.interval() == 0 and bar.step == 0
    qtbot.waitUntil(lambda: bar.at_end and not bar.play.isChecked(), timeout=10_000)


def test_replay_snapshots_follow_the_cycles():
    snaps = replay_snapshots([cycle(0, "lookup", [1, 2], 1, [1, 9]), cycle(1, "none", [], 0, [7])], 10.0)
    assert [s.tokens for s in snaps] == [2, 3]
    assert snaps[0].acceptance_rate == 0.5 and snaps[1].drafted == 2
    # A bare rate has no age: measured at another moment, so only an estimate.
    assert snaps[-1].speedup is not None and snaps[-1].speedup_source == "estimate"


def test_acceptance_bars_labels_fit_their_bars(qtbot):
    # 15 draft positions in a 1280-pixel window: "100%" centred on a narrower bar spilled white
    # onto the white gaps and read "00%".
    from speculum.ui.speculation.stats import AcceptanceBars

    from PySide6.QtGui import QFontMetricsF

    bars = AcceptanceBars()
    qtbot.addWidget(bars)
    seen = set()
    for width, rates in ((392, [1.0] * 10 + [0.6] * 3 + [0.2, 0.0]), (392, [1.0, 0.75, 0.5]),
                         (300, [1.0] * 15), (120, [1.0] * 15)):  # 392: the panel in a 1280-pixel window
        bars.resize(width, 90)
        bars.set_rates(rates)
        drawn, font = bars.bars()
        fm = QFontMetricsF(font)
        assert len(drawn) == len(rates)
        for rate, (x, bar, label) in zip(rates, drawn):
            inside = rate > 0.3
            assert fm.horizontalAdvance(label) <= (bar if inside else bar + bars.GAP), (width, rate, bar, label)
        forms = {"%" if label.endswith("%") else "number" if label else "none" for *_, label in drawn}
        assert len(forms) == 1  # one form for every bar ("60" beside "0%" read oddly)
        seen |= {(forms.pop(), font.pointSizeF() < bars.font().pointSizeF())}
        assert all(label in (f"{r:.0%}", f"{100 * r:.0f}", "") for r, (*_, label) in zip(rates, drawn))
        assert drawn[-1][0] + drawn[-1][1] <= width  # all within the widget
    # Wide bars keep full-size labels, narrow ones smaller ones, and the narrowest none.
    assert ("number", True) in seen and ("none", False) in seen and {("%", False), ("number", False)} & seen, seen
    assert "15: 100%" in bars.toolTip()  # every rate in words, where no label fits


def test_a_dark_desktop_theme_still_gets_dark_text_on_the_light_window(qtbot):
    # The style sheet paints light backgrounds; under a dark theme the palette's text was light:
    # the transcript, the stats and what the user types white on white.
    from PySide6.QtGui import QColor, QPalette
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    saved_palette, saved_style = app.palette(), app.style().name()
    dark = QPalette()
    for role, colour in ((QPalette.Window, "#2b2b2b"), (QPalette.WindowText, "#f0f0f0"), (QPalette.Base, "#1e1e1e"),
                         (QPalette.Text, "#f0f0f0"), (QPalette.Button, "#353535"), (QPalette.ButtonText, "#f0f0f0")):
        dark.setColor(role, QColor(colour))
    try:
        app.setPalette(dark)
        look.use_light_look(app)
        assert app.style().name().lower() == "fusion"
        transcript = Transcript()
        qtbot.addWidget(transcript)
        palette = transcript.palette()
        for text, ground in ((QPalette.Text, QPalette.Base), (QPalette.WindowText, QPalette.Window),
                             (QPalette.ButtonText, QPalette.Button)):
            assert palette.color(text).lightness() < 80 < 200 < palette.color(ground).lightness(), (text, ground)
    finally:
        app.setStyle(saved_style)
        app.setPalette(saved_palette)


def timed(c, seconds, policy=None):
    c.verify_s = seconds
    c.policy = policy or c.policy
    return c


def test_the_speedup_is_the_answers_own_not_its_last_cycles_estimate():
    # Auto mode: copies at twice plain speed, then a plain step whose estimate is 1.00x. The
    # answer ran at 2x; "1.00x (policy estimate)" is what the row said once it ended.
    from speculum.engine.stats import Stats
    from speculum.protocol import PlainBasis, snapshot_of

    report = lambda source, expected: PolicyReport(source, 0, mode="auto", plain_tokens_per_s=10.0,  # noqa: E731
                                                   expected_speedup=expected)
    stats, plain = Stats(), PlainBasis(10.0, age_s=30.0)  # measured here half a minute ago
    copy = timed(cycle(0, "lookup", [1, 2, 3], 3, [1, 2, 3, 4]), 0.2, report("lookup", 2.4))  # 4 tokens in 2 steps' time
    step = timed(cycle(1, "none", [], 0, [5]), 0.1, report("none", 1.0))
    for c, expected in ((copy, 2.0), (step, 5 / 0.3 / 10.0)):
        stats.add(c)
        plain.observe(c)
        snap = snapshot_of(stats, c, plain)
        assert snap.speedup == pytest.approx(expected) and snap.speedup_source == "measured"
        assert "measured on this machine 30 s ago (10.0 tok/s)" in snap.speedup_basis
    # No plain rate known yet (a forced mode's first cycle): the estimate, said to be one.
    step.policy = PolicyReport("none", 0, expected_speedup=1.0)
    snap = snapshot_of(stats, step, None)
    assert (snap.speedup, snap.speedup_source) == (1.0, "estimate") and "policy's expected" in snap.speedup_basis


def test_the_speedup_is_measured_against_plain_steps_in_the_same_answer_or_says_it_is_an_estimate(qtbot):
    # "1.17x (measured)" divided the answer's rate by a plain rate kept in the settings from
    # another session, on a machine whose speed moved from 9 to 13 tok/s within an hour.
    from speculum.engine.stats import Stats
    from speculum.protocol import RECENT_PLAIN_S, PlainBasis, snapshot_of

    def answer(plain: PlainBasis, cycles):
        stats = Stats()
        for c in cycles:
            stats.add(c)
            plain.observe(c)
        return snapshot_of(stats, cycles[-1], plain)

    drafted = [timed(cycle(i, "model", [1, 2], 2, [1, 2, 3]), 0.2) for i in range(3)]  # 15 tok/s
    # Plain steps in the answer itself: the yardstick, whatever was stored before.
    own = answer(PlainBasis(4.0, age_s=None), drafted + [timed(cycle(3, "none", [], 0, [4]), 0.125),
                                                        timed(cycle(4, "none", [], 0, [5]), 0.125)])
    assert own.speedup_source == "measured" and own.speedup == pytest.approx((11 / 0.85) / 8.0)
    assert own.speedup_basis == "Against the 2 plain steps in this answer (8.0 tok/s)."
    # None in the answer: a rate measured here minutes ago still counts; an older one, or one
    # from an earlier session, is an estimate with its basis on hover.
    recent = answer(PlainBasis(10.0, age_s=120.0), drafted)
    assert recent.speedup_source == "measured" and recent.speedup == pytest.approx(1.5)
    for stale in (PlainBasis(10.0, age_s=RECENT_PLAIN_S + 1), PlainBasis(10.0, age_s=None)):
        snap = answer(stale, drafted)
        assert snap.speedup_source == "estimate" and snap.speedup == pytest.approx(1.5)
        assert snap.speedup_basis.startswith("Estimate: no plain step in this answer; against a plain rate measured")
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.show_snapshot(snap)
    assert panel.value(panel.SPEEDUP).startswith("1.50×  (estimate)\n")
    assert "earlier session (10.0 tok/s)" in panel.readout.tips[panel.SPEEDUP]
    assert panel.readout.row_at(4 * panel.readout._line()) == panel.SPEEDUP


ANSWER = ("Here is the plan.\n\nFirst, read the file:\n\n```python\nwith open(path) as f:\n\n    data = f.read()\n```\n\n"
          "1. Parse it.\n2. Check it.\n\nDone, with `inline code` too.")


def test_the_input_grows_with_its_text_up_to_half_the_pane(qtbot):
    from speculum.ui.chat.chatpane import ChatPane

    pane = ChatPane()
    qtbot.addWidget(pane)
    pane.resize(700, 800)
    pane.show()
    box = pane.input
    short = box.height()
    box.setPlainText("\n".join(f"line {i}" for i in range(8)))
    qtbot.waitUntil(lambda: short < box.height() < pane.height() // 2, timeout=5_000)
    box.setPlainText("\n".join(f"line {i}" for i in range(50)))  # a 50-line paste
    qtbot.waitUntil(lambda: box.height() == pane.height() // 2, timeout=5_000)
    box.clear()
    qtbot.waitUntil(lambda: box.height() == short, timeout=5_000)


def test_settled_markdown_ends_at_a_blank_line_outside_code():
    assert settled_length("one\n\ntwo") == len("one\n\n")
    assert settled_length("one\ntwo") == 0
    # The blank line inside the fence does not settle anything; the one before the fence does.
    head = "Intro\n\n"
    assert settled_length(head + "```\ncode\n\nmore") == len(head)
    assert settled_length(ANSWER) == len(ANSWER) - len("Done, with `inline code` too.")


def test_live_answer_rendered_in_pieces_reads_as_rendered_whole(qtbot):
    whole, pieces = Transcript(), Transcript()
    qtbot.addWidget(whole)
    qtbot.addWidget(pieces)
    whole.begin_answer()
    whole.update_answer(ANSWER)
    pieces.begin_answer()
    for end in range(1, len(ANSWER) + 1, 7):
        pieces.update_answer(ANSWER[:end])
    pieces.update_answer(ANSWER)
    squash = lambda text: [line for line in text.splitlines() if line.strip()]  # noqa: E731
    assert squash(pieces.answer_text()) == squash(whole.answer_text())
    assert "data = f.read()" in pieces.answer_text()  # in a code block (one object, an editor over it)
    assert any("data = f.read()" in code for code, _ in code_blocks_in(pieces.document()))
    # A new answer that does not continue the old one replaces it entirely.
    pieces.update_answer("Something else.")
    assert pieces.answer_text() == "Something else."


def test_an_answer_keeps_the_line_breaks_the_model_wrote(qtbot):
    # Markdown joins a paragraph's lines: a haiku read as one line, "Lighthouse towers high,
    # Guiding ships through the night, Lightning strikes the sea."
    view = Transcript()
    qtbot.addWidget(view)
    haiku = "Lighthouse towers high,\nGuiding ships through the night,\nLightning strikes the sea."
    view.begin_answer()
    view.update_answer(haiku + "\n\n1. one\n2. two\n\n```\nx = 1  \ny = 2\n```\n\n**Bold**\nplain")
    lines = [line.strip() for line in view.answer_text().splitlines() if line.strip()]
    assert lines[:3] == haiku.splitlines(), lines
    assert lines[-2:] == ["Bold", "plain"]
    assert "x = 1" in lines and "y = 2" in lines  # code as written: no breaks added inside
    assert code_blocks_in(view.document()) == [("x = 1  \ny = 2", "code")]  # its own trailing spaces kept


def test_the_live_answers_header_changes_without_touching_the_answer(qtbot):
    view = Transcript()
    qtbot.addWidget(view)
    view.begin_answer()
    view.set_answer_status("reading the prompt…")
    assert view.toPlainText().splitlines()[-1] == "Assistant · reading the prompt…"
    view.update_answer("Hello")
    view.set_answer_status("writing…")
    view.update_answer("Hello there.\n\nA second paragraph")
    lines = [line for line in view.toPlainText().splitlines() if line.strip()]
    assert lines == ["Assistant · writing…", "Hello there.", "A second paragraph"]
    assert view.answer_text().split() == "Hello there. A second paragraph".split()


def test_an_answer_stopped_before_its_first_token_offers_no_replay(qtbot):
    view = Transcript()
    qtbot.addWidget(view)
    record = {"index": 0, "source": "none", "k": 0, "emitted": [], "finish": "stopped"}
    stopped = Message("assistant", "", cycles=[record], stats={"tokens": 0}, finish="stopped",
                      note="Stopped while reading the prompt (640 of 1,554 tokens read); nothing was written.")
    written = Message("assistant", "Hi.", cycles=[record], stats={"tokens": 2})
    view.show_messages([Message("user", "Hello"), stopped, Message("user", "Again"), written])
    html = view.toHtml()
    assert "replay:1" not in html and "replay:3" in html


def test_batcher_wakes_the_ui_once_per_frame_and_stretches_costly_frames(qtbot):
    batcher = CycleBatcher(interval_ms=20, cpu_budget=0.02)
    batches = []
    batcher.batchReady.connect(batches.append)
    worker = threading.Thread(target=lambda: [batcher.put(i) for i in range(500)])
    worker.start()
    worker.join()
    qtbot.waitUntil(lambda: sum(map(len, batches)) == 500, timeout=2000)
    # A wake-up per frame, not per event (a loaded machine may split them over a few frames).
    assert len(batches) < 20 and [e for b in batches for e in b] == list(range(500))  # in order, none lost

    def costly(_batch):  # a frame that keeps the UI thread busy for ~4 ms of CPU
        end = time.thread_time() + 0.004
        while time.thread_time() < end:
            pass
    batcher.batchReady.connect(costly)
    for i in range(6):
        batcher.put(i)
        batcher.flush()
    # 4 ms a frame within 2% of a core: frames stretch (4 / 0.02 = 200 ms, at least).
    assert batcher.interval_ms >= 190


def test_ui_cpu_budget_is_tight_only_when_llama_fills_every_core():
    from speculum.engine.vocabulary import Device

    facts = lambda device, threads: SimpleNamespace(device=device, n_threads=threads)  # noqa: E731
    assert ui_cpu_budget(facts(Device.CPU, 2), cores=2) < 0.05
    assert ui_cpu_budget(facts(Device.CPU, 4), cores=8) > 0.1
    assert ui_cpu_budget(facts(Device.CUDA, 8), cores=8) > 0.1


def test_stats_readout_keeps_its_height_and_copies_as_text(qtbot):
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.show()
    height = panel.readout.sizeHint().height()
    panel.readout.set_values({panel.POLICY: "prompt lookup, k = 4\n" + "a long estimate · " * 20})
    assert panel.readout.sizeHint().height() == height
    assert panel.value(panel.POLICY).startswith("prompt lookup, k = 4")
    assert "Policy: prompt lookup, k = 4" in panel.readout.as_text()


def test_live_widgets_repaint_without_the_window_behind_them(qtbot):
    """A style-sheet background would make each live update repaint the whole window."""
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QVBoxLayout, QWidget

    window = QWidget(objectName="back")
    window.setStyleSheet("QWidget#back { background: #f7f8fa; } "
                         "QTextEdit { background: white; border: 1px solid #d8dce2; border-radius: 6px; }")
    view = SpeculationView()
    QVBoxLayout(window).addWidget(view)
    qtbot.addWidget(window)
    window.resize(300, 200)
    window.show()
    qtbot.waitExposed(window)

    class Paints(QObject):
        count = 0

        def eventFilter(self, obj, event):
            if obj is window and event.type() == QEvent.Paint:
                Paints.count += 1
            return False

    counter = Paints()
    window.installEventFilter(counter)
    for i in range(150):  # enough text to need the scroll bar
        view.append_cycles([StagedCycle(cycle(i, "lookup", [1, 2], 1, [1, 9]))])
        qtbot.wait(5)
    # Once at most, when the scroll bar appears and the viewport narrows; not once per update.
    assert view.verticalScrollBar().maximum() > 0 and Paints.count <= 1


@pytest.mark.parametrize("width", [420, 460])  # the stats panel in a 1280- and a 1400-pixel window
def test_stats_say_when_the_policy_is_still_learning(qtbot, width):
    from PySide6.QtCore import QRect, Qt
    from PySide6.QtGui import QTextLayout, QTextOption

    from speculum.protocol import StatsSnapshot

    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.resize(width, panel.sizeHint().height())
    panel.show()
    policy = PolicyReport("none", 0, mode="auto", plain_tokens_per_s=23.2, learning=True, expected_tokens_per_s=23.2,
                          expected_tokens_per_pass=1.0, expected_speedup=1.0)
    panel.show_snapshot(StatsSnapshot(policy=policy))
    value = panel.value(panel.POLICY)
    assert "still learning" in value
    # ... where the row paints it: within its lines, wrapped as the row wraps (estimates after
    # it once wrapped onto the row's last line and pushed it out of sight)
    readout = panel.readout
    lines = dict(readout.rows)[panel.POLICY]
    width = readout.width() - readout._name_width()
    needed = readout.fontMetrics().boundingRect(QRect(0, 0, width, 10_000), Qt.TextWordWrap, value).height()
    assert needed <= lines * readout._line(), (width, needed, value)
    # ... and no estimate broken across lines ("7.6 tok/s" / "expected · plain 7.6 tok/s" read
    # as the plain rate expected)
    layout = QTextLayout(value.replace("\n", "\u2028"), readout.font())  # the layout's own line break
    option = QTextOption(Qt.AlignLeft)
    option.setWrapMode(QTextOption.WrapAtWordBoundaryOrAnywhere)  # as the row paints
    layout.setTextOption(option)
    layout.beginLayout()
    starts = []
    while (line := layout.createLine()).isValid():
        line.setLineWidth(width)
        starts.append(line.textStart())
    layout.endLayout()
    phrases = value.split("\n")[-1].split(" · ")
    assert len(phrases) == 2  # tokens per pass and the speedup expected (its plain speed is the Speedup row's)
    at = value.rindex("\n") + 1
    for phrase in phrases:
        assert not any(at < s < at + len(phrase) for s in starts), (phrase, starts, value)
        at += len(phrase) + 3
    assert "× expected" in readout.as_text() and "\u00a0" not in readout.as_text()  # copied as ordinary text
    # Where a phrase is wider than the row, it breaks at its spaces, not anywhere ("tokens/pa").
    assert readout._wrappable(value, 1000) == value
    assert "\u00a0" not in readout._wrappable(value, readout.fontMetrics().horizontalAdvance("expects 1.00"))
    panel.show_snapshot(StatsSnapshot(policy=PolicyReport("none", 0, mode="auto", expected_speedup=1.0, learning=False)))
    assert "learning" not in panel.value(panel.POLICY)
    # A stored cycle from before the field existed: nothing claimed either way.
    assert PolicyReport.from_json({"source": "none", "k": 0}).learning is None


def test_prompt_progress_bar_counts_tokens_and_hides_when_read(qtbot):
    from speculum.ui.chat.chatpane import ChatPane

    pane = ChatPane()
    qtbot.addWidget(pane)
    pane.show()
    assert not pane.prompt_progress.isVisible()
    pane.show_prompt_progress(384, 1200)
    assert pane.prompt_progress.isVisible()
    assert pane.prompt_progress.text() == "Reading the prompt… 384 / 1,200 tokens"
    assert pane.prompt_progress.value() == 384 and pane.prompt_progress.maximum() == 1200
    pane.show_prompt_progress(1200, 1200)
    assert not pane.prompt_progress.isVisible()


def test_the_prompt_cache_setting_reads_automatic_off_and_mib(qtbot):
    from PySide6.QtGui import QValidator

    from speculum.ui.settings import MAX_PROMPT_CACHE_MIB, Settings
    from speculum.ui.settingsdialog import CacheSpin

    spin = CacheSpin()
    qtbot.addWidget(spin)
    assert spin.textFromValue(-1).startswith("Automatic (about ") and spin.textFromValue(0) == "Off"
    assert spin.textFromValue(2048) == "2,048 MiB" and spin.valueFromText("2,048 MiB") == 2048
    assert spin.valueFromText(spin.textFromValue(-1)) == -1 and spin.valueFromText("off") == 0
    assert spin.validate("512", 3)[0] == QValidator.Acceptable and spin.validate("of", 2)[0] == QValidator.Intermediate
    assert spin.validate("lots", 4)[0] == QValidator.Invalid and spin.validate("9" * 12, 12)[0] == QValidator.Invalid
    spin.setValue(-1)
    seen = []
    for _ in range(3):
        spin.stepBy(1)
        seen.append(spin.value())
    spin.setValue(300)
    spin.stepBy(-1)
    seen.append(spin.value())
    spin.stepBy(-2)
    seen.append(spin.value())
    assert seen == [0, 256, 512, 256, -1]  # Automatic, Off, then whole steps
    # What the window passes to the engine: None is "from the memory free then"; a file's odd values are bounded.
    assert [Settings(prompt_cache_mib=v).prompt_cache_budget() for v in (-1, -40, 0, 300, 1 << 40)] == [
        None, None, 0, 300, MAX_PROMPT_CACHE_MIB]
