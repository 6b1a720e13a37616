"""MessageView: a message as the chat view shows it, built from the store by the window.

Plain data, no Qt: the window fills it, the chat view only reads it."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.conversations import ToolCall


@dataclass(frozen=True)
class MessageView:
    """One message of the branch on screen, with its place among its siblings."""

    id: str
    role: str  # "user" | "assistant" | "tool"
    content: str
    status: str = "complete"  # complete | streaming | interrupted | error
    finish_reason: str | None = None
    stats: dict | None = None
    sibling_ids: tuple[str, ...] = field(default_factory=tuple)  # including this one, in order
    attachments: tuple[dict, ...] = ()  # a user message's files (conversations/attachments.py)
    tool_calls: tuple[ToolCall, ...] = ()  # the calls an assistant message makes
    tool_name: str | None = None  # a tool result: the function whose result it is
    resumable: bool = False  # the last of a tool turn left unfinished: Continue goes on with it

    @property
    def sibling_index(self) -> int:
        return self.sibling_ids.index(self.id) if self.id in self.sibling_ids else 0
