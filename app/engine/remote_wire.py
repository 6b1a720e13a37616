"""The remote engine's `chat` mode wire format: a transcript of bytes and markers that is an
OpenAI chat request, tools included.

A server that takes only chat messages still gets Stoke's transcript (engine/transcript.py):
its "tokens" are UTF-8 bytes (0-255) and the marker ids below, and its chat template is
WIRE_TEMPLATE. Before each request the engine reads the messages back out of the tokens
(`wire_request`), so the window, the API server and every other caller build chat-mode
prompts exactly as they build token prompts, and nothing beside the tokens crosses to the
engine process.

What passes through, so the remote server applies its own template, tool parser and grammar:
- the request's `tools`, `tool_choice`, `parallel_tool_calls` and `response_format`, as the
  template variable REQUEST_VARIABLE (OpenAI's fields), written once at the start;
- `tool` messages with their `tool_call_id`;
- assistant messages' calls, kept in the reply as `<tool_call>` blocks (CALLS_FORMAT, the
  spelling the API server parses for a template that names no tool family), read back into
  `tool_calls`. Their ids are those of the tool results that follow, in order (the ids a
  client sees are the API server's own, not the remote's).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant")  # ids 256-258, then the end marker: as first shipped
END_ID = 256 + len(ROLES)
TOOL_ID = END_ID + 1  # later markers come after, so stored ids keep their meaning
REQUEST_ID = END_ID + 2
SEP_ID = END_ID + 3  # in a tool message: its call id (JSON) before, its content after
MARKERS = {f"<|stoke:{role}|>": 256 + i for i, role in enumerate(ROLES)}
MARKERS.update(
    {
        "<|stoke:end|>": END_ID,
        "<|stoke:tool|>": TOOL_ID,
        "<|stoke:request|>": REQUEST_ID,
        "<|stoke:sep|>": SEP_ID,
    }
)
N_BYTE_VOCAB = SEP_ID + 1
_FIELDS = ""  # what the request marker opens: the fields passed through, not a message
_OPENERS = {**{256 + i: r for i, r in enumerate(ROLES)}, TOOL_ID: "tool", REQUEST_ID: _FIELDS}

REQUEST_VARIABLE = "stoke_request"
PASSED_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

# Text the template writes itself (the request, a call id) has `<|` escaped inside its JSON
# strings, so no value a client sends can spell a marker.
_JSON = "| tojson | replace('<|', '<\\\\u007c')"
WIRE_TEMPLATE = (  # REQUEST_VARIABLE by name
    "{% if stoke_request %}<|stoke:request|>{{ stoke_request " + _JSON + " }}<|stoke:end|>"
    "{% endif %}"
    "{% for message in messages %}<|stoke:{{ message['role'] }}|>"
    "{% if message['role'] == 'tool' and message['tool_call_id'] %}"
    "{{ message['tool_call_id'] " + _JSON + " }}<|stoke:sep|>{% endif %}"
    "{{ message['content'] }}<|stoke:end|>{% endfor %}"
    "{% if add_generation_prompt %}<|stoke:assistant|>{% endif %}"
)


@dataclass
class WireRequest:
    """The chat request a wire transcript holds: messages and the fields passed through."""

    messages: list[dict[str, Any]]
    fields: dict[str, Any] = field(default_factory=dict)


def wire_request(tokens: Sequence[int]) -> WireRequest:
    """The OpenAI request in a wire prompt. An assistant turn left open at the end is the
    generation prompt: dropped when empty, kept (a reply to continue) otherwise. Raises
    ValueError when the tokens are not a wire transcript."""
    messages: list[dict[str, Any]] = []
    fields: dict[str, Any] = {}
    role: str | None = None
    content = bytearray()
    head: bytes | None = None  # a tool message's call id, once its separator is seen
    for t in tokens:
        if t in _OPENERS:
            if role is not None:
                raise ValueError("a message starts inside another")
            role, content, head = _OPENERS[t], bytearray(), None
        elif t == SEP_ID and role == "tool" and head is None:
            head, content = bytes(content), bytearray()
        elif t == END_ID:
            if role is None:
                raise ValueError("a message ends that never started")
            if role == _FIELDS:
                fields = _fields(content)
            else:
                messages.append(_message(role, content.decode("utf-8", "replace"), head))
            role = None
        elif 0 <= t < 256 and role is not None:
            content.append(t)
        else:
            raise ValueError(f"token {t} is outside any message")
    if role and content:  # an open message: a reply to continue (or a draft)
        messages.append(_message(role, content.decode("utf-8", "replace"), head))
    _pair_call_ids(messages)
    return WireRequest(messages, fields)


def calls_text(calls: Sequence[tuple[str, str]], *, after_content: bool) -> str:
    """A reply's (name, arguments JSON) calls as the transcript keeps them: `<tool_call>`
    blocks, arguments compacted where they are JSON, on a line of their own after content."""
    blocks = [
        f'{CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '
        f"{_compact(arguments)}}}\n{CALL_CLOSE}"
        for name, arguments in calls
    ]
    return ("\n" if after_content and blocks else "") + "\n".join(blocks)


def _message(role: str, text: str, head: bytes | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role, "content": text}
    if role == "tool" and head is not None:
        message["tool_call_id"] = _json_string(head)
    if role == "assistant":
        content, calls = _split_calls(text)
        if calls:
            message["content"] = content or None
            message["tool_calls"] = [
                {"id": "", "type": "function", "function": {"name": n, "arguments": a}}
                for n, a in calls
            ]
    return message


def _fields(raw: bytearray) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError("the request fields are not JSON") from exc
    if not isinstance(value, dict):
        raise ValueError("the request fields are not an object")
    return {k: v for k, v in value.items() if k in PASSED_FIELDS}


def _json_string(raw: bytes) -> str:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError("a tool call id is not JSON") from exc
    return value if isinstance(value, str) else str(value)


def _split_calls(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(content, calls) of an assistant message whose text ends in `<tool_call>` blocks;
    text whose end does not parse as calls is all content."""
    at = text.find(CALL_OPEN)
    while at >= 0:
        calls = _calls(text[at:])
        if calls:
            return text[:at].rstrip(), calls
        at = text.find(CALL_OPEN, at + 1)
    return text, []


