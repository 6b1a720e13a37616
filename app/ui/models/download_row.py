"""One download on the Downloads tab: what, how far, how fast, and its controls."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QWidget,
)

from app.models.downloads import Progress
from app.ui.a11y import described
from app.ui.models.widgets import pill, text_label
from app.ui.models.words import AMBER, GREEN, RED, STATE_TEXT, format_eta
from app.units import decimal_bytes


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
        self.title = text_label(title, "card-title", self)
        self.title.setAccessibleName("Download")
        self.state_label = QLabel(self)
        self.state_label.setAccessibleName("Download state")
        self.bar = QProgressBar(self)
        self.bar.setRange(0, 1000)
        self.bar.setFormat("%p%")
        self.bar.setTextVisible(True)
        described(self.bar, f"Progress of {title}", "How much of the download is on disk")
        self.detail = text_label("", "muted", self)
        self.detail.setAccessibleName("Bytes, speed and time left")
        self.files = text_label("", "muted", self)
        self.files.setAccessibleName("Files")
        self.error = text_label("", "error-text", self)
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
        pill(self.state_label, text, color)
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
        done = decimal_bytes(progress.done_bytes)
        total = decimal_bytes(progress.total_bytes) if progress.total_bytes else "?"
        parts = [f"{done} of {total}"]
        if progress.state == "running":
            if progress.speed > 0:
                parts.append(f"{decimal_bytes(int(progress.speed))}/s")
                parts.append(format_eta(progress.eta_s))
            else:
                parts.append("waiting for data")
        elif progress.state == "done":
            parts = [f"{decimal_bytes(progress.total_bytes)} · every file verified"]
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
