"""Tool calls and tool results in conversation files: read, checked in words, written back.

Both imports (Stoke's export and OpenAI-style message lists) read calls through here, in
either spelling: Stoke's `{"id", "name", "arguments"}` or OpenAI's `{"id", "type":
"function", "function": {"name", "arguments"}}`, the arguments as JSON text or as an object
(written back as compact JSON text, as the API sends them). A tool result must follow an
assistant message that makes calls, or another result, as the API requires.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.conversations.errors import ImportFormatError
from app.conversations.models import ToolCall

MAX_NAME = 64  # OpenAI's limit on a function's name


def read_calls(where: str, raw: Any) -> tuple[ToolCall, ...]:
    """The `tool_calls` of the message `where` names ("Message 3"); none for a missing list."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ImportFormatError(f"{where}'s tool_calls must be a list of calls.")
    return tuple(_call(f"{where}'s tool call {i}", entry) for i, entry in enumerate(raw, 1))


def _call(where: str, entry: Any) -> ToolCall:
    if not isinstance(entry, Mapping):
        raise ImportFormatError(f"{where} is not an object.")
    function = entry.get("function", entry)
    if not isinstance(function, Mapping):
        raise ImportFormatError(f"{where}'s function must be an object with a name.")
    name = function.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise ImportFormatError(f"{where} needs a function name of 1 to {MAX_NAME} characters.")
    call_id = entry.get("id", "")
    if not isinstance(call_id, str):
        raise ImportFormatError(f"{where}'s id must be text.")
    arguments = function.get("arguments", "{}")
    if arguments is None:
        arguments = "{}"
    if not isinstance(arguments, str):
        try:
            arguments = json.dumps(arguments, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise ImportFormatError(f"{where}'s arguments are neither text nor JSON.") from exc
    return ToolCall(call_id, name, arguments)


def check_follows_calls(where: str, role: str, previous: Any | None) -> None:
    """Refuse a tool result whose message before it (`previous`: a record with `role` and
    its calls, or None) is neither an assistant message with calls nor another result."""
    if role != "tool":
        return
    after_calls = previous is not None and (
        previous["role"] == "tool" or (previous["role"] == "assistant" and previous["calls"])
    )
    if not after_calls:
        raise ImportFormatError(
            f"{where} is a tool result, but the message before it makes no tool call."
        )


def name_of_call(call_id: str | None, calls: Sequence[ToolCall]) -> str | None:
    """The function of the call `call_id` among `calls`, when a result does not say."""
    return next((call.name for call in calls if call_id and call.id == call_id), None)


def pretty_arguments(arguments: str) -> str:
    """The arguments as indented JSON for people; text that is not JSON as it is."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (json.JSONDecodeError, TypeError):
        return arguments


def fenced(text: str, language: str) -> str:
    """`text` as a Markdown code block whatever backticks it holds (the fence is longer)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text.rstrip()}\n{fence}"
