"""The Models page: the local library, Hugging Face downloads and the catalog, in one dialog.

Nothing slow runs on the UI thread. Scanning a library reads model headers, an import copies
tens of gigabytes, starting a download asks the hub for the repo's listing and detecting the
GPUs runs a subprocess: each runs on a pool thread and hands its answer back through a queued
signal. Library operations share one single-thread pool, so two of them never race on the
library's files, and that pool outlives the dialog: closing it does not cut an import in half.
Download progress arrives on the download manager's worker threads and is re-emitted as a Qt
signal, so only the UI thread touches a widget; a slow timer redraws running rows as well,
because a stalled transfer reports nothing and its speed and ETA would otherwise stay stale.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QItemSelection,
    QObject,
    QRunnable,
    QSortFilterProxyModel,
    Qt,
    QThreadPool,
    QTimer,
    Signal,
)
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QFont,
    QFontDatabase,
    QFontMetrics,
    QGuiApplication,
    QHideEvent,
    QKeySequence,
    QPainter,
    QPaintEvent,
    QShortcut,
    QShowEvent,
    QStandardItem,
    QStandardItemModel,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QStackedWidget,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import paths
from app.hardware.detect import Hardware, detect
from app.models import load_settings, secrets
from app.models.catalog import (
    DOES_NOT_FIT,
    FITS_CPU_OFFLOAD,
    FITS_EXPERT_OFFLOAD,
    FITS_GPU,
    RUNS_ON_CPU,
    CatalogEntry,
    Fit,
    assess,
    budget,
    load_catalog,
)
from app.models.downloads import Downloads, Progress, RepoListing, list_repo
from app.models.library import ImportMode, Library, LibraryError, ModelEntry, format_bytes
from app.ui.a11y import described
from app.ui.banner import Banner

log = logging.getLogger("stoke.ui.models")

EMPTY_LIBRARY = "No models yet — import a GGUF or download one from the Catalog"
EMPTY_DOWNLOADS = "No downloads — pick a model in the Catalog, or enter a Hugging Face repo above"
COLUMNS = ("Name", "Format", "Architecture", "Params", "Quant", "Context", "Size")
COLUMN_TIPS = (
    "The model's file or folder name",
    "GGUF (llama.cpp) or MLX (Apple Silicon)",
    "The model architecture from its metadata",
    "Parameter count",
    "Quantization: how many bits the weights take",
    "The longest context the model was trained for",
    "Size on disk (all parts of a split set)",
)
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
ID_ROLE = Qt.ItemDataRole.UserRole + 2
PATH_ROLE = Qt.ItemDataRole.UserRole + 3
REDRAW_MS = 1000

GREEN, AMBER, RED, GREY = "#2e9d5b", "#c98a12", "#c0392b", "#8a8f98"
FIT_COLORS = {"good": GREEN, "warn": AMBER, "bad": RED, "unknown": GREY}
FIT_TIPS = {
    FITS_GPU: "The weights and a working KV cache fit in GPU memory: the fastest way to run it.",
    FITS_EXPERT_OFFLOAD: (
        "Attention and shared weights on the GPU, routed experts in RAM: how a large "
        "mixture-of-experts model runs well on one workstation."
    ),
    FITS_CPU_OFFLOAD: "Part of the model on the GPU, the rest in RAM: it works, more slowly.",
    RUNS_ON_CPU: "No GPU Stoke can use: it runs from RAM on the CPU, slowly for large models.",
    DOES_NOT_FIT: "It needs more memory than this machine's GPUs and RAM have together.",
}
STATE_TEXT = {
    "starting": ("Contacting the hub…", GREY),
    "running": ("Downloading", "#2f6fde"),
    "paused": ("Paused", AMBER),
    "done": ("Done", GREEN),
    "failed": ("Failed", RED),
    "cancelled": ("Cancelled", GREY),
}
IMPORT_MODES: tuple[tuple[ImportMode, str, str], ...] = (
    (
        "copy",
        "Copy into Stoke's models folder",
        "The original stays where it is. Needs free space for a second copy.",
    ),
    (
        "move",
        "Move into Stoke's models folder",
        "Instant on the same disk; across disks it is copied, then the original is deleted.",
    ),
    (
        "link",
        "Link to it where it is",
        "Uses no space. The model leaves the library if the file moves or its disk is unplugged.",
    ),
)

_STYLE = f"""
QFrame#details, QFrame#card, QFrame#download-row {{
    border: 1px solid palette(mid); border-radius: 10px; background: palette(base); }}
QFrame#details QLabel, QFrame#card QLabel, QFrame#download-row QLabel {{ background: transparent; }}
QLabel#title {{ font-size: 16px; font-weight: 600; }}
QLabel#card-title {{ font-size: 14px; font-weight: 600; }}
QLabel#muted, QLabel#field {{ color: palette(placeholder-text); }}
QLabel#section {{ color: palette(placeholder-text); font-size: 12px; font-weight: 600;
    letter-spacing: 1px; padding-top: 6px; }}
