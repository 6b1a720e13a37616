"""The conversation on screen: message bubbles, streaming replies and per-message actions.

Pure Qt, fed with MessageView objects; it never touches the store or the engine. It speaks
back only through signals, so the window decides what an edit or a regeneration means.

Long conversations stay responsive because only the newest page of messages gets widgets;
older pages are built when the user scrolls to the top, and the view keeps its distance
from the bottom while they are prepended so the text under the reader does not jump.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QGuiApplication,
    QKeyEvent,
    QPalette,
    QTextCursor,
    QWheelEvent,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QStackedLayout,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui import markdown
from app.ui.models import MessageView

PAGE_SIZE = 40
EMPTY_HINT = "Start a conversation — type below. Enter sends, Shift+Enter adds a line."
_STREAM_RENDER_MS = 50
_COLUMN_MAX_PX = 760
_USER_BUBBLE_RATIO = 0.82
_BOTTOM_SLACK_PX = 8
_EDITOR_MIN_PX = 64
_EDITOR_MAX_PX = 280


@dataclass(frozen=True)
class _Theme:
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
    base = palette.color(QPalette.ColorRole.Base)
    text = palette.color(QPalette.ColorRole.Text)
    if (base.lightness() < 128) != dark:
        base, text = (
            (QColor("#1b1c20"), QColor("#e6e7ea"))
            if dark
            else (QColor("#ffffff"), QColor("#1f2328"))
        )
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
        warning="#e3b341" if dark else "#9a6700",
    )


def _stylesheet(t: _Theme) -> str:
    return f"""
    QWidget#chatView, QScrollArea#chatScroll, QWidget#chatCanvas {{
        background: {t.background}; border: none;
    }}
    QFrame#messageBubble {{ border-radius: 14px; }}
    QFrame#messageBubble[role="user"] {{ background: {t.user_bubble}; }}
    QFrame#messageBubble[role="assistant"] {{ background: {t.assistant_bubble}; }}
    QTextBrowser {{
        background: transparent; border: none; color: {t.text};
        selection-background-color: {t.accent}; selection-color: {t.on_accent};
    }}
    QTextBrowser#reasoningText {{ color: {t.subdued}; }}
    QToolButton {{
        color: {t.subdued}; background: transparent; border: none;
        border-radius: 6px; padding: 3px 7px;
    }}
    QToolButton:hover {{ color: {t.text}; background: {t.hover}; }}
    QToolButton:disabled {{ color: {t.border}; }}
    QToolButton#reasoningToggle {{ padding: 2px 6px 2px 0px; }}
    QToolButton#reasoningToggle:hover {{ background: transparent; }}
    QFrame#reasoningFrame {{ border: none; border-left: 2px solid {t.border}; }}
    QToolButton#continueButton {{ color: {t.accent}; font-weight: 600; }}
    QLabel#messageMeta, QLabel#branchLabel {{ color: {t.subdued}; }}
    QLabel#statusMark {{ color: {t.warning}; font-weight: 600; }}
    QLabel#emptyHint {{ color: {t.subdued}; font-size: 15px; }}
    QPlainTextEdit#messageEditor {{
        background: {t.background}; color: {t.text}; border: 1px solid {t.border};
        border-radius: 8px; padding: 6px;
        selection-background-color: {t.accent}; selection-color: {t.on_accent};
    }}
    QPushButton {{
        color: {t.text}; background: transparent; border: 1px solid {t.border};
        border-radius: 7px; padding: 5px 14px;
    }}
    QPushButton:hover {{ background: {t.hover}; }}
    QPushButton#sendEdit {{ color: {t.on_accent}; background: {t.accent}; border: none; }}
    QPushButton#sendEdit:disabled {{ background: {t.border}; }}
    """


def stats_summary(stats: dict | None) -> str:
    """One line a person can read: TTFT, prefill and decode speed, how much was reused."""
    if not stats:
        return ""
    parts = []
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {stats['ttft_s']:.2f} s")
    if stats.get("prefill_tok_s"):
        parts.append(f"prefill {stats['prefill_tok_s']:,.0f} tok/s")
    if stats.get("decode_tok_s"):
        parts.append(f"decode {stats['decode_tok_s']:,.0f} tok/s")
    if stats.get("prompt_tokens") and stats.get("reused_tokens") is not None:
        parts.append(f"reused {stats['reused_tokens']:,} of {stats['prompt_tokens']:,}")
    if stats.get("generated_tokens"):
        parts.append(f"{stats['generated_tokens']:,} tokens")
    if stats.get("finish_reason") not in (None, "stop"):
        parts.append(f"stopped: {stats['finish_reason']}")
    return " · ".join(parts)


def _short_stats(stats: dict | None) -> str:
    """The two numbers worth seeing without hovering."""
    if not stats:
        return ""
    parts = []
    if stats.get("decode_tok_s"):
        parts.append(f"{stats['decode_tok_s']:,.0f} tok/s")
    if stats.get("ttft_s") is not None:
        parts.append(f"{stats['ttft_s']:.2f} s to first token")
    return " · ".join(parts)


class _MessageText(QTextBrowser):
    """Markdown exactly as tall as its content: the conversation scrolls, never a bubble."""

    copy_requested = Signal(str)

    def __init__(self, name: str, accessible_name: str, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName(name)
        self.setAccessibleName(accessible_name)
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        font = self.font()
        font.setPointSizeF(font.pointSizeF() + 1)  # prose reads better a step above UI text
        self.setFont(font)
        self.document().setDocumentMargin(0)
        self.document().setIndentWidth(18)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self.anchorClicked.connect(self._anchor_clicked)
        self.code_blocks: tuple[str, ...] = ()
        self._natural_width = 0
        self._fit_max = 0

    def fit_content_width(self, max_width: int) -> None:
        """Hug the text (user bubbles) instead of filling the column."""
        self._fit_max = max_width
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)

    def show_markdown(self, text: str, *, dark: bool) -> None:
        rendered = markdown.render(text, dark=dark)
        self.code_blocks = rendered.code_blocks
        self.setHtml(rendered.html)
        if self._fit_max:
            probe = self.document().clone(self)
            probe.setTextWidth(self._fit_max)
            self._natural_width = min(self._fit_max, math.ceil(probe.idealWidth()) + 2)
            probe.deleteLater()
            self.updateGeometry()

    def sizeHint(self) -> QSize:
        return QSize(self._natural_width or super().sizeHint().width(), self.height())

    def minimumSizeHint(self) -> QSize:
        return QSize(48, self.height())

    def _anchor_clicked(self, url: QUrl) -> None:
        """copy:N copies a code block; only web links leave the app, nothing else opens."""
        if url.scheme() == "copy":
            index = int(url.path()) if url.path().isdigit() else -1
            if 0 <= index < len(self.code_blocks):
                self.copy_requested.emit(self.code_blocks[index])
        elif url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)

    def wheelEvent(self, event: QWheelEvent) -> None:
        event.ignore()  # let the conversation scroll; this widget never has anything to scroll

    def _fit_height(self) -> None:
        height = math.ceil(self.document().size().height())
        if height != self.height():
            self.setFixedHeight(height)


def _tool_button(name: str, text: str, accessible: str, tip: str, parent: QWidget) -> QToolButton:
    button = QToolButton(parent)
    button.setObjectName(name)
    button.setText(text)
    button.setAccessibleName(accessible)
    button.setToolTip(tip)
    button.setAutoRaise(True)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    return button


class _MessageWidget(QWidget):
    """One message: its bubble and the row of actions under it."""

    copy_requested = Signal(str)
    edit_requested = Signal(str, str)
    regenerate_requested = Signal(str)
    branch_requested = Signal(str)
    continue_requested = Signal(str)

    def __init__(self, message: MessageView, *, dark: bool, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName("message")
        self.setProperty("messageId", message.id)
        self.message = message
        self.is_user = message.role == "user"
        self._dark = dark
        self._pending: list[str] = []
        self._reasoning = ""
        self._reasoning_text: _MessageText | None = None
        self._reasoning_frame: QFrame | None = None
        self._editor_box: QWidget | None = None
        self._editor: QPlainTextEdit | None = None

        self.bubble = QFrame(self)
        self.bubble.setObjectName("messageBubble")
        self.bubble.setProperty("role", "user" if self.is_user else "assistant")
        self.bubble.setAccessibleName("User message" if self.is_user else "Assistant message")
        self._bubble_layout = QVBoxLayout(self.bubble)
        # Less below than above: Qt adds the paragraphs' extra leading after the last line too.
        self._bubble_layout.setContentsMargins(15, 11, 15, 8)
        self._bubble_layout.setSpacing(6)

        self.reasoning_toggle = _tool_button(
            "reasoningToggle", "", "Show reasoning", "Show or hide the model's reasoning", self
        )
        self.reasoning_toggle.setCheckable(True)
        self.reasoning_toggle.toggled.connect(self._show_reasoning)
        self.reasoning_toggle.hide()
        self._bubble_layout.addWidget(self.reasoning_toggle, 0, Qt.AlignmentFlag.AlignLeft)

        self.text = _MessageText("messageText", "Message text", self.bubble)
        self.text.copy_requested.connect(self.copy_requested)
        self._bubble_layout.addWidget(self.text)

        self._bubble_row = QHBoxLayout()
        self._bubble_row.setContentsMargins(0, 0, 0, 0)
        if self.is_user:
            self._bubble_row.setContentsMargins(56, 0, 0, 0)
            self._bubble_row.addStretch(1)
            self.text.fit_content_width(int(_COLUMN_MAX_PX * _USER_BUBBLE_RATIO) - 28)
            self.bubble.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Preferred)
        self._bubble_row.addWidget(self.bubble)

        self._actions = QWidget(self)
        actions = QHBoxLayout(self._actions)
        actions.setContentsMargins(4, 0, 4, 0)
        actions.setSpacing(2)
        self._build_actions(actions)

        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(4)
        outer.addLayout(self._bubble_row)
        outer.addWidget(self._actions)
        self._refresh()

    def _build_actions(self, row: QHBoxLayout) -> None:
        self.status_mark = QLabel(self._actions)
        self.status_mark.setObjectName("statusMark")
        self.continue_button = _tool_button(
            "continueButton", "Continue", "Continue reply", "Continue the interrupted reply", self
        )
        self.continue_button.clicked.connect(lambda: self.continue_requested.emit(self.message.id))
        self.copy_button = _tool_button(
            "copyButton", "Copy", "Copy message", "Copy the message text", self
        )
        self.copy_button.clicked.connect(self._copy_message)
        self.edit_button = _tool_button(
            "editButton", "Edit", "Edit message", "Edit and resend this message", self
        )
        self.edit_button.clicked.connect(self._begin_edit)
        self.regenerate_button = _tool_button(
            "regenerateButton", "Regenerate", "Regenerate reply", "Write a new reply", self
        )
        self.regenerate_button.clicked.connect(
            lambda: self.regenerate_requested.emit(self.message.id)
        )
        self.previous_button = _tool_button(
            "branchPrevious", "‹", "Previous version", "Show the previous version", self
        )
        self.previous_button.clicked.connect(lambda: self._step_branch(-1))
        self.branch_label = QLabel(self._actions)
        self.branch_label.setObjectName("branchLabel")
        self.next_button = _tool_button(
            "branchNext", "›", "Next version", "Show the next version", self
        )
        self.next_button.clicked.connect(lambda: self._step_branch(1))
        self.meta = QLabel(self._actions)
        self.meta.setObjectName("messageMeta")
        self.meta.setAccessibleName("Reply statistics")

        branch = [self.previous_button, self.branch_label, self.next_button]
        if self.is_user:
            row.addStretch(1)
            widgets = [*branch, self.edit_button, self.copy_button]
        else:
            widgets = [
                self.status_mark,
                self.continue_button,
                self.copy_button,
                self.regenerate_button,
                *branch,
                self.meta,
            ]
        for widget in widgets:
            widget.setParent(self._actions)
            row.addWidget(widget)
        if not self.is_user:
            row.addStretch(1)

    def set_message(self, message: MessageView) -> None:
        """Show a newer state of this message; unchanged messages cost nothing."""
        if message == self.message:
            return
        self.message = message
        self._pending.clear()
        self._refresh()

    def set_dark(self, dark: bool) -> None:
        if dark != self._dark:
            self._dark = dark
            self._refresh()

    def append(self, piece: str) -> None:
        """Queue streamed text; the view flushes it on its render tick."""
        self._pending.append(piece)

    def flush(self) -> None:
        if self._pending:
            content = self.message.content + "".join(self._pending)
            self._pending.clear()
            self.message = replace(self.message, content=content)
            self._render_text()

    def _refresh(self) -> None:
        message = self.message
        self._render_text()
        streaming = message.status == "streaming"
        self._actions.setVisible(not streaming and not self._editing())
        self.edit_button.setVisible(self.is_user)
        self.regenerate_button.setVisible(not self.is_user)
        count = len(message.sibling_ids)
        for widget in (self.previous_button, self.branch_label, self.next_button):
            widget.setVisible(count > 1)
        if count > 1:
            index = message.sibling_index
            self.branch_label.setText(f"{index + 1}/{count}")
            self.branch_label.setAccessibleName(f"Version {index + 1} of {count}")
            self.previous_button.setEnabled(index > 0)
            self.next_button.setEnabled(index < count - 1)
        mark = {"interrupted": "Interrupted", "error": "Error"}.get(message.status, "")
        self.status_mark.setText(mark)
        self.status_mark.setAccessibleName(f"Reply {mark.lower()}" if mark else "Reply status")
        self.status_mark.setVisible(bool(mark) and not self.is_user)
        self.continue_button.setVisible(message.status == "interrupted" and not self.is_user)
        summary = "" if self.is_user else stats_summary(message.stats)
        self.bubble.setToolTip(summary)
        self.meta.setToolTip(summary)
        self.meta.setText(_short_stats(message.stats))
        self.meta.setVisible(bool(self.meta.text()) and not self.is_user)

    def _render_text(self) -> None:
        message = self.message
        reasoning, answer = (
            (None, message.content) if self.is_user else markdown.split_reasoning(message.content)
        )
        streaming = message.status == "streaming"
        thinking = streaming and reasoning is not None and not answer
        self.reasoning_toggle.setVisible(reasoning is not None)
        if reasoning is not None:
            self._reasoning = reasoning
            arrow = "▾" if self.reasoning_toggle.isChecked() else "▸"
            self.reasoning_toggle.setText(f"{arrow}  {'Thinking…' if thinking else 'Reasoning'}")
            if self.reasoning_toggle.isChecked():
                self._render_reasoning()
        self.text.setVisible((bool(answer) or not thinking) and not self._editing())
        self.text.show_markdown(answer or ("…" if streaming else ""), dark=self._dark)

    def _show_reasoning(self, shown: bool) -> None:
        self.reasoning_toggle.setAccessibleName("Hide reasoning" if shown else "Show reasoning")
        if self._reasoning_frame is None:
            self._reasoning_frame = QFrame(self.bubble)
            self._reasoning_frame.setObjectName("reasoningFrame")
            layout = QVBoxLayout(self._reasoning_frame)
            layout.setContentsMargins(12, 2, 0, 2)
            self._reasoning_text = _MessageText(
                "reasoningText", "Reasoning text", self._reasoning_frame
            )
            self._reasoning_text.copy_requested.connect(self.copy_requested)
            layout.addWidget(self._reasoning_text)
            self._bubble_layout.insertWidget(1, self._reasoning_frame)
        self._reasoning_frame.setVisible(shown)
        self._render_text()

    def _render_reasoning(self) -> None:
        if self._reasoning_text is not None:
            self._reasoning_text.show_markdown(self._reasoning, dark=self._dark)

    def _copy_message(self) -> None:
        if self.is_user:
            self.copy_requested.emit(self.message.content)
        else:
            self.copy_requested.emit(markdown.split_reasoning(self.message.content)[1])

    def _step_branch(self, step: int) -> None:
        siblings = self.message.sibling_ids
        index = self.message.sibling_index + step
        if 0 <= index < len(siblings):
            self.branch_requested.emit(siblings[index])

    def _begin_edit(self) -> None:
        editor = self._editor or self._build_editor()
        editor.setPlainText(self.message.content)
        editor.moveCursor(QTextCursor.MoveOperation.End)
        self._fit_editor()
        self.text.hide()
        self._actions.hide()
        if self._editor_box is not None:
            self._editor_box.show()
        self._set_bubble_fills_row(True)
        editor.setFocus()

    def _build_editor(self) -> QPlainTextEdit:
        box = QWidget(self.bubble)
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(8)
        editor = QPlainTextEdit(box)
        editor.setObjectName("messageEditor")
        editor.setAccessibleName("Edit message text")
        editor.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        editor.installEventFilter(self)
        editor.textChanged.connect(self._fit_editor)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        self.cancel_edit_button = QPushButton("Cancel", box)
        self.cancel_edit_button.setObjectName("cancelEdit")
        self.cancel_edit_button.setAccessibleName("Cancel editing")
        self.cancel_edit_button.setToolTip("Discard the changes (Esc)")
        self.cancel_edit_button.clicked.connect(self._end_edit)
        self.send_edit_button = QPushButton("Send", box)
        self.send_edit_button.setObjectName("sendEdit")
        self.send_edit_button.setAccessibleName("Send edited message")
        self.send_edit_button.setToolTip("Send the edited message as a new branch (Enter)")
        self.send_edit_button.clicked.connect(self._send_edit)
        editor.textChanged.connect(
            lambda: self.send_edit_button.setEnabled(bool(editor.toPlainText().strip()))
        )
        buttons.addWidget(self.cancel_edit_button)
        buttons.addWidget(self.send_edit_button)
        layout.addWidget(editor)
        layout.addLayout(buttons)
        self._bubble_layout.addWidget(box)
        self._editor_box, self._editor = box, editor
        return editor

    def _editing(self) -> bool:
        return self._editor_box is not None and self._editor_box.isVisibleTo(self)

    def _fit_editor(self) -> None:
        """Grow with the text like the composer does, up to a limit, then scroll."""
        if self._editor is None:
            return
        lines = self._editor.document().documentLayout().documentSize().height()
        height = int(lines * self._editor.fontMetrics().lineSpacing()) + 26
        self._editor.setFixedHeight(max(_EDITOR_MIN_PX, min(_EDITOR_MAX_PX, height)))

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Enter sends and Esc cancels, like the composer; Shift+Enter adds a line."""
        if (
            watched is self._editor
            and event.type() == QEvent.Type.KeyPress
            and isinstance(event, QKeyEvent)
        ):
            shift = event.modifiers() & Qt.KeyboardModifier.ShiftModifier
            if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not shift:
                self._send_edit()
                return True
            if event.key() == Qt.Key.Key_Escape:
                self._end_edit()
                return True
        return super().eventFilter(watched, event)

    def _send_edit(self) -> None:
        text = self._editor.toPlainText().strip() if self._editor is not None else ""
        self._end_edit()
        if text and text != self.message.content.strip():
            self.edit_requested.emit(self.message.id, text)

    def _end_edit(self) -> None:
        if self._editor_box is not None:
            self._editor_box.hide()
        self.text.show()
        self._actions.show()
        self._set_bubble_fills_row(False)

    def _set_bubble_fills_row(self, fill: bool) -> None:
        """While editing, the user bubble takes the whole row so the editor has room."""
        policy = QSizePolicy.Policy.Expanding if fill else QSizePolicy.Policy.Maximum
        self.bubble.setSizePolicy(policy, QSizePolicy.Policy.Preferred)
        self._bubble_row.setStretch(0, 0 if fill else 1)
        self._bubble_row.setStretch(1, 1 if fill else 0)


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
        self._widgets: dict[str, _MessageWidget] = {}
        self._dirty: set[str] = set()
        self._pinned = True
        self._anchor_from_bottom: int | None = None
        self._adjusting = False

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
        column.setMaximumWidth(_COLUMN_MAX_PX)
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
            if widget is None or widget.is_user != (message.role == "user"):
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
            self._anchor_from_bottom = None
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

    def finish_reply(self, message: MessageView) -> None:
        """Show the final saved state of a reply: full text, status, stats."""
        self._dirty.discard(message.id)
        position = self._index_of(message.id)
        if position is not None:
            self._messages[position] = message
        widget = self._widgets.get(message.id)
        if widget is not None:
            widget.set_message(message)

    def set_dark(self, dark: bool) -> None:
        """Switch the colours and re-render code highlighting for the other theme."""
        self._dark = dark
        self._apply_theme()
        for widget in self._widgets.values():
            widget.set_dark(dark)

    # -- internals ----------------------------------------------------------------------

    def _apply_theme(self) -> None:
        self.setStyleSheet(_stylesheet(_theme(QGuiApplication.palette(), self._dark)))

    def _make_widget(self, message: MessageView) -> _MessageWidget:
        widget = _MessageWidget(message, dark=self._dark, parent=self._canvas_column)
        widget.copy_requested.connect(self._copy)
        widget.edit_requested.connect(self.edit_requested)
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.branch_requested.connect(self.branch_requested)
        widget.continue_requested.connect(self.continue_requested)
        return widget

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

    def _range_changed(self, _minimum: int, maximum: int) -> None:
        if self._anchor_from_bottom is not None:
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
        self._pinned = value >= bar.maximum() - _BOTTOM_SLACK_PX
        if value == bar.minimum() and self._first_loaded > 0:
            self._load_earlier()
