"""A tool's answer shaped for a chat: what the model reads and what the person sees.

Promises: the text parts are joined, one per line; every other part is said in words in its
place, never dropped (`[image: image/png, 12.3 kB]`, `[audio: ...]`, a linked resource by its
name and address, an embedded one by its address and, when it is text, its text); a result with
only structured content shows that as JSON. The person's text (`full`) is all of it; the
model's (`for_model`) is cut past `limit` characters, with a note at the cut saying how much
was left out and that the person sees all of it. A call that gave no result (`failed`) is an
error result whose text is the words of why.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.units import decimal_bytes

if TYPE_CHECKING:  # the SDK's types are imported where a result is read, not at every start
    from mcp_types import CallToolResult, ContentBlock

LIMIT = 20_000  # characters of a result the model reads by default (about 5,000 tokens)


@dataclass(frozen=True)
class ToolResult:
    """One call's outcome: `full` for the person, `for_model` for the model (cut: `cut`
    characters left out), and whether the tool (or the call) failed."""

    full: str
    for_model: str
    is_error: bool = False
    cut: int = 0


def shaped(result: CallToolResult, limit: int = LIMIT) -> ToolResult:
    """`result` as the chat shows it and the model reads it."""
    full = "\n".join(_said(part) for part in result.content)
    if not result.content and result.structured_content is not None:
        full = json.dumps(result.structured_content, ensure_ascii=False, indent=2)
    return _cut(full, limit, is_error=result.is_error)


def failed(reason: str) -> ToolResult:
    """A call that gave no result, for `reason` (words)."""
    return ToolResult(reason, reason, is_error=True)


def _cut(full: str, limit: int, *, is_error: bool) -> ToolResult:
    if len(full) <= limit:
        return ToolResult(full, full, is_error)
    cut = len(full) - limit
    note = (
        f"\n[{cut:,} more characters of this result were cut here ({len(full):,} in all); "
        "the person sees all of it]"
    )
    return ToolResult(full, full[:limit] + note, is_error, cut)


def _said(part: ContentBlock) -> str:
    """One part of a result, as text."""
    from mcp_types import (
        AudioContent,
        BlobResourceContents,
        EmbeddedResource,
        ImageContent,
        ResourceLink,
        TextContent,
    )

    if isinstance(part, TextContent):
        return part.text
    if isinstance(part, ImageContent | AudioContent):
        return f"[{part.type}: {part.mime_type}, {_size(part.data)}]"
    if isinstance(part, ResourceLink):
        kind = f", {part.mime_type}" if part.mime_type else ""
        size = f", {decimal_bytes(part.size)}" if part.size is not None else ""
        return f"[link: {part.title or part.name} <{part.uri}>{kind}{size}]"
    if isinstance(part, EmbeddedResource):
        found = part.resource
        kind = f", {found.mime_type}" if found.mime_type else ""
        if isinstance(found, BlobResourceContents):
            return f"[resource: {found.uri}{kind}, {_size(found.blob)}]"
        return f"[resource: {found.uri}{kind}]\n{found.text}"
    return f"[a part of type “{getattr(part, 'type', 'unknown')}” that Stoke cannot show]"


def _size(data: str) -> str:
    """The size of base64 `data` once decoded, in words."""
    try:
        return decimal_bytes(len(base64.b64decode(data, validate=False)))
    except (binascii.Error, ValueError):
        return "data that is not base64"
