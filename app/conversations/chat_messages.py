"""An OpenAI-style list of chat messages as a new conversation: what an agent's log or a chat
completions request holds (a bare list, or an object with `messages`), tool calls and tool
results included.

Leading system (or developer) messages become the system prompt; user, assistant and tool
messages become one branch, in order. Content is text, or a list of text parts; a tool
result's function name, when the message does not give it, is the name of the call its
`tool_call_id` names. The whole list is checked before anything is written, as for Stoke's
own export, and every refusal names the message and what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.conversations import tool_records
from app.conversations.errors import ImportFormatError
from app.conversations.models import Conversation, ToolCall
from app.conversations.store import ConversationStore

_SYSTEM_ROLES = ("system", "developer")
_ROLES = (*_SYSTEM_ROLES, "user", "assistant", "tool")


@dataclass(frozen=True)
class _Entry:
    role: str
    content: str
    calls: tuple[ToolCall, ...] = ()
    call_id: str | None = None
    name: str | None = None


def is_chat_messages(data: Any) -> bool:
    """Whether `data` is meant as a list of chat messages (not Stoke's own export)."""
    if isinstance(data, list):
        return True
    return isinstance(data, Mapping) and "format" not in data and "messages" in data


def import_messages(store: ConversationStore, data: Any) -> Conversation:
    """A new conversation from the messages; ImportFormatError (nothing written) when the
    list is not one this Stoke can take."""
    system, entries = _read(data["messages"] if isinstance(data, Mapping) else data)
    conversation = store.create_conversation(system_prompt=system)
    try:
        parent_id = None
        for entry in entries:
            parent_id = store.add_message(
                conversation.id,
                parent_id,
                entry.role,
                entry.content,
                tool_calls=entry.calls,
                tool_call_id=entry.call_id,
                tool_name=entry.name,
            ).id
        store.mark_imported(conversation.id)
    except BaseException:
        store.purge(conversation.id)
        raise
    return store.get_conversation(conversation.id)


def _read(messages: Any) -> tuple[str | None, list[_Entry]]:
    """The system prompt and the conversation's messages, checked."""
    if not isinstance(messages, list):
        raise ImportFormatError("The file's messages must be a list of chat messages.")
    if not messages:
        raise ImportFormatError(
            "This file is not a Stoke conversation export, and its list of chat messages is "
            "empty: there is nothing to import."
        )
    system: list[str] = []
    entries: list[_Entry] = []
    calls: tuple[ToolCall, ...] = ()  # those of the last assistant message
    for number, message in enumerate(messages, start=1):
        where = f"Message {number}"
        if not isinstance(message, Mapping):
            raise ImportFormatError(f"{where} is not an object.")
        role = message.get("role")
        if role not in _ROLES:
            raise ImportFormatError(
                f"{where} has the role {role!r}; expected one of {', '.join(_ROLES)}."
            )
        if role in _SYSTEM_ROLES:
            if entries:
                raise ImportFormatError(
                    f"{where} is a system message in the middle of the conversation; Stoke "
                    "keeps one system prompt, so it can only come first."
                )
            system.append(_text(where, message.get("content")))
            continue
        entry = _entry(where, role, message, calls)
        previous = entries[-1] if entries else None
        before = None if previous is None else {"role": previous.role, "calls": previous.calls}
        tool_records.check_follows_calls(where, role, before)
        if role == "assistant":
            calls = entry.calls
        entries.append(entry)
    if not entries:
        raise ImportFormatError("The file holds only system messages: there is no conversation.")
    return "\n\n".join(system) or None, entries


def _entry(
    where: str, role: str, message: Mapping[str, Any], calls: tuple[ToolCall, ...]
) -> _Entry:
    if role == "assistant":
        found = tool_records.read_calls(where, message.get("tool_calls"))
        content = message.get("content")
        return _Entry(role, "" if content is None and found else _text(where, content), found)
    if role == "tool":
        call_id, name = message.get("tool_call_id"), message.get("name")
        for key, value in (("tool_call_id", call_id), ("name", name)):
            if value is not None and not isinstance(value, str):
                raise ImportFormatError(f"{where}'s {key} must be text.")
        name = name or tool_records.name_of_call(call_id, calls)
        return _Entry(role, _text(where, message.get("content")), call_id=call_id, name=name)
    return _Entry(role, _text(where, message.get("content")))


def _text(where: str, content: Any) -> str:
    """A message's content as text: a string, or the text of a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind not in ("text", "input_text", "output_text") or not isinstance(
                part.get("text"), str
            ):
                raise ImportFormatError(
                    f"{where} holds a part of type {kind!r}; Stoke imports text parts only."
                )
            texts.append(part["text"])
        return "".join(texts)
    raise ImportFormatError(f"{where}'s content must be text or a list of text parts.")
