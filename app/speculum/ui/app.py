"""Starting the desktop window."""

from __future__ import annotations

import sys


def run_app(args=None) -> int:
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from .. import paths
    from .mainwindow import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Speculum")
    app.setOrganizationName("Speculum")
    icon = paths.resource("icons/speculum.svg")
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    window = MainWindow()
    window.show()
    return app.exec()
