"""Screenshots for issue 49's truths (the stats panel, a Stop while a document is read, the live
view after a restart), from fresh folders, as a new user sees them.

    xvfb-run -s "-screen 0 1280x720x24" python docs/notes/issue49/shots_truths.py MODEL.gguf OUT_DIR

Set SPECULUM_DATA_DIR and SPECULUM_CONFIG_DIR to empty folders first.
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QEventLoop, Qt, QTimer
from PySide6.QtWidgets import QApplication

from speculum import paths
from speculum.ui.mainwindow import MainWindow

QUESTION = ("Copy this text exactly, twice:\nThe quick brown fox jumps over the lazy dog. "
            "Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump.")

STORY = "Write a long story about a lighthouse keeper and the sea, with many storms."


def wait(signal, seconds: float = 300) -> None:
    loop = QEventLoop()
    signal.connect(loop.quit)
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()


def settle(ms: int = 400) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def open_window(model: str) -> MainWindow:
    w = MainWindow(autoload=False)
    w.setGeometry(QApplication.primaryScreen().availableGeometry())
    w.show()
    w.set_pair(model, None, load=False)
    w.load_pair()
    wait(w.modelsLoaded)
    return w


def main(model: str, out: Path) -> None:
    app = QApplication.instance() or QApplication(sys.argv)
    out.mkdir(parents=True, exist_ok=True)
    w = open_window(model)
    w.generation_form.n_ctx.setValue(1024)
    w.model_bar.mode_combo.setCurrentIndex(w.model_bar.mode_combo.findData("auto"))
    for question in (QUESTION, "Now write it once more."):
        w.chat.input.setPlainText(question)
        w.send(question)
        wait(w.generationFinished)
    settle()
    w.speculation_pane.stats.grab().save(str(out / "truths-stats-one-plain-speed.png"))
    w.grab().save(str(out / "truths-window-answer.png"))

    # A long answer, for the live view after a restart.
    w.new_conversation()
    w.generation_form.max_tokens.setValue(160)
    w.send(STORY)
    wait(w.generationFinished)

    # A long document, stopped while its first part is read.
    w.new_conversation()
    w.load_pair()  # the smaller context applies at the next load
    wait(w.modelsLoaded)
    w.model_bar.document_toggle.setChecked(True)
    text = paths.resource("samples/lighthouse.md").read_text(encoding="utf-8") * 4
    w.chat.document.set_document(text, "lighthouse-x4.md")
    w.engine.worker.promptProgress.connect(lambda read, total: read and w.engine.stop(), Qt.DirectConnection)
    w.summarise()
    wait(w.generationFinished)
    settle()
    w.grab().save(str(out / "truths-stopped-document-reading.png"))
    w.close()

    # Started again: the live view shows the last answer's cycles, from a whole row.
    again = MainWindow(autoload=False)
    again.setGeometry(QApplication.primaryScreen().availableGeometry())
    again.show()
    again.open_conversation(next(c.id for c in again.conversations.conversations if c.title == STORY[:48] + "…"))
    settle(800)
    again.speculation_pane.grab().save(str(out / "truths-live-view-after-restart.png"))
    again.close()
    app.quit()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