QLabel#empty-icon {{ font-size: 40px; color: palette(placeholder-text); }}
QLabel#error-text {{ color: {RED}; }}
QLabel#note {{ color: {AMBER}; font-size: 12px; }}
QLabel#pill {{ border-radius: 9px; padding: 2px 10px; font-size: 12px; font-weight: 600;
    color: white; }}
QPushButton#primary {{ background: palette(highlight); color: palette(highlighted-text);
    border-color: palette(highlight); font-weight: 600; }}
QPushButton#primary:disabled {{ background: palette(button); color: palette(placeholder-text);
    border-color: palette(mid); }}
QPushButton#danger:hover {{ border-color: {RED}; color: {RED}; }}
QProgressBar {{ border: 1px solid palette(mid); border-radius: 6px; background: palette(window);
    text-align: center; min-height: 16px; max-height: 16px; font-size: 11px; }}
QProgressBar::chunk {{ background: palette(highlight); border-radius: 5px; }}
QTableView {{ border: 1px solid palette(mid); border-radius: 8px; }}
QHeaderView::section {{ padding: 5px 8px; border: none; border-bottom: 1px solid palette(mid);
    background: palette(window); font-weight: 600; }}
QLineEdit, QComboBox {{ padding: 5px 8px; border: 1px solid palette(mid); border-radius: 8px;
    background: palette(base); }}
QScrollArea {{ border: none; background: transparent; }}
QWidget#scroll-body {{ background: transparent; }}
QTabWidget::pane {{ border: none; border-top: 1px solid palette(mid); top: -1px; }}
QTabBar {{ qproperty-drawBase: 0; }}
QTabBar::tab {{ padding: 8px 18px; border: none; border-bottom: 2px solid transparent;
    background: transparent; color: palette(placeholder-text); font-weight: 600; }}
