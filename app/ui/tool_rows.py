"""Tool calls and tool results in the chat: one collapsed row each, opened on demand.

An assistant message's calls are rows inside its bubble ("Called get_weather"); opened, a
row shows the arguments as indented JSON. While the window's tool loop runs a call, its row
says the call's state after its name ("Called get_weather · running 1.5 s": waiting for
approval, running, done, failed, denied, cancelled). A tool message is a row of its own under
the call ("Result of get_weather · done, 0.4 s": how a loop's call ended, and its seconds);
opened, it shows the result's text (the whole of it where the model read it cut), a long one
cut to its first lines with a button to show all of it. The last result of a tool turn left
unfinished has Continue under it. Rows start closed (tools are an advanced feature: the
conversation reads as a conversation), are reached and opened with the keyboard (Tab, Space),
and say what they hold to screen readers. Colours come from chat.qss, like the rest of the
chat.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QToolButton, QVBoxLayout, QWidget

from app.conversations import ToolCall
from app.conversations.tool_records import fenced, pretty_arguments
from app.ui.a11y import described
from app.ui.message_text import MessageText
from app.ui.message_view import MessageView

ENDED = ("done", "failed", "denied", "cancelled")  # a loop's call as stored (app/tool_loop)
SHOWN_LINES = 24  # a result longer than this opens cut to its first lines
SHOWN_CHARS = 2_000  # or to this many characters, whichever comes first


def shortened(text: str) -> str | None:
    """The head of a long text to show first, or None when it is short enough whole."""
    lines = text.splitlines()
    if len(lines) <= SHOWN_LINES and len(text) <= SHOWN_CHARS:
        return None
    head = "\n".join(lines[:SHOWN_LINES])[:SHOWN_CHARS]
    return head.rstrip() + "\n…"


class ToolRow(QWidget):
    """A disclosure: "▸ title" closed; opened, the text under it as a code block."""

    copy_requested = Signal(str)

    def __init__(
        self, title: str, what: str, text: str, language: str, *, dark: bool, parent: QWidget
    ) -> None:
        super().__init__(parent)
        self.setObjectName("toolRow")
        self._title, self._what = title, what
        self._state = ""
        self._text, self._language = text, language
        self._dark = dark
        self._whole = False  # the long text shown in full
        self.toggle = QToolButton(self)
        self.toggle.setObjectName("toolToggle")
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setCursor(Qt.CursorShape.PointingHandCursor)
        self.toggle.toggled.connect(self._opened)
        self.body: QFrame | None = None
        self.body_text: MessageText | None = None
        self.show_all: QToolButton | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        self._label()

    @property
    def is_open(self) -> bool:
        return self.toggle.isChecked()

    @property
    def state(self) -> str:
        return self._state

    def set_dark(self, dark: bool) -> None:
        if dark != self._dark:
            self._dark = dark
            if self.body_text is not None:
                self._render()

    def set_state(self, state: str) -> None:
        """What the call is doing now, in words after the title ("" for nothing)."""
        self._state = state
        self._label()

    def _label(self) -> None:
        shown = self.is_open
        title = f"{self._title} · {self._state}" if self._state else self._title
        self.toggle.setText(f"{'▾' if shown else '▸'}  {title}")
        verb = "Hide" if shown else "Show"
        what = f"{self._what} ({self._state})" if self._state else self._what
        described(self.toggle, f"{verb} {what}", f"{verb} {what}")

    def _opened(self, shown: bool) -> None:
        if shown and self.body is None:
            self._build_body()
        if self.body is not None:
            self.body.setVisible(shown)
        self._label()

    def _build_body(self) -> None:
        """Made the first time the row opens: a long conversation of closed rows builds no
        text views."""
        self.body = QFrame(self)
        self.body.setObjectName("toolBody")
        layout = QVBoxLayout(self.body)
        layout.setContentsMargins(12, 2, 0, 2)
        layout.setSpacing(2)
        name = self._what[:1].upper() + self._what[1:]  # capitalize() would lower the rest
        self.body_text = MessageText("toolText", name, self.body)
        # its one code block's Copy copies the whole text, also while only its head shows
        self.body_text.copy_requested.connect(lambda _shown: self.copy_requested.emit(self._text))
        layout.addWidget(self.body_text)
        if shortened(self._text) is not None:
            self.show_all = described(
                QToolButton(self.body),
                "Show all of the text",
                f"Show all {len(self._text):,} characters",
            )
            self.show_all.setObjectName("showAllButton")
            self.show_all.setText(f"Show all {len(self._text):,} characters")
            self.show_all.setAutoRaise(True)
            self.show_all.clicked.connect(self._show_whole)
            layout.addWidget(self.show_all, 0, Qt.AlignmentFlag.AlignLeft)
        self.layout().addWidget(self.body)
        self._render()

    def _show_whole(self) -> None:
        self._whole = True
        if self.show_all is not None:
            self.show_all.hide()
            self.toggle.setFocus()  # the button that had the focus is gone
        self._render()

    def _render(self) -> None:
        head = None if self._whole else shortened(self._text)
        if self.body_text is not None:
            self.body_text.show_markdown(
                fenced(head or self._text, self._language), dark=self._dark
            )


def call_row(call: ToolCall, *, dark: bool, parent: QWidget) -> ToolRow:
    """One call of an assistant message: its function, and the arguments when opened."""
    return ToolRow(
        f"Called {call.name}",
        f"the arguments of {call.name}",
        pretty_arguments(call.arguments),
        "json",
        dark=dark,
        parent=parent,
    )


def result_state(message: MessageView) -> str:
    """How a call of a tool loop ended, for its result's row, with its seconds when kept
    ("done, 0.4 s"); "" for a result from elsewhere (an import, the API server)."""
    state = message.finish_reason
    if state not in ENDED:
        return ""
    seconds = (message.stats or {}).get("elapsed_s")
    return f"{state}, {seconds:.1f} s" if isinstance(seconds, int | float) else str(state)


class ToolResultWidget(QWidget):
    """A tool message in the conversation: one result row, under the call it answers.

    It stands where the chat view puts a message (objectName "message", its id as the
    messageId property), and has the little of a message widget the view calls on it."""

    copy_requested = Signal(str)
    continue_requested = Signal(str)  # a tool turn left unfinished here goes on

    def __init__(self, message: MessageView, *, dark: bool, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName("message")
        self.setProperty("messageId", message.id)
        self.message = message
        self.is_user = False
        self._dark = dark
        self.frame = QFrame(self)
        self.frame.setObjectName("toolResult")
        self.frame.setAccessibleName("Tool result")
        frame_layout = QVBoxLayout(self.frame)
        frame_layout.setContentsMargins(12, 4, 12, 4)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.frame)
        self.continue_button = described(
            QToolButton(self), "Continue the turn", "Let the model go on from this result"
        )
        self.continue_button.setObjectName("continueButton")
        self.continue_button.setText("Continue")
        self.continue_button.setAutoRaise(True)
        self.continue_button.clicked.connect(lambda: self.continue_requested.emit(self.message.id))
        outer.addWidget(self.continue_button, 0, Qt.AlignmentFlag.AlignLeft)
        self.row: ToolRow | None = None
        self._build_row()

    def set_message(self, message: MessageView) -> None:
        if message != self.message:
            self.message = message
            self._build_row()

    def set_dark(self, dark: bool) -> None:
        self._dark = dark
        if self.row is not None:
            self.row.set_dark(dark)

    def _build_row(self) -> None:
        if self.row is not None:
            self.row.hide()
            self.row.deleteLater()
        name = self.message.tool_name
        stats = self.message.stats or {}
        self.row = ToolRow(
            f"Result of {name}" if name else "Tool result",
            f"the result of {name}" if name else "the tool result",
            str(stats.get("shown") or self.message.content),
            "text",
            dark=self._dark,
            parent=self.frame,
        )
        self.row.set_state(result_state(self.message))
        self.continue_button.setVisible(self.message.resumable)
        self.row.copy_requested.connect(self.copy_requested)
        self.frame.layout().addWidget(self.row)
