"""Conversations out of and into files: JSON that keeps everything, Markdown to read.

The JSON export holds the whole message tree (every edit and regeneration) with the exact
token ids, tool calls and tool results, so an imported conversation continues without
re-prefilling and its branches survive. Import checks the whole file before writing
anything: a bad file changes nothing. It also takes an OpenAI-style list of chat messages
(chat_messages.py). A file whose conversation holds images is format version 3 and carries
each picture's bytes once (base64, by content hash: the message records name them), so an
import on another machine shows them and its prompts hold the same runs; one with tool calls
is version 2; one with neither is still version 1, which older Stokes read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from app.conversations import chat_messages, tool_records
from app.conversations.attachments import Attachment, AttachmentError
from app.conversations.errors import ImportFormatError
from app.conversations.images import ImageFileError, has_image, image_bytes, keep_image
from app.conversations.models import Conversation, Message, ToolCall
from app.conversations.store import ROLES, STATUSES, ConversationStore

FORMAT = "stoke.conversation"
VERSION = 3  # 2: tool calls and tool results; 3: images
_VERSION_TOOLS = 2
_VERSION_WITHOUT_TOOLS = 1
UNTITLED = "New conversation"
_MAX_TOKEN_ID = 2**32 - 1  # the store keeps token ids as uint32
_REASONING = re.compile(r"\A\s*(?:<think>)?(?P<reasoning>.*?)</think>\s*(?P<answer>.*)\Z", re.S)


def export_json(store: ConversationStore, conversation_id: str) -> dict[str, Any]:
    """The conversation and its whole message tree, parents before children."""
    conversation = store.get_conversation(conversation_id)
    messages = _tree(store, conversation.id)
    tools = any(m.tool_calls or m.role == "tool" for m in messages)
    images = _image_files(messages)
    version = VERSION if images else _VERSION_TOOLS if tools else _VERSION_WITHOUT_TOOLS
    export: dict[str, Any] = {
        "format": FORMAT,
        "version": version,
        "conversation": {
            "id": conversation.id,
            "title": conversation.title,
            "system_prompt": conversation.system_prompt,
            "sampling": conversation.sampling,
            "model": conversation.model,
            "created_at": conversation.created_at,
            "updated_at": conversation.updated_at,
        },
        "messages": [_message_record(m) for m in messages],
        "current_leaf_id": conversation.current_leaf_id,
    }
    if images:
        export["images"] = images
    return export


def _image_files(messages: list[Message]) -> dict[str, str]:
    """Each kept picture the messages show, base64 by digest (one that is gone is left out:
    the import says so in words)."""
    images: dict[str, str] = {}
    for message in messages:
        for record in message.attachments or ():
            digest = record.get("digest")
            if record.get("kind") != "image" or digest in images:
                continue
            try:
                images[digest] = base64.b64encode(image_bytes(digest)).decode("ascii")
            except ImageFileError:
                continue
    return images


def export_markdown(store: ConversationStore, conversation_id: str) -> str:
    """The branch on screen, for people: other branches are left out."""
    conversation = store.get_conversation(conversation_id)
    parts = [f"# {conversation.title or UNTITLED}"]
    if conversation.system_prompt:
        parts.append(f"## System prompt\n\n{conversation.system_prompt.strip()}")
    for message in store.current_path(conversation.id):
        parts.append(_markdown_message(message))
    return "\n\n".join(parts) + "\n"


def import_json(store: ConversationStore, data: Any) -> Conversation:
    """A new conversation from an export or a list of chat messages, with new ids. Raises
    ImportFormatError (nothing written) when the file is neither, or not a valid one."""
    if chat_messages.is_chat_messages(data):
        return chat_messages.import_messages(store, data)
    header, messages, current_leaf_id, calls = _validated(data)
    for image in _imported_images(data, messages):
        keep_image(image)
    conversation = store.create_conversation(
        header["title"], header["system_prompt"], header["sampling"], header["model"]
    )
    try:
        new_ids: dict[str, str] = {}
        for record in messages:
            parent_id = record.get("parent_id")
            status = record.get("status", "complete")
            added = store.add_message(
                conversation.id,
                None if parent_id is None else new_ids[parent_id],
                record["role"],
                record["content"],
                token_ids=record.get("token_ids"),
                tokens_fingerprint=record.get("tokens_fingerprint"),
                # A reply exported mid-stream was cut off there; it is not streaming here.
                status="interrupted" if status == "streaming" else status,
                finish_reason=record.get("finish_reason"),
                stats=record.get("stats"),
                attachments=record.get("attachments"),
                tool_calls=calls[record["id"]],
                tool_call_id=record.get("tool_call_id"),
                tool_name=record.get("tool_name"),
            )
            new_ids[record["id"]] = added.id
        if current_leaf_id is not None:
            store.set_current_leaf(conversation.id, new_ids[current_leaf_id])
        store.mark_imported(conversation.id)
    except BaseException:
        store.purge(conversation.id)
        raise
    return store.get_conversation(conversation.id)


# Export helpers


def _tree(store: ConversationStore, conversation_id: str) -> list[Message]:
    """Every message, depth first with siblings oldest first, so parents come first."""
    ordered: list[Message] = []
    pending = list(reversed(store.children(None, conversation_id)))
    while pending:
        message = pending.pop()
        ordered.append(message)
        pending.extend(reversed(store.children(message.id, conversation_id)))
    return ordered


def _message_record(message: Message) -> dict[str, Any]:
    tools: dict[str, Any] = {}
    if message.tool_calls:
        tools["tool_calls"] = [call.record() for call in message.tool_calls]
    if message.role == "tool":
        tools |= {"tool_call_id": message.tool_call_id, "tool_name": message.tool_name}
    return tools | {
        "id": message.id,
        "parent_id": message.parent_id,
        "role": message.role,
        "content": message.content,
        "status": message.status,
        "finish_reason": message.finish_reason,
        "stats": message.stats,
        "token_ids": message.token_ids,
        "tokens_fingerprint": message.tokens_fingerprint,
        "created_at": message.created_at,
        "attachments": message.attachments,
    }


def _markdown_message(message: Message) -> str:
    if message.role == "tool":
        result = tool_records.fenced(message.content, "")
        return f"**Result of {message.tool_name or 'a tool'}**\n\n{result}"
    if message.role == "user":
        files = "".join(f"\n\n*Attached: {a['name']}*" for a in message.attachments or ())
        return f"**You**{files}\n\n{message.content.strip()}"
    heading = "**Assistant**"
    if message.status in ("interrupted", "error"):
        heading += f" *({message.status})*"
    parts = [heading]
    split = _REASONING.match(message.content)
    answer = message.content
    if split is not None:
        answer = split["answer"]
        if split["reasoning"].strip():
            parts.append(
                "<details>\n<summary>Reasoning</summary>\n\n"
                f"{split['reasoning'].strip()}\n\n</details>"
            )
    if answer.strip():
        parts.append(answer.strip())
    for call in message.tool_calls:
        arguments = tool_records.pretty_arguments(call.arguments)
        parts.append(f"*Called {call.name}*\n\n{tool_records.fenced(arguments, 'json')}")
    return "\n\n".join(parts)


# Import validation


def _imported_images(data: Mapping[str, Any], messages: list[Mapping[str, Any]]) -> list[bytes]:
    """The pictures the file carries for its image records, each checked against its
    digest; one neither in the file nor already kept here is an ImportFormatError."""
    carried = data.get("images", {})
    if not isinstance(carried, Mapping):
        raise ImportFormatError("The file's images must be an object of pictures by digest.")
    found: dict[str, bytes] = {}
    for record in messages:
        for attachment in record.get("attachments") or ():
            digest = attachment.get("digest")
            if attachment.get("kind") != "image" or digest in found:
                continue
            name = attachment["name"]
            if digest not in carried:
                if has_image(digest):
                    continue
                raise ImportFormatError(f"The file does not hold the picture of {name}.")
            try:
                picture = base64.b64decode(carried[digest], validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise ImportFormatError(f"The picture of {name} is damaged in the file.") from None
            if hashlib.sha256(picture).hexdigest() != digest:
                raise ImportFormatError(f"The picture of {name} is damaged in the file.")
            found[digest] = picture
    return list(found.values())


def _validated(
    data: Any,
) -> tuple[dict[str, Any], list[Mapping[str, Any]], str | None, dict[str, tuple[ToolCall, ...]]]:
    """The conversation header, the messages parents first, the current leaf id, and each
    message's tool calls by its id."""
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise ImportFormatError(
            "This file is neither a Stoke conversation export nor a list of chat messages."
        )
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ImportFormatError("This conversation file has no valid format version.")
    if version > VERSION:
        raise ImportFormatError(
            f"This conversation was exported by a newer Stoke (format version {version}; "
            f"this Stoke reads up to {VERSION}). Update Stoke to import it."
        )
    header = _header(data.get("conversation"))
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise ImportFormatError("The conversation file has no list of messages.")
    by_id: dict[str, Mapping[str, Any]] = {}
    calls: dict[str, tuple[ToolCall, ...]] = {}
    for number, record in enumerate(messages, start=1):
        found = _check_message(number, record)
        if record["id"] in by_id:
            raise ImportFormatError(f"Message {number} repeats the id '{record['id']}'.")
        by_id[record["id"]] = record
        calls[record["id"]] = found
    leaf = data.get("current_leaf_id")
    if leaf is not None and leaf not in by_id:
        raise ImportFormatError(
            f"The current message '{leaf}' is not among the conversation's messages."
        )
    ordered = _parents_first(by_id)
    for number, record in enumerate(messages, start=1):
        parent = by_id.get(record.get("parent_id") or "")
        before = None if parent is None else {"role": parent["role"], "calls": calls[parent["id"]]}
        tool_records.check_follows_calls(f"Message {number}", record["role"], before)
    return header, ordered, leaf, calls


