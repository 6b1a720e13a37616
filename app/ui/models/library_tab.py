"""The Library tab: the models on disk in a sortable, filterable table, the selected one's
details and saved load settings, and Import, Add Folder, Rescan, Load, Plan and Delete.

Every library operation runs on `library_pool()`, one thread shared by every Models dialog,
so two of them never race on the library's files and closing the dialog does not cut an
import in half. A mixin of `ModelsDialog`: it owns the table, the details pane and the
footer, and reaches the rest of the dialog through `banner`, `tabs`, `_run` and
`_library_task`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QItemSelection, QSize, QSortFilterProxyModel, Qt, QThreadPool
from PySide6.QtGui import (
    QFont,
    QFontDatabase,
    QKeySequence,
    QShortcut,
    QStandardItem,
    QStandardItemModel,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFileDialog,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QStyle,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app import paths
from app.models import load_settings
from app.models.library import ImportMode, LibraryError, ModelEntry, placement
from app.ui.a11y import described
from app.ui.models.import_dialog import ImportDialog
from app.ui.models.widgets import ElidedLabel, EmptyState, confirm, pill, tab_page, text_label
from app.ui.models.words import (
    BUNDLED,
    BUNDLED_TIP,
    COLUMN_TIPS,
    COLUMNS,
    EMPTY_LIBRARY,
    GREEN,
    LINKED,
    describe_settings,
    format_context,
    format_parameters,
    library_footer,
)
from app.units import decimal_bytes

SORT_ROLE = Qt.ItemDataRole.UserRole + 1
ID_ROLE = Qt.ItemDataRole.UserRole + 2
PATH_ROLE = Qt.ItemDataRole.UserRole + 3

_library_pool: QThreadPool | None = None
_library_pool_lock = threading.Lock()


def library_pool() -> QThreadPool:
    """One thread for every library operation of every Models dialog."""
    global _library_pool
    with _library_pool_lock:
        if _library_pool is None:
            _library_pool = QThreadPool()
            _library_pool.setMaxThreadCount(1)
        return _library_pool


class _Header(QHeaderView):
    """Column headers sized to their words, with room for the sort arrow only where it is:
    Qt keeps that room on every column, about 200 px over eight, which pushed Context and
    Size out of sight at the dialog's size."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(Qt.Orientation.Horizontal, parent)
        self.setSectionsClickable(True)

    def sectionSizeFromContents(self, logicalIndex: int) -> QSize:
        size = super().sectionSizeFromContents(logicalIndex)
        if self.isSortIndicatorShown() and logicalIndex != self.sortIndicatorSection():
            arrow = size.height() + self.style().pixelMetric(QStyle.PixelMetric.PM_HeaderMargin)
            size.setWidth(size.width() - arrow)
        return size


