"""The conversation on screen: message bubbles, streaming replies and per-message actions.

Pure Qt, fed with MessageView objects; it never touches the store or the engine. It speaks
back only through signals, so the window decides what an edit or a regeneration means.

Long conversations stay responsive because only the newest page of messages gets widgets;
older pages are built when the user scrolls to the top, and the view keeps its distance
from the bottom while they are prepended so the text under the reader does not jump. A
drag of the scroll bar's handle to the top, or Ctrl+Home, builds page after page (one per
turn of the event loop) until the first message, and stays at the top. A tool result is a
closed row of its own, and a reply's tool calls closed rows in its bubble (tool_rows.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QStackedLayout,
    QVBoxLayout,
    QWidget,
)

from app.ui import theme
from app.ui.message_view import MessageView
from app.ui.message_widget import COLUMN_MAX_PX, MessageWidget
from app.ui.tool_rows import ToolResultWidget

PAGE_SIZE = 40
EMPTY_HINT = "Start a conversation — type below. Enter sends, Shift+Enter adds a line."
_STREAM_RENDER_MS = 50
_BOTTOM_SLACK_PX = 8
_EDIT_MARGIN_PX = 12  # room kept above a message whose editor opens


@dataclass(frozen=True)
class _Theme:
    """The chat's colours, the names chat.qss fills in."""

    background: str
    text: str
    subdued: str
    accent: str
    on_accent: str
    user_bubble: str
    assistant_bubble: str
    border: str
    hover: str
    warning: str


def _mix(a: QColor, b: QColor, t: float) -> QColor:
    """a over b at opacity t, resolved to an opaque colour (stylesheets blend poorly)."""
    return QColor.fromRgbF(
        a.redF() * t + b.redF() * (1 - t),
        a.greenF() * t + b.greenF() * (1 - t),
        a.blueF() * t + b.blueF() * (1 - t),
    )


def _theme(palette: QPalette, dark: bool) -> _Theme:
    """Colours from the palette, unless the palette has not followed the requested theme."""
    fallback = theme.CHAT["dark" if dark else "light"]
    base = palette.color(QPalette.ColorRole.Base)
    text = palette.color(QPalette.ColorRole.Text)
    if (base.lightness() < 128) != dark:
        base, text = QColor(fallback["base"]), QColor(fallback["text"])
    accent = palette.color(QPalette.ColorRole.Highlight)
    return _Theme(
        background=base.name(),
        text=text.name(),
        subdued=_mix(text, base, 0.62).name(),
        accent=accent.name(),
        on_accent=palette.color(QPalette.ColorRole.HighlightedText).name(),
        user_bubble=_mix(accent, base, 0.30 if dark else 0.13).name(),
        assistant_bubble=_mix(text, base, 0.075 if dark else 0.045).name(),
        border=_mix(text, base, 0.2).name(),
        hover=_mix(text, base, 0.12).name(),
        warning=fallback["warning"],
    )


