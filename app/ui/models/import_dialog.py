"""Import…: which model to bring into the library, and whether to copy, move or link it."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QButtonGroup,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from app import paths
from app.models.library import ImportMode
from app.ui import theme
from app.ui.a11y import described
from app.ui.fit import fit_to_screen
from app.ui.models.widgets import text_label
from app.units import decimal_bytes

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


class ImportDialog(QDialog):
    """Which model to bring in and how: copy (the default), move or link."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Import a model")
        self.setAccessibleName("Import a model")
        self.setStyleSheet(theme.stylesheet("models.qss"))
        self.setMinimumWidth(560)
        column = QVBoxLayout(self)
        column.setSpacing(10)
        column.addWidget(
            text_label("A GGUF file (for a split set, any of its parts) or an MLX model folder.")
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
        self.size_label = text_label("", "muted", self)
        self.size_label.setAccessibleName("Size of the chosen model")
        column.addWidget(self.size_label)
        self.modes = QButtonGroup(self)
        self.mode_buttons: dict[str, QRadioButton] = {}
        for mode, title, detail in IMPORT_MODES:
            radio = QRadioButton(title, self)
            described(radio, title, detail)
            explain = text_label(detail, "muted", self)
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
        where = text_label(f"Models folder: {target}", "muted", self)
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
        fit_to_screen(self)

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
            self.size_label.setText(f"{path.name} · {decimal_bytes(path.stat().st_size)}")
        else:
            self.size_label.setText(f"{path.name} (folder)")

    def path(self) -> Path:
        return Path(self.path_edit.text().strip()).expanduser()

    def mode(self) -> ImportMode:
        for mode, radio in self.mode_buttons.items():
            if radio.isChecked():
                return mode  # type: ignore[return-value]
        return "copy"
