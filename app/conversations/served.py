"""API conversations: turns the API server beside the window served, kept as conversations.

A client of the API sends its whole history every turn; the store keeps one conversation per
history, not one per request. A served turn continues the API conversation whose branch its
history walks down, message by message from the first (same system prompt, same texts, the
same tool calls by name and canonical arguments, an assistant message by its exact token ids
when both sides have them), as long as that walk passes at least one reply: the turn's new
messages and its reply are appended there (a history that leaves the branch part way, an
edited message or a retry, becomes a new branch at that point). Anything else opens a new
conversation, marked as served (schema v6), titled from its first user message.

Replies are kept as the exact ids the model sampled, so continuing such a conversation in
the window renders the prompt the server built plus the new tokens, and the engine prefills
only those. Storage only: the records come in storage's own terms (the API's room turns its
requests into them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from app.conversations.attachments import image_attachment, is_image
from app.conversations.models import Message, Role, ToolCall
from app.conversations.store import ConversationStore
from app.conversations.tool_records import name_of_call


@dataclass(frozen=True)
class ServedMessage:
    """One message of a served history, or the reply: user, assistant or tool."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant message's calls
    tool_call_id: str | None = None  # a tool result's: the call it answers
    token_ids: tuple[int, ...] | None = None  # an assistant message's exact sampled ids
    tokens_fingerprint: str | None = None  # the model those ids belong to
    images: tuple[bytes, ...] = ()  # a user message's pictures, kept as image attachments


@dataclass(frozen=True)
class ServedTurn:
    """One served request and its reply, as the store keeps it."""

    system_prompt: str | None
    history: tuple[ServedMessage, ...]  # the request's messages after the system prompt
    reply: ServedMessage
    model: str | None = None  # the model, as conversations record it (its file)
    client: str | None = None  # who asked (an API client's user agent)
    finish_reason: str | None = None
    stats: dict | None = None


@dataclass(frozen=True)
class Kept:
    """Where a served turn went: its conversation, its reply, and whether it is new."""

    conversation_id: str
    reply_id: str
    new: bool


def keep(store: ConversationStore, turn: ServedTurn) -> Kept:
    """Append `turn` to the API conversation it continues, or open one for it."""
    found = _continued(store, turn)
    if found is None:
        conversation = store.create_conversation(system_prompt=turn.system_prompt, model=turn.model)
        store.mark_served(conversation.id, turn.client)
        conversation_id, parent, depth = conversation.id, None, 0
    else:
        conversation_id, parent, depth = found
    calls: tuple[ToolCall, ...] = ()
    for message in turn.history[:depth]:
        calls = message.tool_calls or (calls if message.role == "tool" else ())
    for message in turn.history[depth:]:
        parent = _add(store, conversation_id, parent, message, calls).id
        calls = message.tool_calls or (calls if message.role == "tool" else ())
    reply = _add(
        store,
        conversation_id,
        parent,
        turn.reply,
        calls,
        finish_reason=turn.finish_reason,
        stats=turn.stats,
    )
    return Kept(conversation_id, reply.id, found is None)


def _add(
    store: ConversationStore,
    conversation_id: str,
    parent: str | None,
    message: ServedMessage,
    calls: Sequence[ToolCall],
    **fields: object,
) -> Message:
    """Store one served message under `parent`; a tool result gets the function's name from
    the call it answers (`calls`: those of the reply before it)."""
    pictures = [
        image_attachment(f"Image {n}", data).record()
        for n, data in enumerate(message.images, start=1)
    ]
    return store.add_message(
        conversation_id,
        parent,
        message.role,
        message.content,
        attachments=pictures or None,
        token_ids=None if message.token_ids is None else list(message.token_ids),
        tokens_fingerprint=message.tokens_fingerprint if message.token_ids is not None else None,
        tool_calls=message.tool_calls,
        tool_call_id=message.tool_call_id if message.role == "tool" else None,
        tool_name=name_of_call(message.tool_call_id, calls) if message.role == "tool" else None,
        **fields,
    )


def _continued(store: ConversationStore, turn: ServedTurn) -> tuple[str, str, int] | None:
    """(conversation id, the last message matched, how many history messages matched) of
    the deepest API branch the history walks down through at least one reply; None: none."""
    history = turn.history
    if not history:
        return None
    first = history[0]
    best: tuple[str, str, int] | None = None
    for root in store.served_roots(turn.system_prompt, first.role, first.content):
        if not same(root, first):  # the same words with other pictures
            continue
        node, depth = root, 1
        while depth < len(history):
            children = store.children(node.id, root.conversation_id)
            match = next((c for c in reversed(children) if same(c, history[depth])), None)
            if match is None:
                break
            node, depth = match, depth + 1
        replied = any(m.role == "assistant" for m in history[:depth])
        if replied and (best is None or depth > best[2]):
            best = (root.conversation_id, node.id, depth)
    return best


def same(stored: Message, served: ServedMessage) -> bool:
    """Whether a stored message is the one a served history holds at its place."""
    if stored.role != served.role:
        return False
    if stored.role != "assistant":
        digests = [a.get("digest") for a in stored.attachments or () if is_image(a)]
        return stored.content == served.content and digests == [
            hashlib.sha256(image).hexdigest() for image in served.images
        ]
    if (
        stored.token_ids is not None
        and served.token_ids is not None
        and stored.tokens_fingerprint == served.tokens_fingerprint
    ):
        return tuple(stored.token_ids) == served.token_ids
    return stored.content.strip() == served.content.strip() and _calls(stored.tool_calls) == _calls(
        served.tool_calls
    )


def _calls(calls: Sequence[ToolCall]) -> list[tuple[str, object]]:
    """Calls as compared: name and parsed arguments (clients rewrite ids and re-serialize)."""
    return [(call.name, _parsed(call.arguments)) for call in calls]


def _parsed(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
