"""The first start in plain words: what Stoke is, that the model is loading or ready, what this
computer has, one sentence each, with "Start chatting" and "Hardware details…". It opens with
the window, not after the model has loaded: the sentence follows the engine.

A new user should not meet the expert Hardware dialog (devices, micro-batches, `-ot` rules)
before their first message; it stays one click away. The hardware check runs off the UI
thread (`detect` asks ggml in a subprocess), so the welcome opens at once and fills in.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QThreadPool, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.engine.host import EngineState
from app.hardware.detect import Hardware, detect
from app.models.catalog import budget
from app.models.default import default_model_path
from app.models.names import model_name
from app.ui.a11y import described
from app.ui.background import Background
from app.ui.fit import fit_to_screen
from app.units import gib

ABOUT = "Stoke is a chat app that runs language models on this computer: what you type stays here."
CHECKING = "Checking this computer's hardware…"
CHECK_FAILED = "The hardware check did not finish; Hardware details… tries again."


def model_sentence(path: str, ready: bool = True) -> str:
    """Which model answers, and whether it has loaded yet; the bundled one needs no download."""
    if not path:
        return "Stoke chats through the remote server you set up: type a message to start."
    which = "The bundled model" if Path(path) == default_model_path() else "Your model"
    if not ready:
        return (
            f"{which}, {model_name(path)}, is loading: type a message below, and it answers "
            "as soon as the model is ready."
        )
    return f"{which}, {model_name(path)}, is ready: type a message below to start."


def hardware_sentence(hw: Hardware) -> str:
    """What the check found, as one sentence a non-expert reads."""
    ram = gib(hw.memory.total, 1)
    cores = f"{hw.cpu.logical_cores} CPU threads"
    if hw.apple is not None:
        return f"This Mac has an {hw.apple.chip} with {ram} of memory shared with its GPU."
    room = budget(hw)
    if room.gpu_bytes:
        count = len(hw.gpus)
        gpus = f"{count} GPU{'s' if count > 1 else ''} with {gib(room.gpu_bytes, 1)} for models"
        return f"This computer has {cores}, {ram} of RAM and {gpus}."
    if hw.gpus:  # found, but this llama.cpp cannot use them
        return (
            f"This computer has {cores} and {ram} of RAM; its GPU is not used by this build "
            "(Hardware details… says how to change that)."
        )
    return f"This computer has {cores} and {ram} of RAM; models run on the CPU."


class Welcome(QDialog):
    """Shown once, on the first start, instead of the Hardware dialog."""

    hardware_requested = Signal()

    def __init__(self, model_path: str, ready: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model_path = model_path
        self.setWindowTitle("Welcome to Stoke")
        self.setObjectName("welcome")
        column = QVBoxLayout(self)
        column.setContentsMargins(24, 20, 24, 16)
        column.setSpacing(10)
        title = QLabel("Welcome to Stoke", self)
        title.setObjectName("welcome-title")
        font = QFont(title.font())
        font.setPointSizeF(font.pointSizeF() * 1.4)
        font.setBold(True)
        title.setFont(font)
        column.addWidget(title)
        self.about = self._sentence(ABOUT, "What Stoke is")
        self.model = self._sentence(model_sentence(model_path, ready), "The model")
        self.hardware = self._sentence(CHECKING, "This computer")
        for label in (self.about, self.model, self.hardware):
            column.addWidget(label)
        buttons = QHBoxLayout()
        self.details_button = QPushButton("Hardware details…", self)
        described(
            self.details_button, "Hardware details", "The devices, and how the model is placed"
        )
        self.start_button = QPushButton("Start chatting", self)
        self.start_button.setObjectName("primary")
        self.start_button.setDefault(True)
        described(self.start_button, "Start chatting", "Close this and type your first message")
        buttons.addWidget(self.details_button)
        buttons.addStretch(1)
        buttons.addWidget(self.start_button)
        column.addLayout(buttons)
        self.details_button.clicked.connect(self._details)
        self.start_button.clicked.connect(self.accept)
        self.setMinimumWidth(440)
        fit_to_screen(self)
        self._background = Background(self)  # an answer after the welcome closed is dropped
        self._background.run(QThreadPool.globalInstance(), detect, self._found, self._check_failed)

    def _sentence(self, text: str, name: str) -> QLabel:
        label = QLabel(text, self)
        label.setWordWrap(True)
        label.setAccessibleName(name)
        return label

    def engine_state(self, state: EngineState) -> None:
        """The model sentence follows the engine: loading, then ready."""
        ready = state == EngineState.READY
        self.model.setText(model_sentence(self._model_path, ready))

    def _found(self, hw: Hardware) -> None:
        self.hardware.setText(hardware_sentence(hw))

    def _check_failed(self, _message: str) -> None:
        self.hardware.setText(CHECK_FAILED)

    def checked(self) -> bool:
        """The hardware sentence is final (found, or the check failed)."""
        return self.hardware.text() != CHECKING

    def _details(self) -> None:
        self.accept()
        self.hardware_requested.emit()