QTabBar::tab:selected {{ border-bottom: 2px solid palette(highlight); color: palette(text); }}
QTabBar::tab:hover {{ color: palette(text); }}
QComboBox::drop-down {{ border: none; width: 22px; }}
"""


# -- words and numbers -----------------------------------------------------------------------


def format_parameters(count: int | None) -> str:
    """135M, 1.7B, 284B: how model cards write parameter counts."""
    if not count:
        return "—"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            value = count / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(count)


def format_context(tokens: int | None) -> str:
    """8K, 128K, 1M for the usual powers of two; the exact count otherwise."""
    if not tokens:
        return "—"
    if tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    if tokens % 1024 == 0:
        return f"{tokens >> 10}K"
    return f"{tokens:,}"


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    whole = max(int(seconds + 0.5), 1)
    if whole < 60:
        return f"{whole} s left"
    minutes, secs = divmod(whole, 60)
    if minutes < 10:
        return f"{minutes} min {secs:02d} s left"
    if minutes < 60:
        return f"{minutes} min left"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min left"


def fit_level(text: str) -> str:
    if text == FITS_GPU:
        return "good"
    if text == DOES_NOT_FIT:
        return "bad"
    return "warn"


def describe_settings(settings: dict[str, Any]) -> str:
    """Saved load settings in a few lines (lists of rules are counted, not printed)."""
    lines = []
    for key, value in sorted(settings.items()):
        if isinstance(value, list | tuple):
            if not value:
                continue
            shown = f"{len(value)} rules" if key == "overrides" else ", ".join(map(str, value))
        elif isinstance(value, bool):
            shown = "on" if value else "off"
        elif isinstance(value, int) and key in ("n_ctx", "n_batch", "n_ubatch"):
            shown = f"{value:,}"
        else:
            shown = str(value)
        lines.append(f"{key}: {shown}")
    return "\n".join(lines)


def kv_snapshots(model: ModelEntry) -> tuple[int, int]:
    """(files, bytes) of the model's KV snapshots on disk."""
    folder = paths.cache_dir() / "kv" / model.id
    if not folder.is_dir():
        return 0, 0
    files = [f for f in folder.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def machine_summary(hardware: Hardware) -> str:
    room = budget(hardware)
    ram = format_bytes(hardware.memory.total)
    if hardware.apple is not None:
        return f"{hardware.apple.chip}: {format_bytes(room.gpu_bytes)} for the GPU, {ram} in all"
    if room.gpu_bytes:
        count = len(hardware.gpus)
        gpus = f"{count} GPU{'s' if count > 1 else ''}"
        return f"{gpus} with {format_bytes(room.gpu_bytes)} for models · {ram} RAM"
    return f"No GPU Stoke can use · {ram} RAM"


def _label(text: str = "", name: str = "", parent: QWidget | None = None) -> QLabel:
    label = QLabel(text, parent)
    if name:
        label.setObjectName(name)
    return label


def confirm(parent: QWidget, title: str, text: str, action: str, keep: str = "Cancel") -> bool:
    """Ask before something that cannot be undone; the safe answer is the default."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Warning)
    box.setWindowTitle(title)
    box.setText(text)
    box.setStandardButtons(QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    yes = box.button(QMessageBox.StandardButton.Yes)
    yes.setText(action)
    described(yes, action, action)
    no = box.button(QMessageBox.StandardButton.Cancel)
    no.setText(keep)
    described(no, keep, keep)
    return box.exec() == QMessageBox.StandardButton.Yes


def _pill(label: QLabel, text: str, color: str) -> None:
    label.setObjectName("pill")
    label.setText(text)
    label.setStyleSheet(f"background: {color};")


# -- background work -------------------------------------------------------------------------


class _Relay(QObject):
    """Lives on the UI thread; pool threads emit into it and Qt queues the call."""

    finished = Signal(int, object)
    failed = Signal(int, str)
    progress = Signal(object)


class _Task(QRunnable):
    def __init__(self, relay: _Relay, token: int, work: Callable[[], object]) -> None:
        super().__init__()
        self._relay, self._token, self._work = relay, token, work

    def run(self) -> None:
        try:
            result = self._work()
        except LibraryError as exc:  # DownloadError too: written for the user
            message = str(exc)
        except Exception as exc:  # shown in words; the traceback goes to the log
            log.exception("a Models page task failed")
            message = f"Something went wrong: {type(exc).__name__}: {exc}"
        else:
            with contextlib.suppress(RuntimeError):  # the dialog is gone
                self._relay.finished.emit(self._token, result)
            return
        with contextlib.suppress(RuntimeError):
            self._relay.failed.emit(self._token, message)


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


# -- small widgets ---------------------------------------------------------------------------


class ElidedLabel(QLabel):
    """A path that shortens in the middle to fit; the whole of it in the tooltip and the
    context menu's Copy."""

    def __init__(self, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setAccessibleName(name)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumHeight(self.fontMetrics().height())
        copy = QAction("Copy", self)
        copy.triggered.connect(lambda: QGuiApplication.clipboard().setText(self._full))
        self.addAction(copy)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)

    def set_full_text(self, text: str, tip: str | None = None) -> None:
        self._full = text
        self.setToolTip(tip or text)
        self.setAccessibleDescription(text)
        self.update()

    def full_text(self) -> str:
        return self._full

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        shown = QFontMetrics(self.font()).elidedText(
            self._full, Qt.TextElideMode.ElideMiddle, self.width()
        )
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(self.rect(), int(self.alignment()), shown)


class FitBadge(QLabel):
    """The planner's verdict for this machine, as a colored pill."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.level = "unknown"
        self.setAccessibleName("Fit on this machine")
        self.set_verdict(None)

    def set_verdict(self, text: str | None, problem: str = "") -> None:
        if text is None:
            self.level = "unknown"
            shown = "fit unknown" if problem else "checking…"
            tip = problem or "Stoke is looking at this machine's GPUs and memory."
        else:
            self.level, shown, tip = fit_level(text), text, FIT_TIPS.get(text, text)
        _pill(self, shown, FIT_COLORS[self.level])
        self.setToolTip(tip)
        self.setAccessibleDescription(f"{shown}. {tip}")


class _EmptyState(QWidget):
    """What an empty list says instead: what goes here and how to get some."""

    def __init__(self, icon: str, title: str, detail: str, parent: QWidget | None = None):
        super().__init__(parent)
        content = QWidget(self)
        content.setFixedWidth(660)  # wrapped labels need a width to compute their height
        inner = QVBoxLayout(content)
        inner.setSpacing(8)
        glyph = _label(icon, "empty-icon", content)
        heading = _label(title, "empty-title", content)
        font = QFont(heading.font())  # set here, not in the style sheet: wrapping measures it
        font.setPointSizeF(font.pointSizeF() * 1.3)
        font.setBold(True)
        heading.setFont(font)
        body = _label(detail, "muted", content)
        for label in (glyph, heading, body):
            label.setAlignment(Qt.AlignmentFlag.AlignCenter)
            label.setWordWrap(True)
            inner.addWidget(label)
        self.buttons = QHBoxLayout()
        self.buttons.addStretch(1)
        inner.addSpacing(8)
        inner.addLayout(self.buttons)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(content)
        row.addStretch(1)
        column = QVBoxLayout(self)
        column.addStretch(1)
        column.addLayout(row)
        column.addStretch(2)
        self.title = heading

    def add_button(self, button: QPushButton) -> None:
        self.buttons.addWidget(button)

    def finish(self) -> None:
        self.buttons.addStretch(1)


# -- import --------------------------------------------------------------------------------


class ImportDialog(QDialog):
    """Which model to bring in and how: copy (the default), move or link."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Import a model")
        self.setAccessibleName("Import a model")
        self.setStyleSheet(_STYLE)
        self.setMinimumWidth(560)
        column = QVBoxLayout(self)
        column.setSpacing(10)
        column.addWidget(
            _label("A GGUF file (for a split set, any of its parts) or an MLX model folder.")
        )
        row = QHBoxLayout()
        self.path_edit = QLineEdit(self)
        self.path_edit.setPlaceholderText("/path/to/model.gguf")
        described(self.path_edit, "Model to import", "The GGUF file or MLX folder to import")
        self.file_button = QPushButton("Choose File…", self)
        described(self.file_button, "Choose a GGUF file", "Pick a .gguf file")
        self.folder_button = QPushButton("Choose Folder…", self)
        described(self.folder_button, "Choose an MLX folder", "Pick an MLX model folder")
        row.addWidget(self.path_edit, 1)
        row.addWidget(self.file_button)
        row.addWidget(self.folder_button)
        column.addLayout(row)
        self.size_label = _label("", "muted", self)
        self.size_label.setAccessibleName("Size of the chosen model")
        column.addWidget(self.size_label)
        self.modes = QButtonGroup(self)
        self.mode_buttons: dict[str, QRadioButton] = {}
        for mode, title, detail in IMPORT_MODES:
            radio = QRadioButton(title, self)
            described(radio, title, detail)
            explain = _label(detail, "muted", self)
            explain.setWordWrap(True)
            explain.setContentsMargins(24, 0, 0, 2)
            self.modes.addButton(radio)
            self.mode_buttons[mode] = radio
            pair = QVBoxLayout()
            pair.setSpacing(0)
            pair.addWidget(radio)
            pair.addWidget(explain)
            column.addLayout(pair)
        self.mode_buttons["copy"].setChecked(True)
        target = paths.models_dir()
        where = _label(f"Models folder: {target}", "muted", self)
        where.setWordWrap(True)
        column.addWidget(where)
        buttons = QDialogButtonBox(self)
        self.import_button = QPushButton("Import", self)
        self.import_button.setObjectName("primary")  # named before the box polishes it
        buttons.addButton(self.import_button, QDialogButtonBox.ButtonRole.AcceptRole)
        described(self.import_button, "Import", "Import the model into the library")
        cancel = buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        described(cancel, "Cancel", "Close without importing")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        column.addWidget(buttons)
        self.file_button.clicked.connect(self._choose_file)
        self.folder_button.clicked.connect(self._choose_folder)
        self.path_edit.textChanged.connect(self._path_changed)
        self._path_changed("")

    def _choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import a GGUF model", str(Path.home()), "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.path_edit.setText(path)

    def _choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(
            self, "Import an MLX model folder", str(Path.home())
        )
        if path:
            self.path_edit.setText(path)

    def _path_changed(self, text: str) -> None:
        path = Path(text.strip()).expanduser() if text.strip() else None
        ok = path is not None and path.exists()
        self.import_button.setEnabled(ok)
        if path is None:
            self.size_label.setText("")
        elif not ok:
            self.size_label.setText("Nothing at that path.")
        elif path.is_file():
            self.size_label.setText(f"{path.name} · {format_bytes(path.stat().st_size)}")
        else:
            self.size_label.setText(f"{path.name} (folder)")

    def path(self) -> Path:
        return Path(self.path_edit.text().strip()).expanduser()

    def mode(self) -> ImportMode:
        for mode, radio in self.mode_buttons.items():
            if radio.isChecked():
                return mode  # type: ignore[return-value]
        return "copy"


