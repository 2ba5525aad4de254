"""File ▸ Settings…: the prompt cache's budget and the n-gram memory, saved and passed to the
engine at the next Load; "Forget" empties the memory on disk (real window, SmolLM2)."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from speculum.engine.drafting import ngrammemory
from speculum.ui.settings import Settings
from speculum.ui.settingsdialog import SettingsDialog

from test_gui_prompt_cache import LOG
from live_window import LOAD_MS, send


def settings_dialog(qtbot, window) -> SettingsDialog:
    window.settings_action.trigger()  # File ▸ Settings…
    dialog = window.findChild(SettingsDialog)
    qtbot.waitExposed(dialog)
    return dialog


def press_ok(qtbot, dialog: SettingsDialog) -> None:
    qtbot.mouseClick(dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.Ok), Qt.LeftButton)
    dialog.deleteLater()


def memory_files() -> list:
    folder = ngrammemory.folder()
    return sorted(folder.glob("*.bin")) if folder.is_dir() else []


def switch_back(qtbot, w):
    """A long first turn, another conversation, then back to the first: (first answer, the next)."""
    first = send(qtbot, w, LOG + "\nWhat did the keeper log?")
    first_id = w.current.id
    w.new_conversation()
    send(qtbot, w, "Name three colours of the rainbow.")
    w.open_conversation(first_id)
    return first, send(qtbot, w, "And then?")


def test_memory_settings_reach_the_engine_and_forget_empties_the_memory(qtbot, open_window, smollm_path):
    w = open_window(smollm_path, load=False, mode="lookup", max_tokens=16)
    dialog = settings_dialog(qtbot, w)
    assert dialog.cache.text().startswith("Automatic (about ") and dialog.memory.isChecked()  # the defaults
    for widget in (dialog.cache, dialog.memory, dialog.forget):
        assert len(widget.toolTip()) > 80, widget.objectName()  # each says what it does, in plain words
    dialog.cache.setValue(0)
    assert dialog.cache.text() == "Off"
    dialog.memory.setChecked(False)
    press_ok(qtbot, dialog)
    saved = json.loads(Settings.path().read_text())
    assert saved["prompt_cache_mib"] == 0 and saved["ngram_memory"] is False

    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()
    first, again = switch_back(qtbot, w)
    # No prompt cache in the engine: the first conversation's prompt is read again in full.
    assert again.stats["prompt_reused"] < first.stats["prompt_total"] // 2, (first.stats, again.stats)
    assert memory_files() == []  # no n-gram memory: nothing learned

    dialog = settings_dialog(qtbot, w)
    assert dialog.cache.text() == "Off" and not dialog.memory.isChecked()  # as saved
    assert dialog.held.text() == "It is empty."
    dialog.cache.stepBy(-1)  # below Off: Automatic again
    dialog.memory.setChecked(True)
    press_ok(qtbot, dialog)
    assert Settings.load().prompt_cache_mib == -1 and Settings.load().ngram_memory
    with qtbot.waitSignal(w.modelsLoaded, timeout=LOAD_MS):
        w.load_pair()
    first, again = switch_back(qtbot, w)
    assert again.stats["prompt_reused"] >= first.stats["prompt_total"] - 1  # the cache is back
    learned = memory_files()
    assert learned and all(f.stat().st_size > 0 for f in learned)  # and the memory learns again

    dialog = settings_dialog(qtbot, w)
    assert dialog.held.text().startswith("It holds ")
    qtbot.mouseClick(dialog.forget, Qt.LeftButton)
    assert memory_files() == [] and dialog.held.text() == "Forgotten: it is empty."
    dialog.reject()
    assert w.current.messages  # the conversations themselves are kept


def test_exactness_follows_the_default_until_the_user_chooses(data_dirs):
    from speculum import paths
    from speculum.engine.llama.cpu_settings import EXACT_BY_DEFAULT

    # a file an earlier version saved, with its default written out, is no choice
    paths.write_json_atomic(Settings.path(), {"exact": not EXACT_BY_DEFAULT})
    assert Settings.load().exact is EXACT_BY_DEFAULT
    chosen = Settings(exact=not EXACT_BY_DEFAULT, exact_chosen=True)
    chosen.save()
    assert Settings.load().exact is (not EXACT_BY_DEFAULT)
