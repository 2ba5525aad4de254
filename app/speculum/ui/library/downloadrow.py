"""One download in the Models dialog: its row of bars and the worker thread that runs it.

A download must never block the window nor die with it: each runs on its own QThread, and
one still blocked on the network when the dialog closes is kept alive here until it ends.
"""

from __future__ import annotations

import html
from typing import Callable

from PySide6.QtCore import QCoreApplication, QDeadlineTimer, QObject, Qt, QThread, Signal, Slot
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from ...engine.vocabulary import Word
from ...errors import SpeculumError
from ...models.commands import human_bytes, human_time
from ...models.download import CancelToken, DownloadCancelled, DownloadPaused, DownloadProgress
from ...models.library import LibraryPair
from ..chat.richtext import plain_label

SCALE = 1000  # progress bars count in thousandths: QProgressBar is 32-bit, files are not
CLOSE_WAIT_MS = 3000  # closing waits this long, in all, for downloads to stop at their next chunk
# Downloads still blocked (a network timeout) when their dialog closed: kept alive here, with
# nothing connected to the gone widgets, until they end by themselves.
_finishing: list[tuple[QThread, "DownloadWorker"]] = []
QUIT_WAIT_MS = 5000  # at quit, the most the app waits for them (a QThread destroyed running aborts)


def _wait_for_finishing() -> None:
    deadline = QDeadlineTimer(QUIT_WAIT_MS)
    for thread, _worker in _finishing:
        thread.wait(deadline)