# -- download rows ---------------------------------------------------------------------------


class DownloadRow(QFrame):
    """One download: what, how far, how fast, and its controls."""

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("download-row")
        self.job_id: str | None = None
        self.repo = ""
        self.state = "starting"
        self.retry: Callable[[], None] | None = None
        grid = QGridLayout(self)
        grid.setContentsMargins(14, 12, 14, 12)
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(6)
        self.title = _label(title, "card-title", self)
        self.title.setAccessibleName("Download")
        self.state_label = QLabel(self)
        self.state_label.setAccessibleName("Download state")
        self.bar = QProgressBar(self)
        self.bar.setRange(0, 1000)
        self.bar.setFormat("%p%")
        self.bar.setTextVisible(True)
        described(self.bar, f"Progress of {title}", "How much of the download is on disk")
        self.detail = _label("", "muted", self)
        self.detail.setAccessibleName("Bytes, speed and time left")
        self.files = _label("", "muted", self)
        self.files.setAccessibleName("Files")
        self.error = _label("", "error-text", self)
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error.setAccessibleName("Download error")
        self.error.hide()
        self.pause_button = QPushButton("Pause", self)
        described(self.pause_button, f"Pause {title}", "Stop for now; the bytes on disk are kept")
        self.resume_button = QPushButton("Resume", self)
        described(self.resume_button, f"Resume {title}", "Go on from the bytes already downloaded")
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setObjectName("danger")
        described(self.cancel_button, f"Cancel {title}", "Stop and delete what was downloaded")
        buttons = QHBoxLayout()
        buttons.setSpacing(6)
        for button in (self.pause_button, self.resume_button, self.cancel_button):
            buttons.addWidget(button)
        grid.addWidget(self.title, 0, 0)
        grid.addWidget(self.state_label, 0, 1, Qt.AlignmentFlag.AlignRight)
        grid.addWidget(self.bar, 1, 0, 1, 2)
        grid.addWidget(self.detail, 2, 0)
        grid.addLayout(buttons, 2, 1, Qt.AlignmentFlag.AlignRight)
        grid.addWidget(self.files, 3, 0, 1, 2)
        grid.addWidget(self.error, 4, 0, 1, 2)
        grid.setColumnStretch(0, 1)
        self.show_starting()

    def _set_state(self, state: str) -> None:
        self.state = state
        text, color = STATE_TEXT[state]
        _pill(self.state_label, text, color)
        chunk = {"done": GREEN, "failed": RED, "paused": AMBER}.get(state)
        self.bar.setStyleSheet(f"QProgressBar::chunk {{ background: {chunk}; }}" if chunk else "")

    def _buttons(self, pause: bool, resume: bool, cancel: bool) -> None:
        self.pause_button.setEnabled(pause)
        self.resume_button.setEnabled(resume)
        self.cancel_button.setEnabled(cancel)

    def show_starting(self) -> None:
        self._set_state("starting")
        self.bar.show()
        self.bar.setRange(0, 0)  # busy: no sizes yet
        self.detail.setText("Checking access and disk space")
        self.files.hide()
        self.error.hide()
        self.pause_button.show()
        self._buttons(False, False, False)

    def show_start_failed(self, message: str) -> None:
        """The download never began (404, gated, no space): say why; offer Retry."""
        self._set_state("failed")
        self.bar.hide()
        self.detail.setText("Nothing was downloaded.")
        self.error.setText(message)
        self.error.show()
        self.pause_button.hide()
        self.resume_button.setText("Retry")
        self.resume_button.setToolTip("Ask the hub again")
        self.cancel_button.setText("Dismiss")
        self.cancel_button.setToolTip("Remove this row")
        self._buttons(False, self.retry is not None, True)

    def show_progress(self, progress: Progress) -> None:
        self.job_id = progress.id
        self.bar.show()
        self._set_state(progress.state if progress.state in STATE_TEXT else "running")
        if progress.total_bytes:
            self.bar.setRange(0, 1000)
            self.bar.setValue(round(1000 * progress.fraction))
        else:
            self.bar.setRange(0, 0 if progress.state == "running" else 1000)
        done = format_bytes(progress.done_bytes)
        total = format_bytes(progress.total_bytes) if progress.total_bytes else "?"
        parts = [f"{done} of {total}"]
        if progress.state == "running":
            if progress.speed > 0:
                parts.append(f"{format_bytes(int(progress.speed))}/s")
                parts.append(format_eta(progress.eta_s))
            else:
                parts.append("waiting for data")
        elif progress.state == "done":
            parts = [f"{format_bytes(progress.total_bytes)} · every file verified"]
        self.detail.setText(" · ".join(parts))
        if progress.state == "done":
            files = f"In {progress.destination}"
        elif progress.files_total == 1:
            files = ", ".join(progress.current)
        else:
            files = f"{progress.files_done} of {progress.files_total} files done"
            if progress.current:
                files += f" · now {', '.join(progress.current)}"
        self.files.setText(files)
        self.files.setVisible(bool(files))
        self.error.setText(progress.error or "")
        self.error.setVisible(bool(progress.error))
        self.resume_button.setText("Retry" if progress.state == "failed" else "Resume")
        if progress.state == "done":
            self.cancel_button.setText("Clear")
            self.cancel_button.setToolTip("Remove from this list; the model stays in the library")
        else:
            self.cancel_button.setText("Cancel")
            self.cancel_button.setToolTip("Stop and delete what was downloaded")
        running = progress.state == "running"
        self._buttons(running, progress.state in ("paused", "failed"), True)
        self.pause_button.setVisible(progress.state != "done")
        self.resume_button.setVisible(progress.state != "done")


