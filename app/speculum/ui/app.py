"""Starting the desktop window."""

from __future__ import annotations

import sys


def run_app(args=None) -> int:
    import shiboken6
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from .. import paths
    from . import look
    from .mainwindow import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    look.use_light_look(app)
    app.setApplicationName("Speculum")
    app.setOrganizationName("Speculum")
    app.setDesktopFileName("speculum")  # Wayland matches the window to resources/speculum.desktop
    icon = paths.resource("icons/speculum.svg")
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    from .. import instance
    from .chat.richtext import warn

    try:
        instance.claim(paths.data_dir())  # one window per data folder: see speculum.instance
    except instance.FolderInUse as exc:
        print(f"speculum: {exc}", file=sys.stderr)
        warn(None, "Speculum is already open", str(exc))
        return 1
    except OSError as exc:  # a read-only or missing folder: the window reports what fails to save
        print(f"speculum: could not lock {paths.data_dir()}: {exc}", file=sys.stderr)
    window = MainWindow()
    window.show()
    code = app.exec()
    # The window must go before the application object; as locals, their order is not defined.
    shiboken6.delete(window)
    return code