class ChatView(QWidget):
    """The branch of a conversation on screen, with a streaming reply at its end."""

    edit_requested = Signal(str, str)
    regenerate_requested = Signal(str)
    branch_requested = Signal(str)
    continue_requested = Signal(str)
    copied = Signal(str)

    def __init__(self, parent: QWidget | None = None, *, dark: bool = False) -> None:
        super().__init__(parent)
        self.setObjectName("chatView")
        self.setAccessibleName("Conversation")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self._dark = dark
        self._messages: list[MessageView] = []
        self._first_loaded = 0
        self._widgets: dict[str, MessageWidget | ToolResultWidget] = {}
        self._dirty: set[str] = set()
        self._pinned = True
        self._anchor_from_bottom: int | None = None
        self._to_start = False  # building every page down to the first, staying at the top
        self._adjusting = False
        self._found: str | None = None  # a search hit's message: marked
        self._to_found = False  # kept at the top while the pages above it settle

        self._stream_timer = QTimer(self)
        self._stream_timer.setSingleShot(True)
        self._stream_timer.setInterval(_STREAM_RENDER_MS)
        self._stream_timer.timeout.connect(self._flush_stream)

        self._empty = QLabel(EMPTY_HINT, self)
        self._empty.setObjectName("emptyHint")
        self._empty.setAccessibleName("Empty conversation")
        self._empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._empty.setWordWrap(True)
        self._empty.setContentsMargins(32, 32, 32, 32)

        self._scroll = QScrollArea(self)
        self._scroll.setObjectName("chatScroll")
        self._scroll.setAccessibleName("Messages")
        self._scroll.setWidgetResizable(True)
        self._scroll.setFrameShape(QFrame.Shape.NoFrame)
        self._scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        canvas = QWidget()
        canvas.setObjectName("chatCanvas")
        centering = QHBoxLayout(canvas)
        centering.setContentsMargins(16, 20, 16, 20)
        self._column = QVBoxLayout()
        self._column.setSpacing(18)
        self._column.addStretch(1)
        column = QWidget(canvas)
        column.setMaximumWidth(COLUMN_MAX_PX)
        column.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        column.setLayout(self._column)
        self._column.setContentsMargins(0, 0, 0, 0)
        centering.addStretch(1)
        centering.addWidget(column, 100)
        centering.addStretch(1)
        self._canvas_column = column
        self._scroll.setWidget(canvas)

        bar = self._scroll.verticalScrollBar()
        bar.rangeChanged.connect(self._range_changed)
        bar.valueChanged.connect(self._value_changed)

        self._stack = QStackedLayout(self)
        self._stack.addWidget(self._empty)
        self._stack.addWidget(self._scroll)
        self._apply_theme()

    # -- public API ---------------------------------------------------------------------

    def set_messages(self, messages: list[MessageView]) -> None:
        """Show a branch. Widgets of unchanged messages are kept, so switching is cheap."""
        messages = list(messages)
        same_conversation = bool(
            self._messages and messages and self._messages[0].id == messages[0].id
        )
        start = max(0, len(messages) - PAGE_SIZE)
        if same_conversation:
            start = min(start, self._first_loaded)
        old = self._widgets
        for widget in old.values():
            self._column.removeWidget(widget)
        self._widgets = {}
        self._dirty.clear()
        for position, message in enumerate(messages[start:]):
            widget = old.pop(message.id, None)
            if widget is None or widget.message.role != message.role:
                widget = self._make_widget(message)
            else:
                widget.set_message(message)
            self._column.insertWidget(position, widget)
            self._widgets[message.id] = widget
        for widget in old.values():
            self._discard(widget)
        self._messages = messages
        self._first_loaded = start
        if not same_conversation:
            self._found, self._to_found = None, False
            self._anchor_from_bottom = None
            self._to_start = False
            self._pinned = True
            self._scroll_to_bottom()
        self._stack.setCurrentWidget(self._scroll if messages else self._empty)

    def begin_reply(self, message: MessageView) -> None:
        """Start showing a streaming reply (a new one, or one being continued)."""
        widget = self._widgets.get(message.id)
        position = self._index_of(message.id)
        if position is None:
            self._messages.append(message)
            widget = self._make_widget(message)
            self._column.insertWidget(len(self._widgets), widget)
            self._widgets[message.id] = widget
        else:
            self._messages[position] = message
            if widget is not None:
                widget.set_message(message)
        self._stack.setCurrentWidget(self._scroll)

    def append_reply(self, message_id: str, text_piece: str) -> None:
        """Queue a streamed piece; the bubble re-renders at most every ~50 ms."""
        widget = self._widgets.get(message_id)
        if widget is None:
            return
        widget.append(text_piece)
        self._dirty.add(message_id)
        if not self._stream_timer.isActive():
            self._stream_timer.start()

    def edit_message(self, message_id: str) -> None:
        """Open the inline editor of a user message on screen (a banner's "Shorten it")."""
        widget = self._widgets.get(message_id)
        if widget is not None and widget.is_user:
            widget.begin_edit()

    def show_progress(self, message_id: str, done: int, total: int) -> None:
        """How far the engine has read the prompt of a streaming reply."""
        widget = self._widgets.get(message_id)
        if widget is not None:
            widget.set_progress(done, total)

    def set_call_state(self, call_id: str, state: str) -> None:
        """Show what tool call `call_id` is doing on its row (tool_rows.py), if it is on screen."""
        for widget in self._widgets.values():
            if isinstance(widget, MessageWidget) and widget.set_call_state(call_id, state):
                return

    def finish_reply(self, message: MessageView) -> None:
        """Show the final saved state of a reply: full text, status, stats."""
        self._dirty.discard(message.id)
        position = self._index_of(message.id)
        if position is not None:
            self._messages[position] = message
        widget = self._widgets.get(message.id)
        if widget is not None:
            widget.set_message(message)

    def show_message(self, message_id: str) -> None:
        """Scroll to a message of the branch shown (a search hit opened), building the pages
        down to it, and mark it until another is found or the conversation changes."""
        position = self._index_of(message_id)
        if position is None:
            return
        while self._first_loaded > position:
            self._load_earlier()
        self._mark(self._found, False)
        self._found = message_id
        self._mark(message_id, True)
        self._to_start = False
        self._anchor_from_bottom = None
        self._pinned = False
        self._to_found = True
        self._scroll_to_found()

    def scroll_to_end(self) -> None:
        """Show the newest message and follow the conversation from there (a send, Ctrl+End)."""
        self._to_found = False
        self._to_start = False
        self._anchor_from_bottom = None
        self._pinned = True
        self._scroll_to_bottom()

    def scroll_to_start(self) -> None:
        """Show the first message, building the older pages on the way (Ctrl+Home)."""
        self._to_found = False
        self._to_start = True
        self._anchor_from_bottom = None
        self._pinned = False
        self._set_scroll(0)
        self._load_next_page_to_start()

    def loaded_from(self) -> int:
        """The index of the first message that has a widget (0: all of them)."""
        return self._first_loaded

    def set_dark(self, dark: bool) -> None:
        """Switch the colours and re-render code highlighting for the other theme."""
        self._dark = dark
        self._apply_theme()
        for widget in self._widgets.values():
            widget.set_dark(dark)

    # -- internals ----------------------------------------------------------------------

    def _apply_theme(self) -> None:
        colors = _theme(QGuiApplication.palette(), self._dark)
        self.setStyleSheet(theme.stylesheet("chat.qss", **asdict(colors)))

    def _make_widget(self, message: MessageView) -> MessageWidget | ToolResultWidget:
        if message.role == "tool":
            result = ToolResultWidget(message, dark=self._dark, parent=self._canvas_column)
            result.copy_requested.connect(self._copy)
            result.continue_requested.connect(self.continue_requested)
            return result
        widget = MessageWidget(message, dark=self._dark, parent=self._canvas_column)
        widget.copy_requested.connect(self._copy)
        widget.edit_requested.connect(self.edit_requested)
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.branch_requested.connect(self.branch_requested)
        widget.continue_requested.connect(self.continue_requested)
        widget.edit_started.connect(lambda w=widget: self._reveal_editor(w))
        return widget

    def _reveal_editor(self, widget: MessageWidget) -> None:
        """An editor opened above the fold (the first message) is scrolled to, not left under
        the top edge; the view stops following the bottom while it is open."""
        self._pinned = False
        self._anchor_from_bottom = None
        self._to_start = False
        QTimer.singleShot(0, lambda: self._scroll_to_top_of(widget))

    def _mark(self, message_id: str | None, found: bool) -> None:
        widget = self._widgets.get(message_id) if message_id else None
        if widget is None:
            return
        widget.setProperty("found", found)
        for frame in widget.findChildren(QFrame):  # the bubble, or a tool result's frame
            frame.style().unpolish(frame)
            frame.style().polish(frame)

    def _scroll_to_found(self) -> None:
        """The found message's top near the view's top; again as the pages above it settle."""
        widget = self._widgets.get(self._found) if self._found else None
        if widget is not None:
            top = widget.mapTo(self._scroll.widget(), widget.rect().topLeft()).y()
            bar = self._scroll.verticalScrollBar()
            self._set_scroll(max(0, min(top - _EDIT_MARGIN_PX, bar.maximum())))

    def _scroll_to_top_of(self, widget: MessageWidget) -> None:
        bar = self._scroll.verticalScrollBar()
        top = widget.mapTo(self._scroll.widget(), widget.rect().topLeft()).y() - _EDIT_MARGIN_PX
        bottom = top + widget.height() + 2 * _EDIT_MARGIN_PX
        if top < bar.value() or bottom > bar.value() + self._scroll.viewport().height():
            self._set_scroll(max(0, min(top, bar.maximum())))

    @staticmethod
    def _discard(widget: QWidget) -> None:
        widget.hide()
        widget.setParent(None)
        widget.deleteLater()

    def _index_of(self, message_id: str) -> int | None:
        for position in range(len(self._messages) - 1, -1, -1):
            if self._messages[position].id == message_id:
                return position
        return None

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(text)

    def _flush_stream(self) -> None:
        if not self._pinned:
            self._anchor_from_bottom = None  # growth below must not drag the reader along
        for message_id in self._dirty:
            widget = self._widgets.get(message_id)
            if widget is not None:
                widget.flush()
                position = self._index_of(message_id)
                if position is not None:
                    self._messages[position] = widget.message
        self._dirty.clear()

    def _load_earlier(self) -> None:
        """Build the previous page above what is shown, keeping the reader's place."""
        if self._first_loaded == 0:
            return
        bar = self._scroll.verticalScrollBar()
        self._anchor_from_bottom = bar.maximum() - bar.value()
        start = max(0, self._first_loaded - PAGE_SIZE)
        for position, message in enumerate(self._messages[start : self._first_loaded]):
            widget = self._make_widget(message)
            self._column.insertWidget(position, widget)
            self._widgets[message.id] = widget
        self._first_loaded = start

    def _scroll_to_bottom(self) -> None:
        bar = self._scroll.verticalScrollBar()
        self._set_scroll(bar.maximum())

    def _set_scroll(self, value: int) -> None:
        self._adjusting = True
        try:
            self._scroll.verticalScrollBar().setValue(value)
        finally:
            self._adjusting = False

    def _load_next_page_to_start(self) -> None:
        if not self._to_start or self._first_loaded == 0:
            return
        self._load_earlier()
        self._anchor_from_bottom = None  # the top is where the reader goes
        QTimer.singleShot(0, self._load_next_page_to_start)

    def _range_changed(self, _minimum: int, maximum: int) -> None:
        if self._to_found:
            self._scroll_to_found()
        elif self._to_start:
            self._set_scroll(0)
        elif self._anchor_from_bottom is not None:
            self._set_scroll(maximum - self._anchor_from_bottom)
        elif self._pinned:
            self._set_scroll(maximum)
        if maximum == 0 and self._first_loaded > 0:
            QTimer.singleShot(0, self._fill_viewport)

    def _fill_viewport(self) -> None:
        """When the loaded page is shorter than the window there is no top to scroll to."""
        fits = self._canvas_column.sizeHint().height() < self._scroll.viewport().height()
        if fits and self._scroll.verticalScrollBar().maximum() == 0 and self.isVisible():
            self._load_earlier()

    def _value_changed(self, value: int) -> None:
        if self._adjusting:
            return
        bar = self._scroll.verticalScrollBar()
        self._anchor_from_bottom = None
        self._to_start = self._to_found = False
        self._pinned = value >= bar.maximum() - _BOTTOM_SLACK_PX
        if value == bar.minimum() and self._first_loaded > 0:
            if bar.isSliderDown():  # the handle dragged to the top: the start is wanted
                self.scroll_to_start()
            else:
                self._load_earlier()
