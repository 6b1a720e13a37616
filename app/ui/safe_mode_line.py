"""The line at the top of the settings panel that says the loaded model is in safe mode.

A model whose load crashed here loads with conservative settings while its load settings stay
those that crashed (app/engine/safe_mode.py). The line says so in the engine's words, shown
only while such a record applies, and its Clear button forgets the record and asks the window
to reload the model with its own settings. It talks to the engine client alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from app.engine.host import EngineState

# States after which a record may have appeared (a crash) or stopped applying (a new load).
_REFRESH = frozenset({EngineState.READY, EngineState.CRASHED, EngineState.FAILED})


class SafeModeEngine(Protocol):
    """What the line uses of the engine client."""

    def safe_mode(self) -> str | None: ...

    def clear_safe_mode(self) -> None: ...

    def add_state_listener(self, listener: Callable[[EngineState, str], None]) -> None: ...


class SafeModeLine(QFrame):
    """Shown while the loaded model follows a safe-mode record; Clear forgets it."""

    cleared = Signal()  # the record is gone: the model should load again with its settings

    def __init__(self, engine: SafeModeEngine, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("safe-mode-line")
        self.setAccessibleName("Safe mode")
        self._engine = engine
        self.text = QLabel(self)
        self.text.setWordWrap(True)
        self.clear_button = QPushButton("Clear", self)
        self.clear_button.setAccessibleName("Clear safe mode")
        self.clear_button.setToolTip(
            "Forget this crash: the model loads again with its own settings"
        )
        row = QHBoxLayout(self)
        row.setContentsMargins(14, 10, 14, 4)
        row.addWidget(self.text, 1)
        row.addWidget(self.clear_button)
        self.clear_button.clicked.connect(self._clear)
        engine.add_state_listener(self._state)
        self.refresh()

    def refresh(self) -> None:
        """Show the record that applies now, or hide."""
        words = self._engine.safe_mode()
        self.text.setText(f"Safe mode: {words}" if words else "")
        self.setVisible(bool(words))

    def _state(self, state: EngineState, _detail: str) -> None:
        if state in _REFRESH:
            self.refresh()

    def _clear(self) -> None:
        self._engine.clear_safe_mode()
        self.refresh()
        self.cleared.emit()
