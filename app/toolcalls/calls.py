"""A finished reply's tool calls: parsed from the model's own syntax (syntax.py) and kept to
the functions offered, each with a fresh id; and the reply's text as the window shows it
beside them. The API server and the chat's tool loop read a reply's calls here alike."""

from __future__ import annotations

from collections.abc import Sequence

from app.toolcalls.syntax import ParsedCall, ToolSyntax
from app.toolcalls.tools import ToolCall, Tools, new_call_id


def with_ids(syntax: ToolSyntax, parsed: list[ParsedCall], tools: Tools) -> list[ToolCall]:
    """Calls to functions the request offers, each with a fresh id (Mistral's templates take
    only 9 letters and digits); one call only when parallel calls are off."""
    offered = set(tools.names)
    calls = [
        ToolCall(
            new_call_id(9, prefix="") if syntax.family == "mistral" else new_call_id(),
            call.name,
            call.arguments,
        )
        for call in parsed
        if call.name in offered
    ]
    return calls[:1] if not tools.parallel else calls


def reply_calls(tools: Tools, syntax: ToolSyntax, content: str) -> tuple[str, list[ToolCall]]:
    """A finished reply's (content, calls) when the request offered tools."""
    if not tools.active:
        return content, []
    rest, parsed = syntax.parse(content)
    calls = with_ids(syntax, parsed, tools)
    return (rest, calls) if calls else (content, [])


def shown_text(text: str, reasoning: str, content: str, calls: Sequence[ToolCall]) -> str:
    """A reply's text for the window: as generated, or, when it made calls (shown as rows
    of their own), its reasoning and content without the calls' syntax."""
    if not calls:
        return text
    return f"<think>{reasoning}</think>\n\n{content}" if reasoning else content
