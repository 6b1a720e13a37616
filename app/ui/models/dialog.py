"""File > Models…: the Library, Downloads, Catalog and Search tabs in one dialog, and its
lifetime.

Nothing slow runs on the UI thread: scanning, importing, asking the hub and detecting the GPUs
run on pool threads through `Background`, and their answers come back on the UI thread. The
dialog runs its own download manager when the app does not lend it one, and stops only that
one when it closes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt, QThreadPool, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QHideEvent, QShowEvent
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTabWidget, QVBoxLayout, QWidget

from app.hardware.detect import Hardware, detect
from app.models.catalog import load_catalog
from app.models.downloads import Downloads, Progress
from app.models.library import Library, ModelEntry
from app.ui import theme
from app.ui.background import Background
from app.ui.banner import Banner
from app.ui.fit import fit_to_screen
from app.ui.models.catalog_tab import CatalogTab
from app.ui.models.download_row import DownloadRow
from app.ui.models.downloads_tab import DownloadsTab
from app.ui.models.library_tab import LibraryTab, library_pool
from app.ui.models.search_tab import HubSearch
from app.ui.models.words import library_error_words

REDRAW_MS = 1000


class ModelsDialog(LibraryTab, DownloadsTab, CatalogTab, QDialog):
    """File > Models…: the models on disk, the downloads, and recommended models."""

    load_requested = Signal(str)  # the model's path (first GGUF part, or the MLX folder)
    plan_requested = Signal(str)
    library_refreshed = Signal()  # the table shows a fresh scan
    _progress = Signal(object)  # a download's Progress, emitted on a worker thread

    def __init__(
        self,
        library: Library,
        downloads: Downloads | None = None,
        hardware: Hardware | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._tasks = Background(self, library_error_words)
        self._progress.connect(self._apply_progress, Qt.ConnectionType.QueuedConnection)
        self.library = library
        self._owns_downloads = downloads is None
        self._stopped = False
        self.downloads = downloads if downloads is not None else self._own_downloads()
        self.hardware = hardware
        self._hardware_problem = ""
        self.catalog = load_catalog()
        self.models: list[ModelEntry] = []
        self._settings: dict[str, dict[str, Any] | None] = {}
        self._loaded_path: str | None = None
        self._select_after: str | None = None
        self._problems: list[str] = []
        self._scan_queued = False
        self._busy: list[str] = []
        self._previous_progress: Callable[[Progress], None] | None = None
        self._listening = False
        self._shown_once = False
        self.rows: dict[str, DownloadRow] = {}
        self._titles: dict[str, str] = {}
        self._done_seen: set[str] = set()

        self.setWindowTitle("Models")
        self.setAccessibleName("Models")
        self.setStyleSheet(theme.stylesheet("models.qss"))
        self.resize(1120, 700)
        fit_to_screen(self)
        column = QVBoxLayout(self)
        column.setContentsMargins(16, 14, 16, 14)
        column.setSpacing(10)
        self.banner = Banner(self)
        column.addWidget(self.banner)
        self.tabs = QTabWidget(self)
        self.tabs.setAccessibleName("Models sections")
        self.tabs.setDocumentMode(True)
        self.library_tab = self._build_library()
        self.downloads_tab = self._build_downloads()
        self.catalog_tab = self._build_catalog()
        self.tabs.addTab(self.library_tab, "Library")
        self.tabs.addTab(self.downloads_tab, "Downloads")
        self.tabs.addTab(self.catalog_tab, "Catalog")
        self.search_tab = HubSearch(
            self,
            self._tasks,
            lambda: self.hardware,
            lambda repo, key: self.start_download(repo, quant=key, title=f"{repo} · {key}"),
        )
        self.tabs.addTab(self.search_tab, "Search")
        self.tabs.setTabToolTip(3, "Find GGUF and MLX models on Hugging Face")
        self.tabs.setTabToolTip(0, "The models on this computer")
        self.tabs.setTabToolTip(1, "Downloads from Hugging Face, with progress")
        self.tabs.setTabToolTip(2, "Recommended models, with whether each fits this machine")
        column.addWidget(self.tabs, 1)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        close.button(QDialogButtonBox.StandardButton.Close).setAccessibleName("Close")
        close.button(QDialogButtonBox.StandardButton.Close).setToolTip(
            "Close the Models page; running downloads stop and resume the next time it opens"
            if self._owns_downloads
            else "Close the Models page; downloads go on"
        )
        close.rejected.connect(self.reject)
        column.addWidget(close)

        self._redraw = QTimer(self)
        self._redraw.setInterval(REDRAW_MS)
        self._redraw.timeout.connect(self._redraw_running)

        self._show_library([], [])
        self.refresh()
        self._show_downloads()
        if self.hardware is None:
            self._run(QThreadPool.globalInstance(), detect, self._hardware_found, self._no_hardware)
        else:
            self._update_badges()

    def _own_downloads(self) -> Downloads:
        """Without the app's manager the dialog runs its own while it is open, and goes on
        with what was running when it last closed."""
        manager = Downloads()
        self._run(QThreadPool.globalInstance(), manager.resume_pending, lambda _: None)
        return manager

    # -- background tasks --

    def _run(
        self,
        pool: QThreadPool,
        work: Callable[[], object],
        on_done: Callable[[Any], None],
        on_failed: Callable[[str], None] | None = None,
    ) -> None:
        """`work` on `pool`; its answer to `on_done`, its failure in words to `on_failed` (by
        default the banner)."""
        self._tasks.run(pool, work, on_done, on_failed or self.show_error)

    @property
    def busy(self) -> bool:
        """A scan or a library operation of this dialog is still running."""
        return self._scan_queued or bool(self._busy)

    def show_error(self, message: str) -> None:
        self.banner.show_message(message)

    def _library_task(
        self,
        what: str,
        work: Callable[[], object],
        on_done: Callable[[Any], None],
    ) -> None:
        """A library operation on the library's one thread, with the footer saying so."""
        self._busy.append(what)
        self._update_busy()

        def finish(callback: Callable[[Any], None]) -> Callable[[Any], None]:
            def done(result: Any) -> None:
                self._busy.remove(what)
                self._update_busy()
                callback(result)

            return done

        self._run(library_pool(), work, finish(on_done), finish(self.show_error))

    # -- lifetime --

    def _show_downloads(self) -> None:
        for progress in self.downloads.downloads():
            if progress.state == "done":
                self._done_seen.add(progress.id)
            self._row_for(progress.id, progress.repo).show_progress(progress)
        self._update_downloads_view()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self._stopped:  # our own manager stopped when the dialog closed: start again
            self._stopped = False
            self.downloads = self._own_downloads()
            for row in self.download_rows():
                self._remove_row(row)
            self._show_downloads()
        if not self._listening:
            self._previous_progress = self.downloads.on_progress
            self.downloads.on_progress = self._forward_progress
            self._listening = True
        self._redraw.start()
        if self._shown_once:
            self.refresh()
            for progress in self.downloads.downloads():
                self._apply_progress(progress)
        self._shown_once = True

    def hideEvent(self, event: QHideEvent) -> None:
        self._detach()
        super().hideEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:
        self._detach()
        super().closeEvent(event)

    def done(self, result: int) -> None:
        """Closing stops only a manager the dialog made itself (its transfers resume on the
        next open, from the bytes on disk); the app's manager goes on. Its message goes too:
        the next open starts clean, not with news from last time."""
        self._detach()
        self.banner.hide()
        if self._owns_downloads and not self._stopped:
            self._stopped = True
            threading.Thread(
                target=self.downloads.shutdown, name="stoke-downloads-stop", daemon=True
            ).start()
        super().done(result)

    def _detach(self) -> None:
        """Stop listening to the manager; whoever listened before gets its callback back."""
        self._redraw.stop()
        if self._listening and self.downloads.on_progress == self._forward_progress:
            self.downloads.on_progress = self._previous_progress
        self._listening = False
