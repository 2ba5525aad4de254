"""The window's "Check against plain decoding" on an answer: the real window, its engine process
and SmolLM2 drafting for itself at k = 8 (see test_check_plain.py for why that configuration
shows a real difference with the row-invariance switch off)."""

from PySide6.QtCore import Qt, QUrl

from live_window import GENERATE_MS, LOAD_MS, send
from test_check_plain import PROMPT, TIED_PROMPTS

SELF_DRAFT = {"k": 8, "max_tokens": 64}


def _self_drafting(open_window, smollm_path, tmp_path, exact: bool):
    """The window over SmolLM2 drafting for itself: the same weights under another name (the model bar
    takes no target as its own draft); Draft model mode is offered once a draft is loaded."""
    draft = tmp_path / "SmolLM2-as-draft.gguf"
    if not draft.exists():
        draft.symlink_to(smollm_path)
    w = open_window(smollm_path, draft, exact=exact, **SELF_DRAFT)
    w.model_bar.mode_combo.setCurrentIndex(w.model_bar.mode_combo.findData("draft"))
    return w


def _check(qtbot, w, index: int) -> str:
    checking = w.plain_checking
    progress = []
    w.engine.worker.plainCheckProgress.connect(lambda checked, total: progress.append((checked, total)),
                                               Qt.DirectConnection)
    with qtbot.waitSignal(checking.finished, timeout=GENERATE_MS):
        w.chat.transcript.anchorClicked.emit(QUrl(f"check:{index}"))  # the answer's link
        assert checking.busy and checking.bar.cancel_button.isVisible()
        assert not w.chat.send_button.isEnabled()  # one thing at a time in the engine
    assert progress and progress[-1][0] <= progress[-1][1]
    assert not checking.busy and w.chat.send_button.isEnabled()
    assert checking.bar.cancel_button.isHidden() and checking.bar.progress.isHidden()
    return checking.bar.text()


def test_a_code_answer_checks_identical_with_exact_speculation(qtbot, open_window, smollm_path, tmp_path):
    w = _self_drafting(open_window, smollm_path, tmp_path, exact=True)
    answer = send(qtbot, w, PROMPT)
    assert answer.mode == "draft"
    assert "```" in answer.content or "def " in answer.content  # a code answer
    assert "Check against plain decoding" in w.chat.transcript.toPlainText()
    tokens = sum(len(c["emitted"]) for c in answer.cycles)
    shown = _check(qtbot, w, 1)
    assert shown == f"Answer 1: Identical to plain decoding ({tokens} tokens)."


def test_with_exact_speculation_off_the_check_shows_the_first_difference(qtbot, open_window, smollm_path,
                                                                          tmp_path, monkeypatch):
    # The near tie this answer parts at comes from one kernel path: threads that follow the
    # machine's load (engine/llama/contention.py) would change it with what else runs.
    monkeypatch.setenv("SPECULUM_FOLLOW_CORES", "0")
    w = _self_drafting(open_window, smollm_path, tmp_path, exact=False)
    for prompt in TIED_PROMPTS:  # (test_check_plain.py: which one parts depends on the CPU)
        if prompt != TIED_PROMPTS[0]:
            w.new_conversation()  # each its first answer, as the command line's
        assert send(qtbot, w, prompt).mode == "draft"
        shown = _check(qtbot, w, 1)
        result = w.plain_checking.last
        assert result is not None, shown  # (the check's own words when it could not run)
        if result.index is not None:
            break
    assert result.index is not None and result.answer.token != result.plain.token, shown
    assert shown.startswith(f"Answer 1: Differs from plain decoding at token {result.index} of ")
    # where it is, in the answer's own words (its last words, "…" where they are not all of it)
    assert f", after …{result.before!r}: " in shown or f", after {result.before!r}: " in shown
    assert f"{result.answer.text!r} (id {result.answer.token}, logit {result.answer.logit:.4f}) vs plain " \
           f"{result.plain.text!r} (id {result.plain.token}, logit {result.plain.logit:.4f})" in shown
    assert "Identity is not promised with exact speculation off" in shown
    # Plain text, as typed: a token is never read as markup.
    assert w.plain_checking.bar.label.textFormat() == Qt.PlainText


def test_the_exact_setting_starts_the_engine_with_the_switch(qtbot, open_window, smollm_path):
    from speculum.engine.llama import cpu_settings
    from speculum.ui.settingsdialog import SettingsDialog

    w = open_window(load=False)
    assert w.settings.exact is cpu_settings.EXACT_BY_DEFAULT
    dialog = SettingsDialog(w.settings, w)
    assert dialog.exact.isChecked() is cpu_settings.EXACT_BY_DEFAULT and dialog.exact.isEnabled()
    dialog.exact.setChecked(True)
    dialog.accept()
    assert w.settings.exact is True
    settings = []
    w.engine.worker.ready.connect(lambda _gpu, setting: settings.append(setting))
    w.set_pair(str(smollm_path), load=False)
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()  # a fresh engine process, with the switch as the setting says
    assert w.engine._process.exact is True
    qtbot.waitUntil(lambda: bool(settings), timeout=LOAD_MS)
    assert cpu_settings.rows_invariant_asked(settings[-1])


def test_a_check_cancels_and_foreign_tokens_are_refused_in_words(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup", max_tokens=16)
    answer = send(qtbot, w, "Name three fruits.")
    checking = w.plain_checking
    with qtbot.waitSignal(checking.finished, timeout=GENERATE_MS):
        w.chat.transcript.anchorClicked.emit(QUrl("check:1"))
        checking.bar.cancel_button.click()  # at once: the engine sees it before its first token
    assert checking.bar.text().startswith("Answer 1: Check cancelled: the first ")
    tokens = sum(len(c["emitted"]) for c in answer.cycles)
    assert f"of {tokens} tokens are plain decoding's." in checking.bar.text()
    # A conversation file that says the answer was other tokens than this model has: said, not crashed.
    answer.cycles[0]["emitted"] = [10**9]
    w.chat.transcript.show_messages(w.current.messages)
    with qtbot.waitSignal(checking.finished, timeout=GENERATE_MS):
        w.chat.transcript.anchorClicked.emit(QUrl("check:1"))
    assert checking.bar.text() == ("Answer 1: the check could not run. The answer's tokens are not this model's: "
                                   "load the model that wrote it.")
    assert w.engine.is_alive() and w.chat.send_button.isEnabled()
    assert send(qtbot, w, "Name three colours.").content  # the engine answers on


def test_a_checks_result_stays_with_its_conversation(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, mode="lookup", max_tokens=16)
    send(qtbot, w, "Name three fruits.")
    checked = w.current.id
    shown = _check(qtbot, w, 1)
    assert shown.startswith("Answer 1: ")
    w.new_conversation()
    qtbot.waitUntil(lambda: w.current.id != checked)
    other = w.current.id
    assert w.plain_checking.bar.text() == ""  # another conversation's answer was checked, not this one's
    w.open_conversation(checked)
    assert w.plain_checking.bar.text() == shown  # back: its result, as it was
    w.plain_checking.bar.close_button.click()
    w.open_conversation(other)
    w.open_conversation(checked)
    assert w.plain_checking.bar.text() == ""  # dismissed stays dismissed
