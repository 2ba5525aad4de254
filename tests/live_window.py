"""The real window over a test's private data folders: the ``open_window`` fixture (registered
in conftest.py), and how a test sends a turn and waits for its answer."""

from __future__ import annotations

import pytest

LOAD_MS = 120_000
GENERATE_MS = 300_000  # the test machine is shared and can be slow


@pytest.fixture
def open_window(qtbot, data_dirs):
    """Open a window over the test's data folders, with settings on top of the saved ones."""
    from speculum.ui.mainwindow import MainWindow
    from speculum.ui.settings import Settings

    windows = []

    def open_(target=None, draft=None, load=True, **settings):
        fresh = not Settings.path().exists()
        saved = Settings.load()
        for key, value in {**({"n_ctx": 1024, "max_tokens": 48} if fresh else {}), **settings}.items():
            setattr(saved, key, value)
        window = MainWindow(settings=saved, autoload=False)
        qtbot.addWidget(window)
        if not saved.geometry:
            window.resize(1440, 900)  # as on a desktop screen (offscreen's own is 800x800)
        window.show()
        windows.append(window)
        if target is not None:
            window.set_pair(str(target), str(draft) if draft else None, load=False)
            if load:
                with qtbot.waitSignal(window.modelsLoaded, timeout=LOAD_MS):
                    window.load_pair()
        return window

    yield open_
    for window in windows:
        if window.isVisible():
            window.close()


def send(qtbot, window, text: str, timeout: int = GENERATE_MS):
    from PySide6.QtCore import Qt

    with qtbot.waitSignal(window.generationFinished, timeout=timeout):
        window.chat.input.setPlainText(text)
        qtbot.keyClick(window.chat.input, Qt.Key_Return)
    return window.current.messages[-1]


def start_answer(qtbot, window, text: str, cycles: int = 3) -> None:
    """Send ``text`` and return once ``cycles`` cycles of its answer have reached the window."""
    from PySide6.QtCore import Qt

    seen = []
    window.engine.worker.cycleReady.connect(seen.append, Qt.DirectConnection)
    window.chat.input.setPlainText(text)
    qtbot.keyClick(window.chat.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: len(seen) >= cycles, timeout=GENERATE_MS)