class DownloadState(Word):
    """Where a download stands, set from how its job ended (never read back from its message)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"  # an error: its message says what, and Retry runs the job again
    CANCELLED = "cancelled"  # the user's Cancel: what it staged is removed
    PAUSED = "paused"  # the dialog closed: the partial files are kept for the next run


ENDED = {  # what a row says when its download ended without an error of its own
    DownloadState.CANCELLED: "Cancelled; nothing was added to the library.",
    DownloadState.PAUSED: "Paused; the part downloaded is kept, and starting it again resumes there.",
}


class DownloadWorker(QObject):
    """Runs one library job (install, add from the Hub) away from the GUI thread."""

    progress = Signal(object)  # DownloadProgress
    finished = Signal(object)  # LibraryPair or LocalModel
    failed = Signal(object, str)  # DownloadState (failed, cancelled or paused), the error's message

    def __init__(self, job: Callable[[Callable[[DownloadProgress], None], CancelToken], object]):
        super().__init__()
        self.job = job
        self.cancel = CancelToken()

    @Slot()
    def run(self) -> None:
        try:
            result = self.job(self.progress.emit, self.cancel)
        except DownloadCancelled as exc:
            self.failed.emit(DownloadState.CANCELLED, str(exc))
        except DownloadPaused as exc:
            self.failed.emit(DownloadState.PAUSED, str(exc))
        except SpeculumError as exc:
            self.failed.emit(DownloadState.FAILED, str(exc))
        except Exception as exc:  # noqa: BLE001 - shown in the row, never a traceback
            self.failed.emit(DownloadState.FAILED, f"The download failed: {exc}")
        else:
            self.finished.emit(result)


class DownloadRow(QFrame):
    """One download: what, per-file and total bars, speed and ETA, and Cancel / Use; Retry
    once it failed."""

    use_requested = Signal(object)
    retry_requested = Signal()  # the dialog runs the same job again in this row
    settled = Signal()  # finished, failed or cancelled

    def __init__(self, name: str, job: Callable | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.name = name
        self.job = job  # what Retry runs again
        self.setObjectName("downloadRow")
        self.setFrameShape(QFrame.StyledPanel)
        self.title = QLabel(f"<b>{html.escape(name)}</b>")  # a Hub file name, a user's pair name
        self.file_label = plain_label("Asking the Hub…")
        self.file_bar = QProgressBar()
        self.total_bar = QProgressBar()
        for bar in (self.file_bar, self.total_bar):
            bar.setRange(0, SCALE)
            bar.setValue(0)
        self.file_bar.setFormat("file %p%")
        self.total_bar.setFormat("total %p%")
        self.stats = plain_label("")
        self.stats.setObjectName("caption")
        self.cancel_button = QPushButton("Cancel", toolTip="Stop this download; nothing is added to the library")
        self.use_button = QPushButton("Use this pair", toolTip="Load the downloaded pair in the window")
        self.use_button.hide()
        self.retry_button = QPushButton("Retry", objectName="retryButton",
                                        toolTip="Run this download again; what was already downloaded is kept")
        self.retry_button.hide()
        self.retry_button.clicked.connect(self.retry_requested)
        self.cancel_button.clicked.connect(lambda: self.worker is not None and self.worker.cancel.cancel())
        self.result: object = None
        self.use_button.clicked.connect(lambda: self.use_requested.emit(self.result))

        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.use_button)
        top.addWidget(self.retry_button)
        top.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.file_label)
        layout.addWidget(self.file_bar)
        layout.addWidget(self.total_bar)
        layout.addWidget(self.stats)
        self.thread: QThread | None = None
        self.worker: DownloadWorker | None = None
        self.state = DownloadState.RUNNING

    def show_running(self) -> None:
        """A new run (the first, or a Retry): bars from zero, Cancel offered again."""
        self.state = DownloadState.RUNNING
        self.file_label.setText("Asking the Hub…")
        self.file_label.setStyleSheet("")
        for bar in (self.file_bar, self.total_bar):
            bar.setValue(0)
        self.stats.setText("")
        self.retry_button.hide()
        self.cancel_button.show()

    def show_progress(self, p: DownloadProgress) -> None:
        verb = {"checking": "Checking", "verifying": "Verifying", "assembling": "Assembling",
                "done": "Done"}.get(p.phase, "Downloading")
        self.file_label.setText(f"{verb} {p.file} ({p.file_index} of {p.file_count})")
        self.file_bar.setValue(int(SCALE * p.file_fraction))
        self.total_bar.setValue(int(SCALE * p.fraction))
        speed = f"{human_bytes(p.speed)}/s" if p.speed else "–"
        self.stats.setText(f"{human_bytes(p.done)} of {human_bytes(p.total)} · {speed} · "
                           f"{human_time(p.eta)} left")

    def show_done(self, result: object) -> None:
        self.state = DownloadState.DONE
        self.result = result
        self.file_bar.setValue(SCALE)
        self.total_bar.setValue(SCALE)
        self.file_label.setText("Done: verified and added to the library.")
        self.cancel_button.hide()
        if isinstance(result, LibraryPair):
            self.use_button.show()
        self.settled.emit()

    def show_failed(self, state: DownloadState, message: str) -> None:
        """The job ended without a result: ``state`` says how (its own exception's kind)."""
        self.state = state
        self.file_label.setText(ENDED.get(state, message))
        self.file_label.setWordWrap(True)
        self.file_label.setStyleSheet("color: #b42318;" if state is DownloadState.FAILED else "")
        self.cancel_button.hide()
        self.retry_button.setVisible(state is DownloadState.FAILED and self.job is not None)
        self.settled.emit()


def running_downloads(rows: list[DownloadRow]) -> list[DownloadRow]:
    return [r for r in rows if r.thread is not None and r.thread.isRunning()]


def leave_running(rows: list[DownloadRow]) -> None:
    """Closing keeps unfinished downloads as partial files: the next download resumes them.
    Wait a bounded time for them to stop; one blocked on the network is left to end in the
    background, cut off from the closing dialog's widgets."""
    for row in running_downloads(rows):
        row.worker.cancel.pause()
    deadline = QDeadlineTimer(CLOSE_WAIT_MS)
    for row in rows:
        if row.thread is not None:
            row.thread.quit()
            row.thread.wait(deadline)
    _finishing[:] = [(t, w) for t, w in _finishing if not t.isFinished()]
    for row in rows:
        thread, worker = row.thread, row.worker
        if thread is None or thread.isFinished():
            continue
        for signal in (worker.progress, worker.finished, worker.failed):
            signal.disconnect()
        worker.finished.connect(thread.quit)
        worker.failed.connect(thread.quit)
        thread.setParent(None)  # a QThread deleted while it runs aborts the process
        if not _finishing and QCoreApplication.instance() is not None:
            QCoreApplication.instance().aboutToQuit.connect(_wait_for_finishing, Qt.UniqueConnection)
        _finishing.append((thread, worker))
        row.thread = row.worker = None
