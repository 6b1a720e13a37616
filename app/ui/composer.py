"""The message composer: Enter sends, Shift+Enter adds a line, Stop while a reply streams.
Send waits (disabled, saying why) while something the message needs is not ready yet, such
as an attached file still being read. A picture pasted into it is attached, not typed."""

from __future__ import annotations

from PySide6.QtCore import QMimeData, Qt, QTimer, Signal
from PySide6.QtGui import QImage, QKeyEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

DRAFT_SAVE_MS = 400
SEND_TIP = "Send (Enter)"


class _Editor(QPlainTextEdit):
    """A plain-text box whose Enter means send (Shift+Enter: a new line), and where a pasted
    picture (the clipboard holds an image and no text) goes to `image_pasted`."""

    submit = Signal()
    image_pasted = Signal(QImage)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return source.hasImage() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        if source.hasImage() and not source.hasText():
            image = QImage(source.imageData())
            if not image.isNull():
                self.image_pasted.emit(image)
                return
        super().insertFromMimeData(source)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submit.emit()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    """Where the user types. Emits the draft as it changes (for saving and prewarming) and
    the message on send; shows Stop instead of Send while a reply streams."""

    send_requested = Signal(str)
    stop_requested = Signal()
    draft_changed = Signal(str)  # immediately, for prewarming
    draft_settled = Signal(str)  # after a pause, for saving

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("composer")
        self.editor = _Editor(self)
        self.editor.setObjectName("composer-editor")
        self.editor.setAccessibleName("Message")
        self.editor.setPlaceholderText("Message Stoke — Enter sends, Shift+Enter adds a line")
        self.editor.setTabChangesFocus(True)
        self.editor.setFixedHeight(84)
        self.send_button = QPushButton("Send", self)
        self.send_button.setAccessibleName("Send message")
        self.send_button.setToolTip(SEND_TIP)
        self.send_button.setDefault(True)
        self._held = ""  # why Send waits, if it does
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setAccessibleName("Stop the reply")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.hide()
        self.warm = QLabel("", self)
        self.warm.setObjectName("warm-indicator")
        self.warm.setAccessibleName("Draft prefill state")
        self.warm.setToolTip("Stoke prefills what you type, so the reply starts sooner")

        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        buttons.addWidget(self.warm, alignment=Qt.AlignmentFlag.AlignRight)
        row = QHBoxLayout(self)
        row.setContentsMargins(16, 8, 16, 12)
        row.setSpacing(10)
        row.addWidget(self.editor, 1)
        row.addLayout(buttons)

        self._settle = QTimer(self)
        self._settle.setSingleShot(True)
        self._settle.setInterval(DRAFT_SAVE_MS)
        self._settle.timeout.connect(lambda: self.draft_settled.emit(self.text()))
        self._loading = False
        self.editor.submit.connect(self._submit)
        self.send_button.clicked.connect(self._submit)
        self.stop_button.clicked.connect(self.stop_requested)
        self.editor.textChanged.connect(self._changed)

    def text(self) -> str:
        return self.editor.toPlainText()

    def settled_text(self) -> str:
        """The text, its pending save taken over by the caller: the pause's timer stops, so
        it cannot fire later (after the window closed, into a closed store)."""
        self._settle.stop()
        return self.text()

    def set_draft(self, text: str) -> None:
        """Show a saved draft without treating it as typing."""
        self._loading = True
        try:
            self.editor.setPlainText(text)
            self.editor.moveCursor(self.editor.textCursor().MoveOperation.End)
        finally:
            self._loading = False
        self.set_warm(False)

    def set_generating(self, generating: bool) -> None:
        self.send_button.setVisible(not generating)
        self.stop_button.setVisible(generating)

    def hold_send(self, reason: str) -> None:
        """Disable Send (and Enter) with `reason` as its tooltip; "" enables it again."""
        self._held = reason
        self.send_button.setEnabled(not reason)
        self.send_button.setToolTip(reason or SEND_TIP)

    def set_warm(self, warm: bool) -> None:
        self.warm.setText("● warm" if warm else "")

    def focus(self) -> None:
        self.editor.setFocus()

    def _changed(self) -> None:
        if self._loading:
            return
        self.set_warm(False)
        self.draft_changed.emit(self.text())
        self._settle.start()

    def _submit(self) -> None:
        text = self.text()
        if not text.strip() or self.stop_button.isVisible() or self._held:
            return
        self.send_requested.emit(text)
