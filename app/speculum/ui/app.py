"""Starting the desktop window."""

from __future__ import annotations

import sys


def run_app(args=None) -> int:
    from PySide6.QtWidgets import QApplication, QLabel, QMainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Speculum")
    window = QMainWindow()
    window.setWindowTitle("Speculum")
    window.setCentralWidget(QLabel("Speculum — the chat window arrives with the desktop-window issue."))
    window.resize(900, 600)
    window.show()
    return app.exec()