class LibraryTab:
    """The Library tab's widgets and actions (see the module's docstring)."""

    def _build_library(self) -> QWidget:
        page, column = tab_page(self, 10)
        toolbar = QHBoxLayout()
        self.filter_edit = QLineEdit(page)
        self.filter_edit.setPlaceholderText("Filter models…")
        self.filter_edit.setClearButtonEnabled(True)
        described(
            self.filter_edit, "Filter models", "Show only models whose details contain this text"
        )
        self.import_button = QPushButton("Import…", page)
        described(
            self.import_button,
            "Import a model",
            "Bring a GGUF file or an MLX folder into the library (copy, move or link)",
        )
        self.add_folder_button = QPushButton("Add Folder…", page)
        described(
            self.add_folder_button,
            "Add a models folder",
            "List the models of another folder too, where they are",
        )
        self.refresh_button = QPushButton("Rescan", page)
        described(
            self.refresh_button, "Rescan the library", "Look for models added or removed on disk"
        )
        toolbar.addWidget(self.filter_edit, 1)
        toolbar.addWidget(self.refresh_button)
        toolbar.addWidget(self.add_folder_button)
        toolbar.addWidget(self.import_button)
        column.addLayout(toolbar)

        self.table_model = QStandardItemModel(0, len(COLUMNS), page)
        self.table_model.setHorizontalHeaderLabels(list(COLUMNS))
        for col, tip in enumerate(COLUMN_TIPS):
            self.table_model.horizontalHeaderItem(col).setToolTip(tip)
        self.proxy = QSortFilterProxyModel(page)
        self.proxy.setSourceModel(self.table_model)
        self.proxy.setSortRole(SORT_ROLE)
        self.proxy.setFilterKeyColumn(-1)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.table = QTableView(page)
        self.table.setHorizontalHeader(_Header(self.table))
        self.table.setModel(self.proxy)
        described(self.table, "Models in the library", "Select a model; double-click to load it")
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.setShowGrid(False)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(30)
        header = self.table.horizontalHeader()
        # The Name column takes the room the others leave (its names elide in the middle), so
        # Context and Size stay in sight at the dialog's size instead of behind a scroll bar.
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in range(1, len(COLUMNS)):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setHighlightSections(False)
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)

        self.details = self._build_details(page)
        self.splitter = QSplitter(Qt.Orientation.Horizontal, page)
        self.splitter.addWidget(self.table)
        self.splitter.addWidget(self.details)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setSizes([780, 300])  # the details at their narrowest: the table's room
        self.splitter.setChildrenCollapsible(False)

        self.library_empty = EmptyState(
            "▤",
            EMPTY_LIBRARY,
            f"Models live in {paths.models_dir()}. Stoke reads GGUF files (split sets too) "
            "and MLX folders.",
            page,
        )
        self.library_empty.setAccessibleName("No models")
        empty_import = QPushButton("Import…", self.library_empty)
        empty_import.setObjectName("primary")
        described(
            empty_import, "Import a model", "Bring a GGUF file or an MLX folder into the library"
        )
        empty_catalog = QPushButton("Browse the Catalog", self.library_empty)
        described(empty_catalog, "Open the catalog", "Recommended models, with whether each fits")
        self.library_empty.add_button(empty_import)
        self.library_empty.add_button(empty_catalog)
        self.library_empty.finish()
        self.library_stack = QStackedWidget(page)
        self.library_stack.addWidget(self.splitter)
        self.library_stack.addWidget(self.library_empty)
        column.addWidget(self.library_stack, 1)

        footer = QHBoxLayout()
        for col in (4, 6, 7):
            self.table_model.horizontalHeaderItem(col).setTextAlignment(
                Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
            )
        self.total_label = text_label("", "muted", page)
        self.total_label.setAccessibleName("Disk use of the library")
        self.problems_label = text_label("", "note", page)
        self.problems_label.setAccessibleName("Files the library could not read")
        self.busy_label = text_label("", "muted", page)
        self.busy_label.setAccessibleName("Library activity")
        self.busy_bar = QProgressBar(page)
        self.busy_bar.setRange(0, 0)
        self.busy_bar.setTextVisible(False)
        self.busy_bar.setFixedWidth(120)
        described(self.busy_bar, "Library busy", "A library operation is running")
        footer.addWidget(self.total_label)
        footer.addWidget(self.problems_label)
        footer.addStretch(1)
        footer.addWidget(self.busy_label)
        footer.addWidget(self.busy_bar)
        column.addLayout(footer)
        self._update_busy()

        self.filter_edit.textChanged.connect(self.proxy.setFilterFixedString)
        self.table.selectionModel().selectionChanged.connect(self._selection_changed)
        self.table.doubleClicked.connect(lambda _index: self.load_selected())
        self.import_button.clicked.connect(self.open_import)
        empty_import.clicked.connect(self.open_import)
        empty_catalog.clicked.connect(lambda: self.tabs.setCurrentWidget(self.catalog_tab))
        self.add_folder_button.clicked.connect(self._add_folder)
        self.refresh_button.clicked.connect(self.refresh)
        delete_key = QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.table)
        delete_key.setContext(Qt.ShortcutContext.WidgetShortcut)
        delete_key.activated.connect(self.delete_selected)
        return page

    def _build_details(self, parent: QWidget) -> QFrame:
        frame = QFrame(parent)
        frame.setObjectName("details")
        frame.setAccessibleName("Model details")
        frame.setMinimumWidth(300)
        column = QVBoxLayout(frame)
        column.setContentsMargins(16, 14, 16, 14)
        column.setSpacing(8)
        self.details_stack = QStackedWidget(frame)
        placeholder = text_label("Select a model to see its details.", "muted", frame)
        placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        placeholder.setWordWrap(True)
        body = QWidget(frame)
        form = QVBoxLayout(body)
        form.setContentsMargins(0, 0, 0, 0)
        form.setSpacing(6)
        self.details_name = text_label("", "title", body)
        self.details_name.setWordWrap(True)
        self.details_name.setAccessibleName("Model name")
        self.details_name.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_summary = text_label("", "muted", body)
        self.details_summary.setWordWrap(True)
        self.details_summary.setAccessibleName("Model summary")
        self.loaded_pill = QLabel(body)
        pill(self.loaded_pill, "Loaded now", GREEN)
        self.loaded_pill.setAccessibleName("Loaded now")
        self.loaded_pill.setToolTip("The chat engine is using this model")
        pills = QHBoxLayout()
        pills.addWidget(self.loaded_pill)
        pills.addStretch(1)
        form.addWidget(self.details_name)
        form.addWidget(self.details_summary)
        form.addLayout(pills)
        grid = QGridLayout()
        grid.setHorizontalSpacing(12)
        grid.setVerticalSpacing(6)
        grid.setColumnStretch(1, 1)
        self.details_path = ElidedLabel("Model path", body)
        self.details_files = text_label("", "", body)
        self.details_files.setAccessibleName("Model files")
        self.details_fingerprint = text_label("", "", body)
        self.details_fingerprint.setAccessibleName("Fingerprint")
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self.details_fingerprint.setFont(mono)
        self.details_fingerprint.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse
        )
        self.details_fingerprint.setToolTip(
            "The model's id: its KV snapshots and load settings are filed under it"
        )
        self.details_template = text_label("", "", body)
        self.details_template.setAccessibleName("Chat template")
        self.details_template.setWordWrap(True)
        self.details_settings = text_label("", "", body)
        self.details_settings.setAccessibleName("Load settings")
        self.details_settings.setWordWrap(True)
        self.details_settings.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_facts: dict[str, QLabel] = {}
        for fact in ("Format", "Architecture", "Parameters", "Experts", "Quantization"):
            self.details_facts[fact] = text_label("", "", body)
        for fact in ("Context", "Size on disk", "Reads images"):
            self.details_facts[fact] = text_label("", "", body)
        for fact, label in self.details_facts.items():
            label.setAccessibleName(fact)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._fact_fields: dict[str, QLabel] = {}
        rows = (
            *self.details_facts.items(),
            ("Path", self.details_path),
            ("Files", self.details_files),
            ("Fingerprint", self.details_fingerprint),
            ("Chat template", self.details_template),
            ("Load settings", self.details_settings),
        )
        for row, (name, widget) in enumerate(rows):
            field = text_label(name, "field", body)
            self._fact_fields[name] = field
            grid.addWidget(field, row, 0, Qt.AlignmentFlag.AlignTop)
            grid.addWidget(widget, row, 1)
        form.addSpacing(6)
        form.addLayout(grid)
        form.addStretch(1)
        self.details_stack.addWidget(placeholder)
        self.details_stack.addWidget(body)
        column.addWidget(self.details_stack, 1)

        buttons = QHBoxLayout()
        buttons.setSpacing(6)
        self.load_button = QPushButton("Load", frame)
        self.load_button.setObjectName("primary")
        described(self.load_button, "Load model", "Restart the chat engine with this model")
        self.plan_button = QPushButton("Plan…", frame)
        described(
            self.plan_button,
            "Plan how to load",
            "Open the hardware planner: where this model's tensors go on this machine",
        )
        self.delete_button = QPushButton("Delete…", frame)
        self.delete_button.setObjectName("danger")
        described(
            self.delete_button, "Delete model", "Delete this model's files and its KV snapshots"
        )
        buttons.addWidget(self.load_button)
        buttons.addWidget(self.plan_button)
        buttons.addStretch(1)
        buttons.addWidget(self.delete_button)
        column.addLayout(buttons)
        self.load_button.clicked.connect(self.load_selected)
        self.plan_button.clicked.connect(self.plan_selected)
        self.delete_button.clicked.connect(self.delete_selected)
        return frame

    def refresh(self) -> None:
        """Rescan the library folders (cheap: unchanged files are not read again)."""
        if self._scan_queued:
            return
        self._scan_queued = True
        self._settings.clear()
        library = self.library

        def scan() -> tuple[list[ModelEntry], list[str]]:
            models = library.listed()
            return models, [f"{p.path.name}: {p.message}" for p in library.problems]

        def done(result: tuple[list[ModelEntry], list[str]]) -> None:
            self._scan_queued = False
            self._show_library(*result)

        def failed(message: str) -> None:
            self._scan_queued = False
            self.show_error(message)

        self._run(library_pool(), scan, done, failed)

    def _show_library(self, models: list[ModelEntry], problems: list[str]) -> None:
        current = self.selected_model()
        keep = self._select_after or (str(current.path) if current else None)
        self._select_after = None
        self._problems = problems
        self.models = sorted(models, key=lambda m: m.name.lower())
        self.table.setSortingEnabled(False)
        self.table_model.setRowCount(0)
        for model in self.models:
            self.table_model.appendRow(self._row_items(model))
        self.table.setSortingEnabled(True)
        self.library_stack.setCurrentWidget(self.library_empty if not models else self.splitter)
        total = sum(m.size_bytes for m in models if not (m.linked or m.bundled))
        linked = sum(1 for m in models if m.linked)
        bundled = sum(1 for m in models if m.bundled)
        folders = len(self.library.folders())
        self.total_label.setText(library_footer(len(models), total, folders, linked, bundled))
        self.total_label.setToolTip(
            f"Linked models live elsewhere and are not counted. Folders: "
            f"{', '.join(str(f) for f in self.library.folders())}"
        )
        self.problems_label.setText(
            f"⚠ {len(problems)} file{'s' if len(problems) != 1 else ''} skipped" if problems else ""
        )
        self.problems_label.setToolTip("\n".join(problems))
        if keep is not None:
            self.select_model(keep)
        self._selection_changed()
        self._update_catalog_buttons()
        self.library_refreshed.emit()

    def _row_items(self, model: ModelEntry) -> list[QStandardItem]:
        source = BUNDLED if model.bundled else LINKED if model.linked else ""
        values: Sequence[tuple[str, object]] = (
            (model.name, model.name.lower()),
            (source, source),
            (model.format.upper(), model.format),
            (model.architecture or "—", model.architecture or ""),
            (format_parameters(model.parameters), model.parameters or -1),
            (model.quantization or "—", model.quantization or ""),
            (format_context(model.context_length), model.context_length or -1),
            (decimal_bytes(model.size_bytes), model.size_bytes),
        )
        items = []
        for text, key in values:
            item = QStandardItem(text)
            item.setData(key, SORT_ROLE)
            item.setData(model.id, ID_ROLE)
            item.setData(str(model.path), PATH_ROLE)
            items.append(item)
        name = items[0]
        name.setToolTip(str(model.path))
        if model.linked:
            name.setToolTip(f"Linked: {model.path} → {model.path.resolve()}")
        if model.bundled:
            name.setToolTip(f"{BUNDLED_TIP} · {model.path}")
        items[1].setToolTip(name.toolTip() if source else "")
        if self._loaded_path is not None and str(model.path) == self._loaded_path:
            font = QFont(name.font())
            font.setBold(True)
            name.setFont(font)
            name.setToolTip(f"Loaded now · {model.path}")
        for col in (3, 5, 6):
            items[col].setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return items

    def selected_model(self) -> ModelEntry | None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        if not rows:
            return None
        path = rows[0].data(PATH_ROLE)
        return next((m for m in self.models if str(m.path) == path), None)

    def select_model(self, ref: str) -> bool:
        """Select a model by path, id or name; False when it is not listed."""
        for row in range(self.proxy.rowCount()):
            index = self.proxy.index(row, 0)
            path = index.data(PATH_ROLE)
            model = next((m for m in self.models if str(m.path) == path), None)
            if model is not None and ref in (str(model.path), model.id, model.name):
                self.table.selectRow(row)
                self.table.scrollTo(index)
                return True
        return False

    def _selection_changed(self, *_: QItemSelection) -> None:
        model = self.selected_model()
        for button in (self.load_button, self.plan_button):
            button.setEnabled(model is not None)
        self.delete_button.setEnabled(model is not None and not model.bundled and not self._busy)
        if model is None:
            self.details_stack.setCurrentIndex(0)
            return
        self.details_stack.setCurrentIndex(1)
        self.details_name.setText(model.name)
        kind = "mixture-of-experts" if model.expert_count else "dense"
        where = placement(model)
        bundled = f" · {BUNDLED_TIP}" if model.bundled else ""
        self.details_summary.setText(
            f"A {kind} model. Runs here on {where.engine}, about "
            f"{decimal_bytes(where.memory_bytes)} in memory{bundled}"
        )
        self.details_summary.setToolTip(f"{where.engine}: {where.reason}")
        facts = {
            "Format": "GGUF" if model.format == "gguf" else "MLX folder",
            "Architecture": model.architecture or "unknown",
            "Parameters": (
                f"{format_parameters(model.parameters)} ({model.parameters:,})"
                if model.parameters
                else "unknown"
            ),
            "Experts": str(model.expert_count or ""),
            "Quantization": model.quantization or "unknown",
            "Context": (
                f"{model.context_length:,} tokens" if model.context_length else "not recorded"
            ),
            "Size on disk": decimal_bytes(model.size_bytes)
            + (" (elsewhere: linked)" if model.linked else ""),
            # a vision model's projector beside it; a text model leaves the row out
            "Reads images": f"yes, with {model.projector.name}" if model.projector else "",
        }
        for fact, text in facts.items():
            self.details_facts[fact].setText(text)
            self.details_facts[fact].setVisible(bool(text))
            self._fact_fields[fact].setVisible(bool(text))
        self.loaded_pill.setVisible(str(model.path) == self._loaded_path)
        tip = f"{model.path} → {model.path.resolve()}" if model.linked else str(model.path)
        self.details_path.set_full_text(str(model.path), tip)
        if model.format == "mlx":
            files = f"A folder of {len(model.files)} files"
        elif len(model.files) > 1:
            files = f"A split set of {len(model.files)} parts"
        else:
            files = "One file"
        if model.linked:
            files += " (linked: the file stays where it is)"
        self.details_files.setText(files)
        self.details_files.setToolTip("\n".join(str(f) for f in model.files))
        self.details_fingerprint.setText(model.id)
        self.details_template.setText(
            "Present in the model"
            if model.chat_template
            else "None: Stoke formats turns with a generic template"
        )
        self.plan_button.setEnabled(model.format == "gguf")
        self.plan_button.setToolTip(
            "Open the hardware planner: where this model's tensors go on this machine"
            if model.format == "gguf"
            else "The planner places GGUF tensors; an MLX model loads as it is"
        )
        self._show_settings(model)

    def _show_settings(self, model: ModelEntry) -> None:
        if model.format != "gguf":
            self.details_settings.setText("None: MLX models load with their own settings")
            return
        if model.id in self._settings:
            saved = self._settings[model.id]
            self.details_settings.setText(
                describe_settings(saved) if saved else "None saved: Plan… chooses them"
            )
            return
        self.details_settings.setText("Reading…")

        def done(saved: dict[str, Any] | None) -> None:
            self._settings[model.id] = saved
            current = self.selected_model()
            if current is not None and current.id == model.id:
                self._show_settings(model)

        self._run(library_pool(), lambda: load_settings.load(model.path), done)

    def set_loaded_path(self, path: str | None) -> None:
        """Mark the model the chat engine uses (bold in the table, a pill in the details)."""
        self._loaded_path = path
        self._show_library(self.models, self._problems)

    def load_selected(self) -> None:
        model = self.selected_model()
        if model is not None:
            self.load_requested.emit(str(model.path))

    def plan_selected(self) -> None:
        model = self.selected_model()
        if model is not None and model.format == "gguf":
            self.plan_requested.emit(str(model.path))

    def open_import(self) -> None:
        dialog = ImportDialog(self)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.import_model(dialog.path(), dialog.mode())

    def import_model(self, source: str | Path, mode: ImportMode = "copy") -> None:
        """Import in the background; the new model is selected once it is listed."""
        self.banner.hide()
        name = Path(source).name
        verb = {"copy": "Copying", "move": "Moving", "link": "Linking"}[mode]

        def imported(model: ModelEntry) -> None:
            self._select_after = str(model.path)
            self.banner.show_message(f"Imported {model.name} into the library.", kind="success")
            self.tabs.setCurrentWidget(self.library_tab)
            self.refresh()

        self._library_task(
            f"{verb} {name}…", lambda: self.library.import_model(source, mode), imported
        )

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a models folder", str(Path.home()))
        if not folder:
            return
        try:
            added = self.library.add_folder(folder)
        except LibraryError as exc:
            self.show_error(str(exc))
            return
        self.banner.show_message(
            f"Added {added}: its models are listed where they are.", kind="info"
        )
        self.refresh()

    def delete_summary(self, model: ModelEntry) -> str:
        """What Delete removes, in words, for the confirmation."""
        plan = self.library.deletion(model)
        lines = [f"Delete {model.name}?", "", "This removes:"]
        if model.linked:
            lines.append(
                f"• the link {model.path} (the file it points to, {plan.link_target}, stays)"
            )
        elif model.format == "mlx":
            lines.append(
                f"• the folder {model.path} ({len(model.files)} files, "
                f"{decimal_bytes(model.size_bytes)})"
            )
        else:
            for file, size in plan.files:
                lines.append(f"• {file} ({decimal_bytes(size)})")
        count = plan.kv_files
        shared = any(m.id == model.id and m.path != model.path for m in self.models)
        if shared:
            lines.append("• no KV snapshots: another copy of this model still uses them")
        elif count:
            lines.append(
                f"• {count} KV snapshot file{'s' if count != 1 else ''} "
                f"({decimal_bytes(plan.kv_bytes)}) in {plan.kv_folder}"
            )
        else:
            lines.append("• its KV snapshots (none saved yet)")
        if str(model.path) == self._loaded_path:
            lines += ["", "The chat engine is using it now; load another model first."]
        lines += ["", "This cannot be undone."]
        return "\n".join(lines)

    def delete_selected(self) -> None:
        model = self.selected_model()
        if model is None:
            return
        in_use = str(model.path) == self._loaded_path  # the summary says to load another first
        summary = self.delete_summary(model)
        if not confirm(self, "Delete model", summary, "Delete", allowed=not in_use):
            return
        self.banner.hide()
        ref = str(model.path)

        def deleted(gone: ModelEntry) -> None:
            self.banner.show_message(f"Deleted {gone.name}.", kind="success")
            self.refresh()

        self._library_task(f"Deleting {model.name}…", lambda: self.library.delete(ref), deleted)

    def _update_busy(self) -> None:
        busy = bool(self._busy)
        self.busy_label.setText(self._busy[-1] if busy else "")
        self.busy_bar.setVisible(busy)
        self.import_button.setEnabled(not busy)
        model = self.selected_model()
        self.delete_button.setEnabled(not busy and model is not None and not model.bundled)
