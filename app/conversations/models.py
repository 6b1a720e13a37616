"""The records the conversation store hands out.

Frozen so that a value read from the store cannot drift from what is on disk without a store
call; the UI keeps its own view state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["user", "assistant", "tool"]  # tool: one function call's result
Status = Literal["complete", "streaming", "interrupted", "error"]


@dataclass(frozen=True)
class ToolCall:
    """One function call an assistant message makes, as the OpenAI API writes it: the id its
    result names, the function, and the arguments as the JSON text they came as."""

    id: str
    name: str
    arguments: str

    def record(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class Conversation:
    id: str
    title: str | None
    created_at: float
    updated_at: float
    pinned: bool
    deleted_at: float | None
    system_prompt: str | None
    sampling: dict
    current_leaf_id: str | None
    draft: str
    model: str | None
    imported_at: float | None = None  # set when the conversation came from an export file
    served_at: float | None = None  # set when the API server beside the window served it
    served_to: str | None = None  # the API client that asked (its user agent), when known


@dataclass(frozen=True)
class Message:
    """One node of a conversation's message tree; edits and regenerations are siblings."""

    id: str
    conversation_id: str
    parent_id: str | None
    role: Role
    content: str
    token_ids: list[int] | None
    tokens_fingerprint: str | None
    status: Status
    finish_reason: str | None
    stats: dict | None
    created_at: float
    updated_at: float
    attachments: list[dict] | None = None  # files sent with a user message (schema v4)
    tool_calls: tuple[ToolCall, ...] = ()  # the calls an assistant message makes (schema v5)
    tool_call_id: str | None = None  # a tool message: the call it is the result of
    tool_name: str | None = None  # a tool message: the function that was called


@dataclass(frozen=True)
class SearchHit:
    """A search match: a message (message_id set) or a conversation title (message_id None).

    `snippet` wraps the matched words in « and ».
    """

    conversation_id: str
    message_id: str | None
    title: str | None
    snippet: str
