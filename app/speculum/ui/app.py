"""Starting the desktop window."""

from __future__ import annotations

import sys


def run_app(args=None) -> int:
    import shiboken6
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from .. import paths
    from .mainwindow import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Speculum")
    app.setOrganizationName("Speculum")
    app.setDesktopFileName("speculum")  # Wayland matches the window to resources/speculum.desktop
    icon = paths.resource("icons/speculum.svg")
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    window = MainWindow()
    window.show()
    code = app.exec()
    # The window must go before the application object; as locals, their order is not defined.
    shiboken6.delete(window)
    return code