def _calls(tail: str) -> list[tuple[str, str]] | None:
    decoder, calls, pos = json.JSONDecoder(), [], 0
    while pos < len(tail):
        if not tail.startswith(CALL_OPEN, pos):
            return None
        try:
            value, pos = decoder.raw_decode(tail, _skip_space(tail, pos + len(CALL_OPEN)))
        except json.JSONDecodeError:
            return None
        pos = _skip_space(tail, pos)
        name = value.get("name") if isinstance(value, dict) else None
        if not tail.startswith(CALL_CLOSE, pos) or not isinstance(name, str):
            return None
        arguments = value.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append((name, arguments))
        pos = _skip_space(tail, pos + len(CALL_CLOSE))
    return calls


def _skip_space(text: str, pos: int) -> int:
    return len(text) - len(text[pos:].lstrip())


def _pair_call_ids(messages: list[dict[str, Any]]) -> None:
    """Give each call the id of the tool result answering it (the results that follow, in
    order), or one of its own, and each result without an id its call's."""
    for i, message in enumerate(messages):
        calls = message.get("tool_calls") or []
        answers = []
        for later in messages[i + 1 :]:
            if later["role"] != "tool":
                break
            answers.append(later)
        for k, call in enumerate(calls):
            given = answers[k].get("tool_call_id") if k < len(answers) else None
            call["id"] = given or f"call_{i}_{k}"
        for k, answer in enumerate(answers[: len(calls)]):
            answer.setdefault("tool_call_id", calls[k]["id"])


def _compact(arguments: str) -> str:
    """Arguments JSON without spacing of its own; text that is not JSON as a JSON string."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except json.JSONDecodeError:
        return json.dumps(arguments, ensure_ascii=False)
