"""The Search tab: find models on the Hugging Face hub from the Models page.

A search asks the hub for GGUF and MLX repositories (app.models.hub.search_models: the
hub's own search, most downloaded first). Expanding a result lists its files the way a
download takes them, one row per quantization (every part of a split set together) with its
size and its fit on this machine (the catalog's size rule) before a byte is downloaded; each
row's Download goes through the page's own downloads, so it resumes, is verified and lands
in the library like any other. Hub calls run off the UI thread.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QThreadPool
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.hardware.detect import Hardware
from app.models.catalog import DOES_NOT_FIT, size_verdict
from app.models.hub import (
    FileGroup,
    HubModel,
    RepoListing,
    list_repo,
    projector_file,
    search_models,
)
from app.ui.a11y import described
from app.ui.background import Background
from app.ui.models.widgets import download_anyway
from app.ui.models.words import FIT_COLORS, FIT_TIPS, fit_level
from app.units import decimal_bytes

COLUMNS = ("Model", "Format", "Size", "Fit on this machine", "")
READING = "Reading the files…"
HINT = "Search the Hugging Face hub for GGUF and MLX models, most downloaded first."


class HubSearch(QWidget):
    """The Search tab's page (see the module's docstring). The Models page hands it what it
    shares: `tasks` for the hub calls, `hardware` (this machine, None until the page has looked)
    and `download(repo, key)`, which starts one on its Downloads tab."""

    def __init__(
        self,
        parent: QWidget,
        tasks: Background,
        hardware: Callable[[], Hardware | None],
        download: Callable[[str, str], object],
    ) -> None:
        super().__init__(parent)
        self._tasks = tasks
        self._hardware = hardware
        self._download = download
        self.results: list[HubModel] = []
        self._searching: str | None = None  # the words of the search under way
        self.listings: dict[str, RepoListing] = {}
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 10, 0, 0)
        column.setSpacing(10)
        bar = QHBoxLayout()
        self.query = QLineEdit(self)
        self.query.setPlaceholderText("Search Hugging Face, e.g. Qwen3 8B")
        self.query.setClearButtonEnabled(True)
        described(self.query, "Search the hub", "Words in the model's name")
        self.search_button = QPushButton("Search", self)
        self.search_button.setObjectName("primary")
        described(self.search_button, "Search", "Ask the hub for GGUF and MLX models")
        bar.addWidget(self.query, 1)
        bar.addWidget(self.search_button)
        column.addLayout(bar)
        self.status = QLabel(HINT, self)
        self.status.setWordWrap(True)
        self.status.setAccessibleName("Search status")
        column.addWidget(self.status)
        self.tree = QTreeWidget(self)
        self.tree.setAccessibleName("Search results")
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(list(COLUMNS))
        header = self.tree.header()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in range(1, len(COLUMNS)):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(False)
        column.addWidget(self.tree, 1)
        self.query.returnPressed.connect(self.search)
        self.search_button.clicked.connect(self._search_clicked)
        self.tree.itemExpanded.connect(self._expanded)

    # -- searching --

    def _search_clicked(self) -> None:
        if self._searching is None:
            self.search()
        else:
            self.cancel_search()

    def search(self) -> None:
        """Ask the hub; while it answers, the button reads Cancel."""
        words = self.query.text().strip()
        if not words:
            self.status.setText(HINT)
            return
        self._set_searching(words)
        self.status.setText(f"Searching for “{words}”…")
        self._tasks.run(
            QThreadPool.globalInstance(),
            lambda: search_models(words),
            lambda found: self._found(words, found),
            lambda failure: self._search_failed(words, failure),
        )

    def cancel_search(self) -> None:
        """Stop waiting for the hub: its answer, when it comes, is dropped."""
        words = self._searching
        self._set_searching(None)
        self.status.setText(f"Search for “{words}” cancelled.")

    def _set_searching(self, words: str | None) -> None:
        self._searching = words
        self.search_button.setText("Search" if words is None else "Cancel")
        self.search_button.setAccessibleName("Search" if words is None else "Cancel search")

    def _found(self, words: str, found: list[HubModel]) -> None:
        if self._searching != words:  # cancelled, or a newer search is under way
            return
        self._set_searching(None)
        self.results = found
        self.listings.clear()
        self.tree.clear()
        for model in found:
            item = QTreeWidgetItem(
                [model.repo, model.format.upper(), f"{model.downloads:,} downloads", "", ""]
            )
            item.setChildIndicatorPolicy(QTreeWidgetItem.ChildIndicatorPolicy.ShowIndicator)
            item.setToolTip(0, f"{model.repo} · {model.likes:,} likes · expand for its files")
            self.tree.addTopLevelItem(item)
        count = len(found)
        self.status.setText(
            f"{count} model{'s' if count != 1 else ''} for “{words}”, most downloaded first: "
            "expand one for its files."
            if found
            else f"No GGUF or MLX models on the hub match “{words}”."
        )

    def _search_failed(self, words: str, failure: str) -> None:
        if self._searching != words:
            return
        self._set_searching(None)
        self.status.setText(failure)

    # -- a result's files --

    def item_of(self, repo: str) -> QTreeWidgetItem | None:
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            if item.text(0) == repo:
                return item
        return None

    def _expanded(self, item: QTreeWidgetItem) -> None:
        if item.parent() is not None or item.childCount():
            return
        repo = item.text(0)
        item.addChild(QTreeWidgetItem([READING]))
        self._tasks.run(
            QThreadPool.globalInstance(),
            lambda: list_repo(repo),
            self._listed,
            lambda words: self._listing_failed(repo, words),
        )

    def _listed(self, listing: RepoListing) -> None:
        self.listings[listing.repo] = listing
        item = self.item_of(listing.repo)
        if item is None:  # a newer search replaced it
            return
        item.takeChildren()
        groups = [g for g in listing.groups if not g.key.startswith("mmproj")]
        for group in groups:
            self._add_group(item, listing, group)
        if not groups:
            item.addChild(QTreeWidgetItem(["No GGUF or MLX model files in this repo"]))

    def _add_group(self, item: QTreeWidgetItem, listing: RepoListing, group: FileGroup) -> None:
        parts = len(group.files)
        kind = "MLX" if group.key == "mlx" else "GGUF"
        files = f"{parts} files" if kind == "MLX" else (f"{parts} parts" if parts > 1 else "")
        # a GGUF vision model's projector comes with it (Downloads pairs it): say so
        projector = projector_file(listing) if kind == "GGUF" else None
        images = "reads images" if projector is not None else ""
        size = group.size + (projector.size or 0 if projector is not None else 0)
        child = QTreeWidgetItem(
            [group.key, " · ".join(p for p in (kind, files, images) if p), decimal_bytes(size)]
        )
        names = [f.name for f in group.files]
        if projector is not None:
            names.append(f"{projector.name} (its vision projector, downloaded with it)")
        child.setToolTip(0, "\n".join(names))
        hardware = self._hardware()
        verdict = None
        if hardware is not None:
            verdict = size_verdict(size, False, hardware)
            child.setText(3, verdict)
            child.setForeground(3, QColor(FIT_COLORS[fit_level(verdict)]))
            child.setToolTip(3, f"{FIT_TIPS[verdict]} (by size)")
        else:
            child.setText(3, "—")
            child.setToolTip(3, "Stoke has not looked at this machine yet")
        item.addChild(child)
        button = QPushButton("Download", self.tree)
        described(
            button,
            f"Download {group.key}",
            f"Download {decimal_bytes(size)} from {listing.repo} into the library",
        )
        button.clicked.connect(lambda: self._download_clicked(listing.repo, group, verdict))
        self.tree.setItemWidget(child, 4, button)

    def _listing_failed(self, repo: str, words: str) -> None:
        item = self.item_of(repo)
        if item is not None:  # collapsed and empty: expanding it again asks again
            item.takeChildren()
            item.setExpanded(False)
        self.status.setText(words)

    def _download_clicked(self, repo: str, group: FileGroup, verdict: str | None) -> None:
        if verdict != DOES_NOT_FIT or download_anyway(self, f"{repo} · {group.key}", group.size):
            self.download(repo, group.key)

    def download(self, repo: str, key: str) -> None:
        """Download one quantization (or the MLX model) through the Downloads tab."""
        self._download(repo, key)
