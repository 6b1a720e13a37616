"""The Downloads tab: a Hugging Face repo to browse, the hub token, and a row per download.

Progress arrives on the download manager's worker threads and is re-emitted as a queued Qt
signal, so only the UI thread touches a widget; a slow timer redraws running rows as well,
because a stalled transfer reports nothing and its speed and ETA would otherwise stay stale.
A mixin of `ModelsDialog`: it owns the rows (`rows`, `download_rows()`) and the repo bar.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from PySide6.QtCore import QThreadPool
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.models import secrets
from app.models.downloads import Progress, RepoListing, list_repo
from app.models.library import LibraryError
from app.ui.a11y import described
from app.ui.models.download_row import DownloadRow
from app.ui.models.widgets import EmptyState, confirm, tab_page
from app.ui.models.words import EMPTY_DOWNLOADS
from app.units import decimal_bytes


class DownloadsTab:
    """The Downloads tab's widgets and actions (see the module's docstring)."""

    def _build_downloads(self) -> QWidget:
        page, column = tab_page(self, 10)
        source = QHBoxLayout()
        self.repo_edit = QLineEdit(page)
        self.repo_edit.setPlaceholderText("Hugging Face repo, e.g. unsloth/Qwen3-8B-GGUF")
        described(self.repo_edit, "Hugging Face repo", "owner/name of a model repo on the hub")
        self.browse_button = QPushButton("Browse", page)
        described(self.browse_button, "Browse the repo", "List the repo's models with their sizes")
        self.group_combo = QComboBox(page)
        self.group_combo.setMinimumWidth(220)
        self.group_combo.setPlaceholderText("Browse a repo first")
        described(
            self.group_combo, "Model to download", "A quantization (all parts of a split set)"
        )
        self.repo_download_button = QPushButton("Download", page)
        self.repo_download_button.setObjectName("primary")
        described(self.repo_download_button, "Download from the repo", "Download the chosen model")
        self.token_button = QPushButton("Token…", page)
        described(
            self.token_button,
            "Hugging Face token",
            "For gated or private repos: kept in the system keychain, never in a file",
        )
        source.addWidget(self.repo_edit, 1)
        source.addWidget(self.browse_button)
        source.addWidget(self.group_combo)
        source.addWidget(self.repo_download_button)
        source.addWidget(self.token_button)
        column.addLayout(source)
        self.repo_download_button.setEnabled(False)
        self.group_combo.setEnabled(False)

        self.downloads_stack = QStackedWidget(page)
        scroll = QScrollArea(page)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setAccessibleName("Downloads")
        body = QWidget(scroll)
        body.setObjectName("scroll-body")
        self.rows_layout = QVBoxLayout(body)
        self.rows_layout.setContentsMargins(0, 0, 4, 0)
        self.rows_layout.setSpacing(10)
        self.rows_layout.addStretch(1)
        scroll.setWidget(body)
        self.downloads_empty = EmptyState(
            "⇣",
            EMPTY_DOWNLOADS,
            "Downloads resume where they stopped, even after Stoke restarts, and every file is "
            "checked against the hub's SHA-256 before it is used.",
            page,
        )
        self.downloads_empty.setAccessibleName("No downloads")
        self.downloads_empty.finish()
        self.downloads_stack.addWidget(scroll)
        self.downloads_stack.addWidget(self.downloads_empty)
        column.addWidget(self.downloads_stack, 1)

        self.repo_edit.returnPressed.connect(self._browse_repo)
        self.repo_edit.textChanged.connect(self._repo_edited)
        self.browse_button.clicked.connect(self._browse_repo)
        self.repo_download_button.clicked.connect(self._download_from_repo)
        self.token_button.clicked.connect(self._set_token)
        return page

    def start_download(
        self,
        repo: str,
        files: Sequence[str] | None = None,
        *,
        quant: str | None = None,
        title: str | None = None,
    ) -> DownloadRow:
        """Start a download in the background and show its row on the Downloads tab."""
        label = title or (
            f"{repo} · {quant}"
            if quant
            else f"{repo} · {files[0]}"
            if files and len(files) == 1
            else repo
        )
        row = DownloadRow(label, self)
        row.repo = repo
        self._add_row(row)
        self.tabs.setCurrentWidget(self.downloads_tab)
        manager = self.downloads
        wanted = list(files) if files else None

        def begin() -> None:
            row.job_id = None
            row.error.hide()
            row.show_starting()
            self._run(
                QThreadPool.globalInstance(),
                lambda: manager.start(repo, wanted, quant=quant),
                lambda job_id: self._download_started(row, job_id, label),
                lambda message: self._download_refused(row, message),
            )
            self._update_catalog_buttons()

        row.retry = begin
        row.resume_button.clicked.connect(lambda: self._resume(row))
        row.pause_button.clicked.connect(lambda: self._pause(row))
        row.cancel_button.clicked.connect(lambda: self._cancel(row))
        begin()
        return row

    def _download_started(self, row: DownloadRow, job_id: str, title: str) -> None:
        self._titles[job_id] = title
        existing = self.rows.get(job_id)
        if existing is not None and existing is not row:  # its progress came first
            existing.title.setText(title)
            self._remove_row(row)
            row = existing
        row.job_id = job_id
        row.retry = None
        self.rows[job_id] = row
        with contextlib.suppress(LibraryError):
            self._apply_progress(self.downloads.progress(job_id))

    def _download_refused(self, row: DownloadRow, message: str) -> None:
        row.show_start_failed(message)
        self._update_downloads_view()
        self._update_catalog_buttons()

    def _row_for(self, job_id: str, repo: str) -> DownloadRow:
        row = self.rows.get(job_id)
        if row is None:  # a start still waiting for its answer adopts its own progress
            row = next(
                (r for r in self.download_rows() if r.job_id is None and r.repo == repo), None
            )
            if row is not None:
                row.job_id = job_id
                self.rows[job_id] = row
                return row
        if row is None:
            row = DownloadRow(self._titles.get(job_id, repo), self)
            row.job_id = job_id
            row.resume_button.clicked.connect(lambda: self._resume(row))
            row.pause_button.clicked.connect(lambda: self._pause(row))
            row.cancel_button.clicked.connect(lambda: self._cancel(row))
            self.rows[job_id] = row
            self._add_row(row)
        return row

    def _add_row(self, row: DownloadRow) -> None:
        self.rows_layout.insertWidget(0, row)
        self._update_downloads_view()

    def _remove_row(self, row: DownloadRow) -> None:
        for key, value in list(self.rows.items()):
            if value is row:
                del self.rows[key]
        self.rows_layout.removeWidget(row)
        row.deleteLater()
        self._update_downloads_view()

    def download_rows(self) -> list[DownloadRow]:
        """The rows on screen, newest first."""
        found = []
        for i in range(self.rows_layout.count()):
            widget = self.rows_layout.itemAt(i).widget()
            if isinstance(widget, DownloadRow):
                found.append(widget)
        return found

    def _update_downloads_view(self) -> None:
        rows = self.download_rows()
        self.downloads_stack.setCurrentIndex(0 if rows else 1)
        running = sum(r.state in ("running", "starting") for r in rows)
        index = self.tabs.indexOf(self.downloads_tab)
        self.tabs.setTabText(index, f"Downloads ({running})" if running else "Downloads")

    def _forward_progress(self, progress: Progress) -> None:
        """Called on a download worker thread: hand over to the UI thread, touch nothing."""
        with contextlib.suppress(RuntimeError):  # the dialog was deleted
            self._progress.emit(progress)
        previous = self._previous_progress
        if previous is not None:
            previous(progress)

    def _apply_progress(self, progress: Progress) -> None:
        if progress.state == "cancelled":
            row = self.rows.get(progress.id)
            if row is not None:
                self._remove_row(row)
            self._update_catalog_buttons()
            return
        row = self._row_for(progress.id, progress.repo)
        row.show_progress(progress)
        if progress.state == "done" and progress.id not in self._done_seen:
            self._done_seen.add(progress.id)
            title = self._titles.get(progress.id, progress.repo)
            self.banner.show_message(
                f"{title} is downloaded and verified: it is in your Library.",
                [("Show in Library", lambda: self._show_download(progress))],
                kind="success",
            )
            self.refresh()
        self._update_downloads_view()
        self._update_catalog_buttons()

    def _show_download(self, progress: Progress) -> None:
        self.tabs.setCurrentWidget(self.library_tab)
        for model in self.models:
            if model.path.is_relative_to(progress.destination):
                self.select_model(model.id)
                return

    def _redraw_running(self) -> None:
        for job_id, row in list(self.rows.items()):
            if row.state not in ("running", "paused"):
                continue
            try:
                self._apply_progress(self.downloads.progress(job_id))
            except LibraryError:  # forgotten by the manager (cancelled elsewhere)
                self._remove_row(row)

    def _pause(self, row: DownloadRow) -> None:
        if row.job_id is not None:
            self._control(row, self.downloads.pause)

    def _resume(self, row: DownloadRow) -> None:
        if row.job_id is None:
            if row.retry is not None:
                row.retry()
            return
        self._control(row, self.downloads.resume)

    def _cancel(self, row: DownloadRow) -> None:
        if row.job_id is None:  # a start that failed: nothing on disk
            self._remove_row(row)
            return
        if row.state != "done" and not confirm(
            self,
            "Cancel download",
            f"Cancel the download of {row.title.text()}?\n\n"
            "The part downloaded so far is deleted; Pause keeps it.",
            "Cancel Download",
            "Keep Downloading",
        ):
            return
        self._control(row, self.downloads.cancel)

    def _control(self, row: DownloadRow, action: Callable[[str], None]) -> None:
        job_id = row.job_id
        assert job_id is not None
        try:
            action(job_id)
        except LibraryError as exc:
            row.error.setText(str(exc))
            row.error.show()
            return
        try:
            self._apply_progress(self.downloads.progress(job_id))
        except LibraryError:
            self._remove_row(row)

    def _repo_edited(self) -> None:
        self.group_combo.clear()
        self.group_combo.setEnabled(False)
        self.repo_download_button.setEnabled(False)

    def _browse_repo(self) -> None:
        repo = self.repo_edit.text().strip().strip("/")
        if repo.startswith(("http://", "https://")):
            repo = "/".join(repo.split("/")[3:5])
        if repo.count("/") != 1:
            self.show_error("Enter a repo as owner/name, for example unsloth/Qwen3-8B-GGUF.")
            return
        self.browse_button.setEnabled(False)
        self.browse_button.setText("Browsing…")

        def listed(listing: RepoListing) -> None:
            self._browse_done()
            self.group_combo.clear()
            for group in listing.groups:
                parts = f", {len(group.files)} parts" if len(group.files) > 1 else ""
                self.group_combo.addItem(
                    f"{group.key} · {decimal_bytes(group.size)}{parts}", (listing.repo, group.key)
                )
            if not listing.groups:
                self.show_error(f"{listing.repo} has no GGUF or MLX model to download.")
                return
            self.banner.hide()
            self.group_combo.setEnabled(True)
            self.repo_download_button.setEnabled(True)
            self.group_combo.setFocus()

        def failed(message: str) -> None:
            self._browse_done()
            self.show_error(message)

        self._run(QThreadPool.globalInstance(), lambda: list_repo(repo), listed, failed)

    def _browse_done(self) -> None:
        self.browse_button.setEnabled(True)
        self.browse_button.setText("Browse")

    def _download_from_repo(self) -> None:
        data = self.group_combo.currentData()
        if data:
            repo, key = data
            self.start_download(repo, quant=key)

    def _set_token(self) -> None:
        token, ok = QInputDialog.getText(
            self,
            "Hugging Face token",
            "An access token from huggingface.co/settings/tokens, for gated and private repos.\n"
            "Stoke keeps it in the system keychain, never in a file.",
            QLineEdit.EchoMode.Password,
        )
        if not ok or not token.strip():
            return
        try:
            where = secrets.set_token(token)
        except (ValueError, OSError) as exc:
            self.show_error(f"The token was not saved: {exc}")
            return
        self.banner.show_message(where, kind="info")
