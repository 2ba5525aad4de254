"""The desktop window (PySide6). Widgets render Cycle events; the engine runs in its own process.

    app.py          run_app(): the QApplication and the window
    mainwindow.py   MainWindow: the panes laid out, models loaded, conversations, crash recovery
    answering.py    writing answers: send, summarise, Continue, live frames, how each ends
    modelbar.py     the toolbar: pair picker, Load, Models…, mode, document, Serve switch
    conversationlist.py  the conversations: list, New/Rename/Delete, titles, saving
    generationform.py    the Generation and Hardware groups, bound to the settings
    chatpane.py     banner, transcript with the document under it, input
    speculationpane.py   speculation view, replay bar and stats
    replaycontroller.py  stepping through a finished answer's stored cycles
    answer.py       an answer's cycles with their stages, and what is stored with it
    banner.py       messages with action buttons
    loadstatus.py   the status bar: loaded pair, load progress, backend; what a crash offers
    apiserving.py   ApiServing: the Serve switch wired to the engine; API requests shown live
    servepanel.py   ServePanel: the Serve switch, its URL, the request count and log
    models_dialog.py  the Models dialog (downloadrow.py: a download and its thread; hubpair.py)
    worker.py       Engine (the engine process's client), CycleBatcher (frames within a UI CPU budget)
    tokenview.py    SpeculationView: the token-by-token view and its legend
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
