"""The store's records as SQLite rows and back: which columns, and how each value is kept.

Token ids are uint32 little-endian BLOBs whatever the machine; stats, attachments and tool
calls are JSON text; a message's columns are its dataclass fields in order, so adding a field
(and its migration) is the whole change.
"""

from __future__ import annotations

import json
import sys
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import fields

from app.conversations.models import Conversation, Message, ToolCall

CONVERSATION_FIELDS = tuple(field.name for field in fields(Conversation))
MESSAGE_FIELDS = tuple(field.name for field in fields(Message))
CONVERSATION_COLUMNS = ", ".join(CONVERSATION_FIELDS)
MESSAGE_COLUMNS = ", ".join(f"m.{name}" for name in MESSAGE_FIELDS)


def new_message(
    conversation_id: str,
    parent_id: str | None,
    role: str,
    content: str,
    now: float,
    *,
    token_ids: list[int] | None = None,
    tokens_fingerprint: str | None = None,
    status: str = "complete",
    finish_reason: str | None = None,
    stats: dict | None = None,
    attachments: list[dict] | None = None,
    tool_calls: tuple[ToolCall, ...] = (),
    tool_call_id: str | None = None,
    tool_name: str | None = None,
) -> Message:
    """A message not yet stored, with a fresh id, created and updated `now`."""
    return Message(
        id=uuid.uuid4().hex,
        conversation_id=conversation_id,
        parent_id=parent_id,
        role=role,
        content=content,
        token_ids=token_ids,
        tokens_fingerprint=tokens_fingerprint,
        status=status,
        finish_reason=finish_reason,
        stats=stats,
        created_at=now,
        updated_at=now,
        attachments=attachments,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
    )


def message_row(message: Message) -> tuple:
    """The values of MESSAGE_FIELDS, in order, as the messages table keeps them."""
    values = {name: getattr(message, name) for name in MESSAGE_FIELDS}
    values["token_ids"] = pack(message.token_ids)
    values["stats"] = dumps(message.stats)
    values["attachments"] = None if message.attachments is None else json.dumps(message.attachments)
    values["tool_calls"] = pack_calls(message.tool_calls)
    return tuple(values[name] for name in MESSAGE_FIELDS)


def pack_calls(calls: Sequence[ToolCall]) -> str | None:
    """An assistant message's calls as the tool_calls column keeps them (NULL: none)."""
    return json.dumps([call.record() for call in calls]) if calls else None


def conversation_of(row: tuple) -> Conversation:
    values = dict(zip(CONVERSATION_FIELDS, row, strict=True))
    values["pinned"] = bool(values["pinned"])
    values["sampling"] = json.loads(values["sampling"])
    return Conversation(**values)


def message_of(row: tuple) -> Message:
    values = dict(zip(MESSAGE_FIELDS, row, strict=True))
    values["token_ids"] = unpack(values["token_ids"])
    values["stats"] = None if values["stats"] is None else json.loads(values["stats"])
    if values["attachments"] is not None:
        values["attachments"] = json.loads(values["attachments"])
    calls = json.loads(values["tool_calls"]) if values["tool_calls"] is not None else []
    values["tool_calls"] = tuple(ToolCall(**call) for call in calls)
    return Message(**values)


def pack(token_ids: list[int] | None) -> bytes | None:
    """uint32 little-endian, whatever the machine."""
    if token_ids is None:
        return None
    packed = array("I", token_ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack(blob: bytes | None) -> list[int] | None:
    if blob is None:
        return None
    unpacked = array("I")
    unpacked.frombytes(blob)
    if sys.byteorder == "big":
        unpacked.byteswap()
    return unpacked.tolist()


def dumps(value: dict | None) -> str | None:
    return None if value is None else json.dumps(value)
