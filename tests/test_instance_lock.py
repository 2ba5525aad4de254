"""Two real app processes on one data folder: the second says so and exits, writing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Runs the real window (run_app) in a child process. Message boxes are answered by a timer,
# as a user would; a window that opens is closed after WINDOW_MS, or left open with "hold".
CHILD = r"""
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox
from speculum.ui.app import run_app
from speculum.ui.mainwindow import MainWindow

hold = sys.argv[1] == "hold"
app = QApplication([])

def look():
    for widget in app.topLevelWidgets():
        if isinstance(widget, QMessageBox) and widget.isVisible():
            print("MESSAGE:", widget.text().replace("\n", " "), flush=True)
            widget.done(0)
        elif isinstance(widget, MainWindow) and widget.isVisible() and not getattr(widget, "_seen", False):
            widget._seen = True
            print("WINDOW OPEN", flush=True)
            if not hold:
                QTimer.singleShot(300, widget.close)

timer = QTimer()
timer.timeout.connect(look)
timer.start(50)
sys.exit(run_app(None))
"""


def child_env(tmp_path: Path) -> dict:
    env = dict(os.environ)
    app_dir = str(Path(__file__).resolve().parents[1] / "app")
    env.update(SPECULUM_DATA_DIR=str(tmp_path / "data"), SPECULUM_CONFIG_DIR=str(tmp_path / "config"),
               SPECULUM_MODELS_DIR=str(tmp_path / "models"), QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=os.pathsep.join(p for p in (app_dir, env.get("PYTHONPATH", "")) if p))
    return env


def run_child(tmp_path: Path, mode: str = "close") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, mode], env=child_env(tmp_path), capture_output=True,
                          text=True, timeout=120)


def test_a_second_window_on_the_same_data_folder_says_so_and_exits(tmp_path):
    first = subprocess.Popen([sys.executable, "-c", CHILD, "hold"], env=child_env(tmp_path),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "WINDOW OPEN"
        settings = tmp_path / "config" / "settings.json"
        before = settings.read_text() if settings.exists() else None

        second = run_child(tmp_path)

        assert second.returncode == 1, second.stderr
        assert f"already open (process {first.pid})" in second.stdout  # in the message box
        assert f"already open (process {first.pid})" in second.stderr  # and for a terminal
        assert "WINDOW OPEN" not in second.stdout
        assert (settings.read_text() if settings.exists() else None) == before  # wrote nothing
    finally:
        first.kill()  # as a crash would: the operating system releases the lock
        first.wait(30)

    third = run_child(tmp_path)
    assert third.returncode == 0, third.stderr
    assert "WINDOW OPEN" in third.stdout and "MESSAGE" not in third.stdout
    assert json.loads((tmp_path / "config" / "settings.json").read_text())  # it owns the folder now


def test_claiming_twice_in_one_process_is_fine_and_another_process_is_refused(tmp_path):
    from speculum import instance

    folder = tmp_path / "data"
    instance.claim(folder)
    instance.claim(folder)
    assert instance.owns(folder)
    probe = ("import sys; from speculum import instance\n"
             "try:\n    instance.claim(sys.argv[1])\nexcept instance.FolderInUse as exc:\n    print(exc)\n")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", probe, str(folder)], env=child_env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert f"already open (process {os.getpid()})" in out.stdout, out.stderr
    assert time.monotonic() - started < 30  # refused at once, not after waiting for the lock
