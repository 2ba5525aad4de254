"""The Models dialog: the catalog with fit marks, the local library, and downloads.

Self-contained: it reads the catalog and the library itself and runs every download
(and the remote compatibility check before one) on a worker QThread. When the user
picks a pair it emits ``pair_ready(target_path, draft_path)``; the main window loads it. A
target that drafts with its own MTP head (a catalog entry whose draft is "mtp") shows
"Built-in (MTP)" as its draft and is emitted with the pair picker's Built-in (MTP) choice.
"""

from __future__ import annotations

import html
import shutil
from pathlib import Path
from typing import Callable

from PySide6.QtCore import Qt, QThread, QUrl, Signal
from PySide6.QtGui import QBrush, QColor, QDesktopServices, QFont
from PySide6.QtWidgets import (
    QAbstractItemView, QComboBox, QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout, QHeaderView, QLabel,
    QPushButton, QScrollArea, QTableWidget, QTableWidgetItem, QTabWidget, QVBoxLayout, QWidget,
)

from ...errors import SpeculumError
from ...models import catalog as catalog_mod
from ...models import hardware
from ...models.catalog import CatalogPair
from ...models.commands import human_bytes
from ...models.download import staged_bytes
from ...models.hardware import Fit, Machine, PlainSpeed
from ...models.library import IncompatiblePair, Library, LibraryPair, LocalModel, bundled_available
from .downloadrow import DownloadRow, DownloadState, DownloadWorker, leave_running, running_downloads
from .hubpair import HubPairDialog
from ..look import BUILT_IN, BUILT_IN_MTP
from ..chat.richtext import ask, escaped_tooltip, plain_label, warn
from ..settings import Settings

NOT_MEASURED = ("Not measured yet: once a model has written an answer here, Speculum knows this machine's "
                "plain speed and estimates each pair's from it.")
FIT_COLOURS = {Fit.FITS: "#1a7f37", Fit.TIGHT: "#b26a00", Fit.TOO_BIG: "#b42318"}


