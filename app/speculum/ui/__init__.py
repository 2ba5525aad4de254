"""The desktop window (PySide6). Widgets render Cycle events; the engine runs in worker.py's thread.

    app.py          run_app(): the QApplication and the window
    mainwindow.py   MainWindow: layout, conversations, generation flow, replay
    worker.py       EngineWorker (owns the models, in a QThread), CycleBatcher (frames within a UI CPU budget), requests/results
    speculation.py  the token-by-token speculation view and its legend
    stats.py        the stats panel and its QPainter charts
    transcript.py   the chat transcript (Markdown answers)
    document.py     the document pane (paste, open, drop; copied spans highlighted)
    replay.py       the replay bar
    inputbox.py     the message box (Enter sends, Esc stops)
    settings.py     the window's settings file
    modelchoices.py what the pair picker offers
    look.py         colours and token labels
    opaque.py       widgets that repaint alone (not the window behind them) while generating
    qtcompat.py     a work-around for PySide6 6.12.0 reference counts on Python < 3.12
"""

from . import qtcompat  # noqa: F401  (first: every Qt call below depends on it)
