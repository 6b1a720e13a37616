"""The header above the chat: the model, the engine's state, the KV cache, the title.

Every label here elides (app.ui.elided), so no text can widen the window. The model sits
in one slot (`model_slot`) that `set_model_widget` can fill with a richer widget, such as a
model picker, without touching the rest of the row.
"""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QWidget

from app.ui.elided import ElidedLabel

STATE_PADDING_PX = 24  # the chip's padding in app.qss, both sides, and its border
WARM_TIP = "The conversation's KV cache is loaded: the next turn starts at once"


class Header(QWidget):
    """Model, state chip and cache state on the left; the conversation's title on the right."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("header")
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(16, 10, 16, 10)
        self.model_label = ElidedLabel("", self)
        self.model_label.setObjectName("model-name")
        self.model_label.setAccessibleName("Current model")
        self.model_slot: QWidget = self.model_label
        # The chip is as wide as its text; its slot is as wide as the longest state, so a
        # state change neither moves the row nor stretches the pill.
        self._state_slot = QWidget(self)
        slot_row = QHBoxLayout(self._state_slot)
        slot_row.setContentsMargins(0, 0, 0, 0)
        self.state_label = QLabel("", self._state_slot)  # a few words at most: never elided
        self.state_label.setObjectName("engine-state")
        self.state_label.setAccessibleName("Engine state")
        self.state_label.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        slot_row.addWidget(self.state_label)
        slot_row.addStretch(1)
        self.warm_label = ElidedLabel("", self)
        self.warm_label.setObjectName("warm-indicator")
        self.warm_label.setAccessibleName("Conversation cache state")
        self.warm_label.setToolTip(WARM_TIP)
        self.title_label = ElidedLabel("", self)
        self.title_label.setObjectName("conversation-title")
        self.title_label.setAccessibleName("Conversation title")
        self.title_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self._row.addWidget(self.model_slot)
        self._row.addWidget(self._state_slot)
        self._row.addWidget(self.warm_label)
        self._row.addWidget(self.title_label, 1)

    def reserve_state_width(self, texts: Iterable[str]) -> None:
        """Size the chip's slot for its longest text, so a state change never moves the
        row or raises the window's minimum width; the chip itself stays as wide as its text."""
        self.state_label.ensurePolished()
        metrics = self.state_label.fontMetrics()
        widest = max((metrics.horizontalAdvance(text) for text in texts), default=0)
        self._state_slot.setMinimumWidth(widest + STATE_PADDING_PX)
        self._state_slot.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Preferred)
        self.state_label.setAlignment(Qt.AlignmentFlag.AlignCenter)

    def set_model_widget(self, widget: QWidget) -> None:
        """Put `widget` where the model is shown (the label stays, hidden, for its text)."""
        self._row.replaceWidget(self.model_slot, widget)
        if self.model_slot is not self.model_label:
            self.model_slot.deleteLater()
        self.model_label.hide()
        widget.setParent(self)
        widget.show()
        self.model_slot = widget