def _header(conversation: Any) -> dict[str, Any]:
    if not isinstance(conversation, Mapping):
        raise ImportFormatError("The conversation file has no conversation section.")
    header = {
        "title": conversation.get("title"),
        "system_prompt": conversation.get("system_prompt"),
        "model": conversation.get("model"),
        "sampling": conversation.get("sampling", {}),
    }
    for name in ("title", "system_prompt", "model"):
        if header[name] is not None and not isinstance(header[name], str):
            raise ImportFormatError(f"The conversation's {name} must be text.")
    if not isinstance(header["sampling"], dict):
        raise ImportFormatError("The conversation's sampling settings must be an object.")
    return header


def _check_message(number: int, record: Any) -> tuple[ToolCall, ...]:
    """Raise ImportFormatError naming the message (1-based) and the field that is wrong;
    the message's tool calls."""
    if not isinstance(record, Mapping):
        raise ImportFormatError(f"Message {number} is not an object.")
    missing = [name for name in ("id", "role", "content") if name not in record]
    if missing:
        raise ImportFormatError(f"Message {number} is missing {', '.join(missing)}.")
    if not isinstance(record["id"], str) or not record["id"]:
        raise ImportFormatError(f"Message {number} has no valid id.")
    parent_id = record.get("parent_id")
    if parent_id is not None and not isinstance(parent_id, str):
        raise ImportFormatError(f"Message {number} has an invalid parent_id.")
    if record["role"] not in ROLES:
        raise ImportFormatError(
            f"Message {number} has the role {record['role']!r}; expected one of {', '.join(ROLES)}."
        )
    if not isinstance(record["content"], str):
        raise ImportFormatError(f"Message {number}'s content must be text.")
    if record.get("status", "complete") not in STATUSES:
        raise ImportFormatError(f"Message {number} has an unknown status {record['status']!r}.")
    for name in ("finish_reason", "tokens_fingerprint", "tool_call_id", "tool_name"):
        if record.get(name) is not None and not isinstance(record[name], str):
            raise ImportFormatError(f"Message {number}'s {name} must be text.")
    answers_call = record.get("tool_call_id") is not None or record.get("tool_name") is not None
    if answers_call and record["role"] != "tool":
        raise ImportFormatError(
            f"Message {number} names a tool call it answers, which only a tool result does."
        )
    calls = tool_records.read_calls(f"Message {number}", record.get("tool_calls"))
    if calls and record["role"] != "assistant":
        raise ImportFormatError(
            f"Message {number} makes tool calls, which only an assistant message does."
        )
    if record.get("stats") is not None and not isinstance(record["stats"], dict):
        raise ImportFormatError(f"Message {number}'s stats must be an object.")
    token_ids = record.get("token_ids")
    if token_ids is not None and not (
        isinstance(token_ids, list) and all(_is_token_id(t) for t in token_ids)
    ):
        raise ImportFormatError(f"Message {number}'s token_ids must be a list of token ids.")
    attachments = record.get("attachments")
    if attachments is not None:
        if not isinstance(attachments, list) or record["role"] != "user":
            raise ImportFormatError(f"Message {number}'s attachments must be a list of files.")
        try:
            for attachment in attachments:
                Attachment.from_record(attachment)
        except AttachmentError as exc:
            raise ImportFormatError(f"Message {number}: {exc}") from exc
    return calls


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_TOKEN_ID


def _parents_first(by_id: Mapping[str, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The messages ordered so each parent precedes its children, siblings in file order
    (that order is their order on screen). Raises on a parent that is missing or a loop."""
    children: dict[str | None, list[Mapping[str, Any]]] = {}
    for record in by_id.values():
        parent_id = record.get("parent_id")
        if parent_id is not None and parent_id not in by_id:
            raise ImportFormatError(
                f"Message '{record['id']}' replies to '{parent_id}', which is not in the file."
            )
        children.setdefault(parent_id, []).append(record)
    ordered: list[Mapping[str, Any]] = []
    pending = list(reversed(children.get(None, [])))
    while pending:
        record = pending.pop()
        ordered.append(record)
        pending.extend(reversed(children.get(record["id"], [])))
    if len(ordered) < len(by_id):
        reached = {record["id"] for record in ordered}
        stuck = next(message_id for message_id in by_id if message_id not in reached)
        seen: set[str] = set()
        while stuck not in seen:  # from an unreachable message up to a message in its loop
            seen.add(stuck)
            stuck = by_id[stuck]["parent_id"]
        raise ImportFormatError(
            f"Message '{stuck}' is part of a loop of replies: the file is damaged."
        )
    return ordered