class ModelsDialog(QDialog):
    pair_ready = Signal(str, str)  # target path, draft path (modelbar.BUILT_IN: the target's own MTP head)

    CATALOG_COLUMNS = ["", "Pair", "Good at", "Download", "Memory", "This machine", "Status", "Speed here"]
    LIBRARY_COLUMNS = ["Name", "Kind", "Size", "Files"]

    def __init__(self, parent: QWidget | None = None, *, library: Library | None = None,
                 machine: Machine | None = None, pairs: list[CatalogPair] | None = None,
                 disk_usage=shutil.disk_usage, on_pair_ready: Callable[[str, str], None] | None = None,
                 plain_rates: dict[str, float] | None = None):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.setObjectName("modelsDialog")
        self.pairs = pairs if pairs is not None else catalog_mod.load()
        self.library = library or Library(pairs=self.pairs)
        self.machine = machine or hardware.detect()
        # This machine's measured plain speed (the window keeps it per model file), if any yet.
        self.speed = PlainSpeed.from_measurements(Settings.load().plain_tokens_per_s if plain_rates is None
                                                  else plain_rates)
        self.disk_usage = disk_usage
        self.rows: list[DownloadRow] = []
        self.offline_demo = bundled_available()  # looked up once: it probes ~30 packages
        if on_pair_ready:
            self.pair_ready.connect(on_pair_ready)

        self.machine_label = QLabel()
        self.machine_label.setWordWrap(True)
        self.tabs = QTabWidget()
        self.tabs.addTab(self._build_catalog(), "Catalog")
        self.tabs.addTab(self._build_library(), "On this computer")
        self.tabs.addTab(self._build_downloads(), "Downloads")
        close = QDialogButtonBox(QDialogButtonBox.Close)
        close.button(QDialogButtonBox.Close).setToolTip("Close; unfinished downloads are kept and resume next time")
        close.rejected.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.addWidget(self.machine_label)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(close)
        self.resize(980, 560)
        self.refresh()

    # ---- catalog ---------------------------------------------------------------------------

    def _build_catalog(self) -> QWidget:
        page = QWidget()
        self.use_filter = QComboBox()
        self.use_filter.addItems(["anything", "code", "chat", "documents"])
        self.use_filter.currentIndexChanged.connect(self.refresh)
        self.catalog_table = _table(self.CATALOG_COLUMNS)
        self.catalog_table.itemSelectionChanged.connect(self._catalog_selection)
        self.catalog_table.itemDoubleClicked.connect(lambda _item: self._catalog_action())
        self.pair_summary = plain_label()
        self.pair_summary.setWordWrap(True)
        self.pair_summary.setObjectName("caption")
        self.download_button = QPushButton("Download", toolTip="Download the selected pair into the library")
        self.download_button.clicked.connect(self._catalog_action)
        self.use_catalog_button = QPushButton("Use this pair", toolTip="Load the selected pair in the window")
        self.use_catalog_button.clicked.connect(self._use_selected_catalog_pair)

        top = QHBoxLayout()
        top.addWidget(QLabel("Recommend a pair for"))
        top.addWidget(self.use_filter)
        top.addStretch(1)
        top.addWidget(QLabel("✓ fits   ~ tight (runs, slower)   ✗ too big   ★ recommended"))
        buttons = QHBoxLayout()
        buttons.addWidget(self.pair_summary, 1)
        buttons.addWidget(self.use_catalog_button)
        buttons.addWidget(self.download_button)
        layout = QVBoxLayout(page)
        layout.addLayout(top)
        layout.addWidget(self.catalog_table, 1)
        layout.addLayout(buttons)
        return page

    def recommendation(self) -> hardware.Recommendation | None:
        use = self.use_filter.currentText()
        return hardware.recommendation(self.pairs, self.machine, None if use == "anything" else use, self.speed)

    def recommended(self) -> CatalogPair | None:
        found = self.recommendation()
        return found.pair if found else None

    def _fill_catalog(self) -> None:
        found = self.recommendation()
        best = found.pair if found else None
        installed = {p.catalog_id for p in self.library.pairs()}
        running = {r.name for r in self.rows if r.state is DownloadState.RUNNING}
        bundled_ok = self.offline_demo
        table = self.catalog_table
        selected = self._selected_catalog_pair()
        table.setRowCount(len(self.pairs))
        for row, pair in enumerate(self.pairs):
            fit = hardware.fit(pair, self.machine)
            star = "★" if best and pair.id == best.id else ""
            if pair.id in installed:
                status = "installed"
            elif pair.name in running:
                status = "downloading…"
            elif pair.offline and bundled_ok:
                status = "installs offline"
            else:
                status = ""
            speed = expected_speed(self.speed.expected(pair)) if self.speed else "—"
            cells = [star, pair.name, ", ".join(pair.good_at), human_bytes(pair.download_size),
                     f"{pair.memory_gb:.1f} GB", f"{fit.mark} {fit.value}", status, speed]
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setData(Qt.UserRole, pair.id)
                if col in (3, 4):
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if col == 5:
                    item.setForeground(QBrush(QColor(FIT_COLOURS[fit])))
                if star:
                    font = QFont(item.font())
                    font.setBold(True)
                    item.setFont(font)
                    item.setToolTip(escaped_tooltip(f"Recommended for this machine: {found.rule}."))
                if col == 4 and pair.memory_note:
                    item.setToolTip(escaped_tooltip(pair.memory_note))  # how an estimate was made
                if col == 7:
                    item.setToolTip(escaped_tooltip(self.speed.basis(pair) if self.speed else NOT_MEASURED))
                table.setItem(row, col, item)
        table.resizeColumnsToContents()
        table.horizontalHeader().setSectionResizeMode(1, QHeaderView.Stretch)
        if selected:
            self._select_catalog_pair(selected.id)
        elif best:
            self._select_catalog_pair(best.id)
        self._catalog_selection()

    def _select_catalog_pair(self, pair_id: str) -> None:
        for row in range(self.catalog_table.rowCount()):
            if self.catalog_table.item(row, 1).data(Qt.UserRole) == pair_id:
                self.catalog_table.selectRow(row)
                return

    def _selected_catalog_pair(self) -> CatalogPair | None:
        rows = self.catalog_table.selectionModel().selectedRows() if self.catalog_table.selectionModel() else []
        if not rows:
            return None
        pair_id = self.catalog_table.item(rows[0].row(), 1).data(Qt.UserRole)
        return next((p for p in self.pairs if p.id == pair_id), None)

    def _catalog_selection(self) -> None:
        pair = self._selected_catalog_pair()
        installed = self.library.installed(pair) if pair else None
        busy = pair is not None and any(r.name == pair.name and r.state is DownloadState.RUNNING for r in self.rows)
        self.download_button.setEnabled(pair is not None and installed is None and not busy)
        self.use_catalog_button.setEnabled(installed is not None)
        if pair is None:
            self.pair_summary.setText("")
            return
        files = sum(len(m.files) for m in pair.models)
        self.download_button.setText("Install (offline)" if pair.offline and self.offline_demo else "Download")
        draft = (f"draft {BUILT_IN_MTP}: its own NextN layers, no draft file" if pair.mtp
                 else f"draft {pair.draft.name} ({pair.draft.quantization})")
        self.pair_summary.setText(f"{pair.summary} Target {pair.target.name} ({pair.target.quantization}), "
                                  f"{draft}; {files} file{'s' * (files > 1)}.")

    def _catalog_action(self) -> None:
        pair = self._selected_catalog_pair()
        if pair is None:
            return
        if self.library.installed(pair):
            self._use_selected_catalog_pair()
            return
        if hardware.fit(pair, self.machine) is Fit.TOO_BIG:
            if not ask(self, "Too big for this machine",
                       f"{pair.name} needs about {pair.memory_gb:.1f} GB of memory; this machine has "
                       f"{self.machine.describe()}. Download it anyway?"):
                return
        self.download_pair(pair)

    def _use_selected_catalog_pair(self) -> None:
        pair = self._selected_catalog_pair()
        installed = self.library.installed(pair) if pair else None
        if installed:
            self.use(installed)

    # ---- library ---------------------------------------------------------------------------

    def _build_library(self) -> QWidget:
        page = QWidget()
        self.library_table = _table(self.LIBRARY_COLUMNS)
        self.library_table.itemSelectionChanged.connect(self._library_selection)
        self.library_table.itemDoubleClicked.connect(lambda _item: self._use_selected_library_pair())
        self.disk_label = plain_label()
        self.disk_label.setObjectName("caption")
        self.use_library_button = QPushButton("Use this pair", toolTip="Load the selected pair in the window")
        self.use_library_button.clicked.connect(self._use_selected_library_pair)
        self.delete_button = QPushButton("Delete…", toolTip="Delete the selected files from the library (asks first)")
        self.delete_button.clicked.connect(self._delete_selected)
        self.reveal_button = QPushButton("Show in folder", toolTip="Open the folder that holds the selected files")
        self.reveal_button.clicked.connect(self._reveal_selected)
        self.add_files_button = QPushButton("Add two files…",
                                            toolTip="Pick a target and a draft GGUF on this computer; checked to be a pair")
        self.add_files_button.clicked.connect(self._add_local_pair)
        self.add_hub_button = QPushButton("Add from the Hub…",
                                          toolTip="Name a target and a draft on the Hugging Face Hub to download")
        self.add_hub_button.clicked.connect(self._add_from_hub)
        buttons = QHBoxLayout()
        for b in (self.use_library_button, self.delete_button, self.reveal_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.add_files_button)
        buttons.addWidget(self.add_hub_button)
        layout = QVBoxLayout(page)
        layout.addWidget(self.library_table, 1)
        layout.addWidget(self.disk_label)
        layout.addLayout(buttons)
        return page

    def _fill_library(self) -> None:
        entries: list[tuple[str, str, int, str, str, object]] = []
        for pair in self.library.pairs():
            own = "" if all(m.in_library for m in pair.models) else " (your files)"
            draft_name, draft_where = ((BUILT_IN_MTP, BUILT_IN_MTP) if pair.mtp
                                       else (pair.draft.path.name, str(pair.draft.path)))
            entries.append((pair.name, "pair" + own, pair.size, f"{pair.target.path.name}  +  {draft_name}",
                            f"target: {pair.target.path}\ndraft: {draft_where}", pair))
        for model in self.library.singles():
            shards = f" ({len(model.files)} shards)" if len(model.files) > 1 else ""
            entries.append((model.name, "model" + ("" if model.in_library else " (your file)"), model.size,
                            model.path.name + shards, str(model.path), model))
        table = self.library_table
        table.setRowCount(len(entries))
        self._library_entries = [e[-1] for e in entries]
        for row, (name, kind, size, files, where, _obj) in enumerate(entries):
            for col, text in enumerate((name, kind, human_bytes(size), files)):
                item = QTableWidgetItem(text)
                item.setToolTip(escaped_tooltip(where))  # file paths, shown literally
                if col == 2:
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                table.setItem(row, col, item)
        table.resizeColumnsToContents()
        table.horizontalHeader().setSectionResizeMode(3, QHeaderView.Stretch)
        partial = staged_bytes(self.library.root)
        extra = f", of which {human_bytes(partial)} are unfinished downloads" if partial else ""
        free = self.disk_usage(self.library.root if self.library.root.exists() else Path.home()).free
        self.disk_label.setText(f"Models use {human_bytes(self.library.disk_use())} in {self.library.root}"
                                f"{extra}; {human_bytes(free)} free on that disk.")
        if not entries:
            self.disk_label.setText(self.disk_label.text() + "  Nothing here yet: download a pair from the "
                                    "catalog, or add your own files.")
        self._library_selection()

    def _selected_library_entry(self) -> LibraryPair | LocalModel | None:
        model = self.library_table.selectionModel()
        rows = model.selectedRows() if model else []
        return self._library_entries[rows[0].row()] if rows else None

    def _library_selection(self) -> None:
        entry = self._selected_library_entry()
        self.use_library_button.setEnabled(isinstance(entry, LibraryPair))
        self.delete_button.setEnabled(entry is not None)
        self.reveal_button.setEnabled(entry is not None)

    def _use_selected_library_pair(self) -> None:
        entry = self._selected_library_entry()
        if isinstance(entry, LibraryPair):
            self.use(entry)

    def _delete_selected(self) -> None:
        entry = self._selected_library_entry()
        if entry is None:
            return
        key = entry.id if isinstance(entry, LibraryPair) else str(entry.path)
        models = entry.models if isinstance(entry, LibraryPair) else (entry,)
        ours = [m for m in models if m.in_library]
        what = (f"This deletes {human_bytes(sum(m.size for m in ours))} of model files."
                if ours else "Your own files stay where they are; the library only forgets them.")
        if not ask(self, "Delete from the library", f"Remove {entry.name}? {what}"):
            return
        try:
            self.library.remove(key)
        except SpeculumError as exc:
            warn(self, "Cannot delete", str(exc))
        self.refresh()

    def _reveal_selected(self) -> None:
        entry = self._selected_library_entry()
        if entry is None:
            return
        path = entry.target.path if isinstance(entry, LibraryPair) else entry.path
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(path.parent)))

    def _add_local_pair(self) -> None:
        target, _ = QFileDialog.getOpenFileName(self, "Target model (the large one)", str(Path.home()),
                                                "GGUF models (*.gguf)")
        if not target:
            return
        draft, _ = QFileDialog.getOpenFileName(self, "Draft model (the small one)", str(Path(target).parent),
                                               "GGUF models (*.gguf)")
        if not draft:
            return
        try:
            pair = self.library.add_pair(target, draft)
        except IncompatiblePair as exc:
            warn(self, "These models cannot form a pair", exc.compatibility.reason)
            return
        except SpeculumError as exc:
            warn(self, "Cannot add the pair", str(exc))
            return
        self.refresh()
        self._select_library(pair.id)

    def _add_from_hub(self) -> None:
        ask = HubPairDialog(self)
        if ask.exec() != QDialog.Accepted:
            return
        try:
            target, draft = ask.refs()
        except SpeculumError as exc:
            warn(self, "Not a Hub file", str(exc))
            return
        name = ask.name.text().strip() or None
        title = name or (f"{target.filename} + {draft.filename}" if draft else target.filename)
        self.start(title, lambda progress, cancel: self.library.add_from_hub(
            target, draft, name, progress=progress, cancel=cancel, disk_usage=self.disk_usage))

    def _select_library(self, pair_id: str) -> None:
        self.tabs.setCurrentIndex(1)
        for row, entry in enumerate(self._library_entries):
            if isinstance(entry, LibraryPair) and entry.id == pair_id:
                self.library_table.selectRow(row)

    # ---- downloads -------------------------------------------------------------------------

    def _build_downloads(self) -> QWidget:
        page = QWidget()
        self.downloads_box = QVBoxLayout()
        self.downloads_box.addStretch(1)
        inner = QWidget()
        inner.setLayout(self.downloads_box)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(inner)
        self.no_downloads = QLabel("No downloads yet. A download resumes where it stopped if the connection "
                                   "drops or this window is closed (start it again); each file is checked "
                                   "against the Hub's sha256 before it joins the library.")
        self.no_downloads.setWordWrap(True)
        self.no_downloads.setObjectName("caption")
        layout = QVBoxLayout(page)
        layout.addWidget(self.no_downloads)
        layout.addWidget(scroll, 1)
        return page

    def download_pair(self, pair: CatalogPair) -> DownloadRow:
        return self.start(pair.name, lambda progress, cancel: self.library.install(
            pair, progress=progress, cancel=cancel, disk_usage=self.disk_usage))

    def start(self, title: str, job) -> DownloadRow:
        row = DownloadRow(title, job)
        self.rows.append(row)
        self.downloads_box.insertWidget(self.downloads_box.count() - 1, row)
        self.no_downloads.hide()
        row.settled.connect(self.refresh)
        row.use_requested.connect(self.use)
        row.retry_requested.connect(lambda: self._run(row))
        self._run(row)
        return row

    def _run(self, row: DownloadRow) -> None:
        """Run the row's job on a thread of its own (again, for Retry: the files already
        verified are kept, a partial one resumes)."""
        row.show_running()
        thread = QThread(self)
        worker = DownloadWorker(row.job)
        worker.moveToThread(thread)
        row.thread, row.worker = thread, worker
        thread.started.connect(worker.run)
        # slots of objects living in the GUI thread, so Qt queues the worker's signals to it
        worker.progress.connect(row.show_progress)
        worker.finished.connect(row.show_done)
        worker.failed.connect(row.show_failed)
        worker.finished.connect(thread.quit)
        worker.failed.connect(thread.quit)
        thread.start()
        self.tabs.setCurrentIndex(2)
        self._fill_catalog()

    # ---- common ----------------------------------------------------------------------------

    def use(self, pair: LibraryPair) -> None:
        self.pair_ready.emit(str(pair.target.path), BUILT_IN if pair.mtp else str(pair.draft.path))
        self.accept()

    def refresh(self) -> None:
        found = self.recommendation()
        pick = (f" Recommended: <b>{html.escape(found.pair.name)}</b> ({found.pair.memory_gb:.1f} GB), "
                f"{html.escape(found.rule)}." if found else "")
        self.machine_label.setText(f"This machine: {html.escape(self.machine.describe())}.{pick}")
        self._fill_catalog()
        self._fill_library()

    def running(self) -> list[DownloadRow]:
        return running_downloads(self.rows)

    def done(self, result: int) -> None:
        leave_running(self.rows)  # unfinished downloads stay as partial files, resumed next time
        super().done(result)


def expected_speed(tokens_per_s: float) -> str:
    """An estimate of tok/s as the catalog shows it: a 70B on a laptop is "< 1", never "~0"."""
    return "< 1 tok/s" if tokens_per_s < 1 else f"~{tokens_per_s:.0f} tok/s"


def _table(columns: list[str]) -> QTableWidget:
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(columns)
    table.setSelectionBehavior(QAbstractItemView.SelectRows)
    table.setSelectionMode(QAbstractItemView.SingleSelection)
    table.setEditTriggers(QAbstractItemView.NoEditTriggers)
    table.verticalHeader().setVisible(False)
    table.setAlternatingRowColors(True)
    table.setShowGrid(False)
    return table
