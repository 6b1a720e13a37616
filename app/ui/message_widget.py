"""One message of the chat view: its bubble (Markdown, collapsible reasoning, a reply's tool
calls as closed rows), its status, its stats, and its actions (copy, edit and resend,
regenerate, the branch arrows, continue).

It renders streamed text on demand and edits in place; it only emits signals, so the chat
view (and through it the window) decides what an action means.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent, QTextCursor
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui import markdown
from app.ui.attachments import AttachmentChips
from app.ui.elided import ElidedLabel
from app.ui.message_text import MessageText
from app.ui.message_view import MessageView
from app.ui.tool_rows import ToolRow, call_row

COLUMN_MAX_PX = 760
_USER_BUBBLE_RATIO = 0.82
_EDITOR_MIN_PX = 64
_EDITOR_MAX_PX = 280
LENGTH_MARK = "Stopped at the length limit"  # max tokens reached: the reply may go on
EMPTY_STOP_MARK = "Stopped before the reply started"  # cancelled while the prompt was read


def progress_text(done: int, total: int) -> str:
    """What a streaming bubble says while the engine reads a long prompt."""
    return f"Reading the prompt… {done:,} / {total:,} tokens"


def drafts_words(stats: dict) -> str:
    """Speculative decoding's share of drafted tokens the model kept ("drafts 71% accepted"),
    or nothing when the reply drafted nothing (speculation off, or never worth a guess). None
    kept says so plainly: "drafts 0% accepted" read as a failure (issue 36 item 8)."""
    drafted = stats.get("drafted_tokens") or 0
    if not drafted:
        return ""
    accepted = stats.get("accepted_tokens") or 0
    if not accepted:
        return "no drafts kept"
    share = accepted / drafted
    return f"drafts {share:.0%} accepted" if share >= 0.005 else "drafts <1% accepted"


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
    if drafts := drafts_words(stats):
        parts.append(drafts)
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


def _tool_button(name: str, text: str, accessible: str, tip: str, parent: QWidget) -> QToolButton:
    button = QToolButton(parent)
    button.setObjectName(name)
    button.setText(text)
    button.setAccessibleName(accessible)
    button.setToolTip(tip)
    button.setAutoRaise(True)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    return button


class MessageWidget(QWidget):
    """One message: its bubble and the row of actions under it."""

    copy_requested = Signal(str)
    edit_requested = Signal(str, str)
    regenerate_requested = Signal(str)
    branch_requested = Signal(str)
    continue_requested = Signal(str)
    edit_started = Signal()  # the view brings the editor into sight

    def __init__(self, message: MessageView, *, dark: bool, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName("message")
        self.setProperty("messageId", message.id)
        self.message = message
        self.is_user = message.role == "user"
        self._dark = dark
        self._pending: list[str] = []
        self._progress = ""  # the prompt's prefill, shown until the first token
        self._reasoning = ""
        self._reasoning_text: MessageText | None = None
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

        if message.attachments:
            self._bubble_layout.addWidget(AttachmentChips(message.attachments, self.bubble))
        self.text = MessageText("messageText", "Message text", self.bubble)
        self.text.copy_requested.connect(self.copy_requested)
        self._bubble_layout.addWidget(self.text)
        self.call_rows: list[ToolRow] = []
        self._show_calls()

        self._bubble_row = QHBoxLayout()
        self._bubble_row.setContentsMargins(0, 0, 0, 0)
        if self.is_user:
            self._bubble_row.setContentsMargins(56, 0, 0, 0)
            self._bubble_row.addStretch(1)
            self.text.fit_content_width(int(COLUMN_MAX_PX * _USER_BUBBLE_RATIO) - 28)
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
        self.status_mark = ElidedLabel(parent=self._actions)
        self.status_mark.setObjectName("statusMark")
        self.continue_button = _tool_button(
            "continueButton",
            "Continue",
            "Continue reply",
            "Continue the reply where it stopped",
            self,
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
        self.meta = ElidedLabel(parent=self._actions)  # a narrow chat cuts it, not the bubble
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
        calls_changed = message.tool_calls != self.message.tool_calls
        self.message = message
        self._pending.clear()
        if calls_changed:
            self._show_calls()
        self._refresh()

    def set_dark(self, dark: bool) -> None:
        if dark != self._dark:
            self._dark = dark
            for row in self.call_rows:
                row.set_dark(dark)
            self._refresh()

    def _show_calls(self) -> None:
        """One closed row per tool call, under the reply's text."""
        for row in self.call_rows:
            row.hide()
            row.deleteLater()
        self.call_rows = [
            call_row(call, dark=self._dark, parent=self.bubble) for call in self.message.tool_calls
        ]
        for row in self.call_rows:
            row.copy_requested.connect(self.copy_requested)
            self._bubble_layout.addWidget(row)

    def set_call_state(self, call_id: str, state: str) -> bool:
        """Show what call `call_id` of this reply is doing; False when it is not this reply's."""
        for call, row in zip(self.message.tool_calls, self.call_rows, strict=True):
            if call.id == call_id:
                row.set_state(state)
                return True
        return False

    def append(self, piece: str) -> None:
        """Queue streamed text; the view flushes it on its render tick."""
        self._pending.append(piece)

    def set_progress(self, done: int, total: int) -> None:
        """Show how far the prompt has been read while no token has come yet."""
        self._progress = progress_text(done, total)
        if self.message.status == "streaming" and not self.message.content and not self._pending:
            self._render_text()

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
        if message.status == "complete" and message.finish_reason == "length":
            mark = LENGTH_MARK
        empty_stop = message.status == "interrupted" and not message.content.strip()
        if empty_stop and not self.is_user:
            mark = EMPTY_STOP_MARK
        self.continue_button.setText("Retry" if empty_stop else "Continue")
        self.bubble.setVisible(not (empty_stop and not self.is_user))
        self.status_mark.setText(mark)
        self.status_mark.setAccessibleName(f"Reply {mark.lower()}" if mark else "Reply status")
        self.status_mark.setVisible(bool(mark) and not self.is_user)
        continuable = (
            mark in ("Interrupted", LENGTH_MARK, EMPTY_STOP_MARK) or message.resumable
        ) and not self.is_user
        self.continue_button.setVisible(continuable)
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
        only_calls = bool(message.tool_calls) and not answer.strip() and not streaming
        shown = (bool(answer) or not thinking) and not only_calls
        self.text.setVisible(shown and not self._editing())
        if self.is_user:
            self.text.show_plain(answer)
        else:
            waiting = (self._progress or "…") if streaming else ""
            self.text.show_markdown(answer or waiting, dark=self._dark)

    def _show_reasoning(self, shown: bool) -> None:
        self.reasoning_toggle.setAccessibleName("Hide reasoning" if shown else "Show reasoning")
        if self._reasoning_frame is None:
            self._reasoning_frame = QFrame(self.bubble)
            self._reasoning_frame.setObjectName("reasoningFrame")
            layout = QVBoxLayout(self._reasoning_frame)
            layout.setContentsMargins(12, 2, 0, 2)
            self._reasoning_text = MessageText(
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

    def begin_edit(self) -> None:
        self._begin_edit()

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
        self.edit_started.emit()

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
