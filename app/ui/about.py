"""Help > About: what this Stoke is (versions), where it keeps its files, and a button that
copies `stoke doctor`'s report for a bug report.

The report asks llama.cpp for its devices in a subprocess, so it is collected on the thread
pool (app.ui.background) and lands in the clipboard when it is done; the dialog stays usable
meanwhile. It loads no model: the window says which engine holds its own
(`doctor.Running`), where `stoke doctor` in a terminal loads it with each engine.
"""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Callable

import PySide6
from PySide6.QtCore import Qt, QThreadPool, qVersion
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app import doctor, paths
from app.engine.choice import LOCAL_ENGINES
from app.engine.host import EngineClient, EngineState
from app.ui.background import Background

FAILED = "The diagnostics could not be collected; `stoke doctor` in a terminal shows them."


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions() -> list[tuple[str, str]]:
    return [
        ("Stoke", _version("stoke")),
        ("Python", platform.python_version()),
        ("Qt", f"{qVersion()} (PySide6 {PySide6.__version__})"),
        ("llama.cpp", f"llama-cpp-python {_version('llama-cpp-python')}"),
    ]


def folders() -> list[tuple[str, str]]:
    return [
        ("Data", str(paths.data_dir(create=False))),
        ("Cache", str(paths.cache_dir(create=False))),
        ("Settings", str(paths.config_dir(create=False))),
    ]


LOADED = (EngineState.READY, EngineState.PREFILLING, EngineState.GENERATING)


def running_of(engine: EngineClient) -> doctor.Running | None:
    """The window's engine and model for the report, while a local engine holds it."""
    info = engine.info
    if info is None or engine.state not in LOADED or info.backend not in LOCAL_ENGINES:
        return None
    return doctor.Running(info.backend, info.path)


class AboutDialog(QDialog):
    """Versions, folders, and Copy diagnostics."""

    def __init__(
        self,
        parent: QWidget | None = None,
        running: Callable[[], doctor.Running | None] = lambda: None,
    ) -> None:
        """`running`: the window's engine and model when the report is asked for (None:
        nothing loaded, and the report loads the model itself)."""
        super().__init__(parent)
        self.running = running
        self.setWindowTitle("About Stoke")
        self.setObjectName("about-dialog")
        form = QFormLayout()
        for name, value in [*versions(), *folders()]:
            label = QLabel(value, self)
            label.setObjectName(f"about-{name.lower().replace('.', '')}")
            label.setAccessibleName(name)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            label.setWordWrap(True)
            form.addRow(f"{name}:", label)
        self.copy_button = QPushButton("Copy diagnostics", self)
        self.copy_button.setObjectName("copy-diagnostics")
        self.copy_button.setToolTip("Copy the report of `stoke doctor`, for a bug report")
        self.status = QLabel("", self)
        self.status.setObjectName("about-status")
        self.status.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.addButton(self.copy_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        column = QVBoxLayout(self)
        column.addLayout(form)
        column.addWidget(self.status)
        column.addWidget(buttons)
        self._background = Background(self, describe=lambda _exc: FAILED)
        self.copy_button.clicked.connect(self.copy_diagnostics)

    def copy_diagnostics(self) -> None:
        """Collect the doctor's report off the UI thread; copy it when it is ready."""
        self.copy_button.setEnabled(False)
        self.status.setText("Collecting the diagnostics…")
        running = self.running()
        self._background.run(
            QThreadPool.globalInstance(),
            lambda: doctor.render(doctor.collect(running=running)),
            self._copied,
            self._failed,
        )

    def _copied(self, report: str) -> None:
        QGuiApplication.clipboard().setText(report)
        self.copy_button.setEnabled(True)
        self.status.setText("Copied to the clipboard: paste it into the bug report.")

    def _failed(self, words: str) -> None:
        self.copy_button.setEnabled(True)
        self.status.setText(words)