# -- catalog cards ---------------------------------------------------------------------------


class CatalogCard(QFrame):
    def __init__(self, entry: CatalogEntry, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.entry = entry
        self.setObjectName("card")
        self.setAccessibleName(entry.name)
        grid = QGridLayout(self)
        grid.setContentsMargins(14, 12, 14, 12)
        grid.setHorizontalSpacing(12)
        grid.setVerticalSpacing(4)
        title = _label(entry.name, "card-title", self)
        title.setWordWrap(True)
        context = (
            f" · {format_context(entry.context_length)} context" if entry.context_length else ""
        )
        kind = "MoE" if entry.moe else "dense"
        meta = _label(
            f"{entry.repo} · {entry.format.upper()} · {entry.parameters} ({kind}){context}",
            "muted",
            self,
        )
        meta.setWordWrap(True)
        meta.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        notes = _label(entry.notes, "", self)
        notes.setWordWrap(True)
        self.badge = FitBadge(self)
        self.size_label = _label(f"{format_bytes(entry.size_bytes)}", "card-title", self)
        self.size_label.setAccessibleName("Download size")
        self.size_label.setToolTip("About this much is downloaded and kept on disk")
        self.download_button = QPushButton("Download", self)
        self.download_button.setObjectName("primary")
        described(
            self.download_button,
            f"Download {entry.name}",
            f"Download {format_bytes(entry.size_bytes)} from {entry.repo}",
        )
        grid.addWidget(title, 0, 0)
        grid.addWidget(meta, 1, 0)
        grid.addWidget(notes, 2, 0)
        self.note: QLabel | None = None
        self._state, self._where, self._fits = "download", "", True
        if not entry.checked:
            self.note = _label(
                "⚠ Not yet checked against the hub: the repo or its file names may differ.",
                "note",
                self,
            )
            self.note.setWordWrap(True)
            self.note.setAccessibleName("Unchecked entry")
            grid.addWidget(self.note, 3, 0)
        side = QVBoxLayout()
        side.setSpacing(6)
        side.addWidget(self.badge, 0, Qt.AlignmentFlag.AlignRight)
        side.addWidget(self.size_label, 0, Qt.AlignmentFlag.AlignRight)
        side.addWidget(self.download_button, 0, Qt.AlignmentFlag.AlignRight)
        side.addStretch(1)
        grid.addLayout(side, 0, 1, 4, 1)
        grid.setColumnStretch(0, 1)

    def set_fit(self, text: str) -> None:
        """Show the verdict; a model that cannot run here still downloads, less loudly."""
        self.badge.set_verdict(text)
        self.download_button.setObjectName("" if text == DOES_NOT_FIT else "primary")
        self.download_button.style().unpolish(self.download_button)
        self.download_button.style().polish(self.download_button)
        self._fits = text != DOES_NOT_FIT
        self.set_available(self._state, self._where)

    def set_available(self, state: str, where: str = "") -> None:
        """State is one of download, downloading, or have (already in the library)."""
        self._state, self._where = state, where
        button = self.download_button
        button.setEnabled(state == "download")
        button.setText(
            {"download": "Download", "downloading": "Downloading…"}.get(state, "In library")
        )
        if state == "have":
            button.setToolTip(f"Already downloaded to {where}")
        elif state == "downloading":
            button.setToolTip("Being downloaded: see the Downloads tab")
        else:
            entry = self.entry
            tip = f"Download {format_bytes(entry.size_bytes)} from {entry.repo}"
            if not self._fits:
                tip += " (it does not fit this machine: for another computer or a bigger one)"
            button.setToolTip(tip)


# -- the dialog ------------------------------------------------------------------------------


class ModelsDialog(QDialog):
    """File > Models…: the models on disk, the downloads, and recommended models."""

    load_requested = Signal(str)  # the model's path (first GGUF part, or the MLX folder)
    plan_requested = Signal(str)
    library_refreshed = Signal()  # the table shows a fresh scan

    def __init__(
        self,
        library: Library,
        downloads: Downloads | None = None,
        hardware: Hardware | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._relay = _Relay(self)
        self._relay.finished.connect(self._task_finished, Qt.ConnectionType.QueuedConnection)
        self._relay.failed.connect(self._task_failed, Qt.ConnectionType.QueuedConnection)
        self._relay.progress.connect(self._progress_arrived, Qt.ConnectionType.QueuedConnection)
        self._tokens = itertools.count(1)
        self._callbacks: dict[int, tuple[Callable[[Any], None], Callable[[str], None]]] = {}
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
        self.setStyleSheet(_STYLE)
        self.resize(1120, 700)
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
        pool = QThreadPool.globalInstance()
        pool.start(_Task(self._relay, 0, manager.resume_pending))
        return manager

    # -- background tasks --

    def _run(
        self,
        pool: QThreadPool,
        work: Callable[[], object],
        on_done: Callable[[Any], None],
        on_failed: Callable[[str], None] | None = None,
    ) -> None:
        token = next(self._tokens)
        self._callbacks[token] = (on_done, on_failed or self.show_error)
        pool.start(_Task(self._relay, token, work))

    def _task_finished(self, token: int, result: object) -> None:
        on_done, _ = self._callbacks.pop(token, (None, None))
        if on_done is not None:
            on_done(result)

    def _task_failed(self, token: int, message: str) -> None:
        _, on_failed = self._callbacks.pop(token, (None, self.show_error))
        on_failed(message)

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

    # -- Library tab --

    def _build_library(self) -> QWidget:
        page = QWidget(self)
        column = QVBoxLayout(page)
        column.setContentsMargins(0, 10, 0, 0)
        column.setSpacing(10)
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
        self.splitter.setSizes([760, 320])
        self.splitter.setChildrenCollapsible(False)

        self.library_empty = _EmptyState(
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
        for col in (3, 5, 6):
            self.table_model.horizontalHeaderItem(col).setTextAlignment(
                Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
            )
        self.total_label = _label("", "muted", page)
        self.total_label.setAccessibleName("Disk use of the library")
        self.problems_label = _label("", "note", page)
        self.problems_label.setAccessibleName("Files the library could not read")
        self.busy_label = _label("", "muted", page)
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
        placeholder = _label("Select a model to see its details.", "muted", frame)
        placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        placeholder.setWordWrap(True)
        body = QWidget(frame)
        form = QVBoxLayout(body)
        form.setContentsMargins(0, 0, 0, 0)
        form.setSpacing(6)
        self.details_name = _label("", "title", body)
        self.details_name.setWordWrap(True)
        self.details_name.setAccessibleName("Model name")
        self.details_name.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_summary = _label("", "muted", body)
        self.details_summary.setWordWrap(True)
        self.details_summary.setAccessibleName("Model summary")
        self.loaded_pill = QLabel(body)
        _pill(self.loaded_pill, "Loaded now", GREEN)
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
        self.details_files = _label("", "", body)
        self.details_files.setAccessibleName("Model files")
        self.details_fingerprint = _label("", "", body)
        self.details_fingerprint.setAccessibleName("Fingerprint")
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self.details_fingerprint.setFont(mono)
        self.details_fingerprint.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse
        )
        self.details_fingerprint.setToolTip(
            "The model's id: its KV snapshots and load settings are filed under it"
        )
        self.details_template = _label("", "", body)
        self.details_template.setAccessibleName("Chat template")
        self.details_template.setWordWrap(True)
        self.details_settings = _label("", "", body)
        self.details_settings.setAccessibleName("Load settings")
        self.details_settings.setWordWrap(True)
        self.details_settings.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_facts: dict[str, QLabel] = {}
        for fact in ("Format", "Architecture", "Parameters", "Experts", "Quantization"):
            self.details_facts[fact] = _label("", "", body)
        for fact in ("Context", "Size on disk"):
            self.details_facts[fact] = _label("", "", body)
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
            field = _label(name, "field", body)
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
            models = library.models()
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
        total = sum(m.size_bytes for m in models if not m.linked)
        count = f"{len(models)} model{'s' if len(models) != 1 else ''}"
        self.total_label.setText(f"{count} · {format_bytes(total)} on disk")
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
        values: Sequence[tuple[str, object]] = (
            (model.name, model.name.lower()),
            (model.format.upper(), model.format),
            (model.architecture or "—", model.architecture or ""),
            (format_parameters(model.parameters), model.parameters or -1),
            (model.quantization or "—", model.quantization or ""),
            (format_context(model.context_length), model.context_length or -1),
            (format_bytes(model.size_bytes), model.size_bytes),
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
            name.setText(f"{model.name}  ↗")
            name.setToolTip(f"Linked: {model.path} → {model.path.resolve()}")
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
        self.delete_button.setEnabled(model is not None and not self._busy)
        if model is None:
            self.details_stack.setCurrentIndex(0)
            return
        self.details_stack.setCurrentIndex(1)
        self.details_name.setText(model.name)
        kind = "mixture-of-experts" if model.expert_count else "dense"
        engine = "llama.cpp" if model.format == "gguf" else "MLX"
        self.details_summary.setText(f"A {kind} model for {engine}")
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
            "Size on disk": format_bytes(model.size_bytes)
            + (" (elsewhere: linked)" if model.linked else ""),
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
            self.banner.show_message(f"Imported {model.name} into the library.", kind="info")
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
        lines = [f"Delete {model.name}?", "", "This removes:"]
        if model.linked:
            lines.append(
                f"• the link {model.path} (the file it points to, {model.path.resolve()}, stays)"
            )
        elif model.format == "mlx":
            lines.append(
                f"• the folder {model.path} ({len(model.files)} files, "
                f"{format_bytes(model.size_bytes)})"
            )
        else:
            for file in model.files:
                size = file.stat().st_size if file.exists() else 0
                lines.append(f"• {file} ({format_bytes(size)})")
        count, size = kv_snapshots(model)
        shared = any(m.id == model.id and m.path != model.path for m in self.models)
        if shared:
            lines.append("• no KV snapshots: another copy of this model still uses them")
        elif count:
            lines.append(
                f"• {count} KV snapshot file{'s' if count != 1 else ''} ({format_bytes(size)}) "
                f"in {paths.cache_dir() / 'kv' / model.id}"
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
        if not confirm(self, "Delete model", self.delete_summary(model), "Delete"):
            return
        self.banner.hide()
        ref = str(model.path)

        def deleted(gone: ModelEntry) -> None:
            self.banner.show_message(f"Deleted {gone.name}.", kind="info")
            self.refresh()

        self._library_task(f"Deleting {model.name}…", lambda: self.library.delete(ref), deleted)

    def _update_busy(self) -> None:
        busy = bool(self._busy)
        self.busy_label.setText(self._busy[-1] if busy else "")
        self.busy_bar.setVisible(busy)
        self.import_button.setEnabled(not busy)
        self.delete_button.setEnabled(not busy and self.selected_model() is not None)

    # -- Downloads tab --

    def _build_downloads(self) -> QWidget:
        page = QWidget(self)
        column = QVBoxLayout(page)
        column.setContentsMargins(0, 10, 0, 0)
        column.setSpacing(10)
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
        self.downloads_empty = _EmptyState(
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
            self._relay.progress.emit(progress)
        previous = self._previous_progress
        if previous is not None:
            previous(progress)

    def _progress_arrived(self, progress: Progress) -> None:
        self._apply_progress(progress)

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
                kind="info",
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
                    f"{group.key} · {format_bytes(group.size)}{parts}", (listing.repo, group.key)
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

    # -- Catalog tab --

    def _build_catalog(self) -> QWidget:
        page = QWidget(self)
        column = QVBoxLayout(page)
        column.setContentsMargins(0, 10, 0, 0)
        column.setSpacing(8)
        self.machine_label = _label("Looking at this machine…", "muted", page)
        self.machine_label.setAccessibleName("This machine")
        self.machine_label.setToolTip("What the fit badges are measured against")
        column.addWidget(self.machine_label)
        scroll = QScrollArea(page)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setAccessibleName("Catalog")
        body = QWidget(scroll)
        body.setObjectName("scroll-body")
        cards = QVBoxLayout(body)
        cards.setContentsMargins(0, 0, 4, 0)
        cards.setSpacing(8)
        self.cards: dict[str, CatalogCard] = {}
        family = None
        for entry in self.catalog:
            if entry.family != family:
                family = entry.family
                cards.addWidget(_label(family.upper(), "section", body))
            card = CatalogCard(entry, body)
            card.download_button.clicked.connect(lambda _=False, e=entry: self.download_entry(e.id))
            self.cards[entry.id] = card
            cards.addWidget(card)
        cards.addStretch(1)
        scroll.setWidget(body)
        column.addWidget(scroll, 1)
        return page

    def download_entry(self, entry_id: str) -> DownloadRow:
        entry = self.cards[entry_id].entry
        return self.start_download(
            entry.repo,
            entry.files or None,
            quant=None if entry.files else entry.quant,
            title=entry.name,
        )

    def _hardware_found(self, hardware: Hardware) -> None:
        self.hardware = hardware
        self._update_badges()

    def _no_hardware(self, message: str) -> None:
        self._hardware_problem = f"Stoke could not look at this machine: {message}"
        self.machine_label.setText(self._hardware_problem)
        for card in self.cards.values():
            card.badge.set_verdict(None, self._hardware_problem)

    def _update_badges(self) -> None:
        """Plan each entry off the UI thread (the first plan reads DeepSeek's layout, seconds),
        then show the verdicts."""
        if self.hardware is None:
            return
        hardware = self.hardware
        entries = [card.entry for card in self.cards.values()]
        self._run(
            QThreadPool.globalInstance(),
            lambda: {e.id: assess(e, hardware) for e in entries},
            lambda fits: self._show_fits(hardware, fits),
            self._no_hardware,
        )

    def _show_fits(self, hardware: Hardware, fits: dict[str, Fit]) -> None:
        self.machine_label.setText(f"Fit for this machine — {machine_summary(hardware)}")
        for entry_id, fit in fits.items():
            card = self.cards[entry_id]
            card.set_fit(fit.verdict)
            notes = [card.badge.toolTip()]
            if fit.basis == "planner" and fit.detail:
                notes.append(f"Offload planner: {fit.detail}.")
            if fit.speed:
                notes.append(f"Predicted decode: {fit.speed}.")
            card.badge.setToolTip(" ".join(notes))

    def _update_catalog_buttons(self) -> None:
        active = {
            row.title.text() for row in self.download_rows() if row.state in ("starting", "running")
        }
        for card in self.cards.values():
            entry = card.entry
            where = self.downloads.destination(entry.repo)
            if entry.files and all((where / f).exists() for f in entry.files):
                card.set_available("have", str(where))
            elif entry.name in active:
                card.set_available("downloading")
            else:
                card.set_available("download")

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
        next open, from the bytes on disk); the app's manager goes on."""
        self._detach()
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
