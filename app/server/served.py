"""The reply hook: each finished chat reply, on every chat API of this server, handed to a
sink, so something beside the server (the window's store) can keep it.

One record per reply (`ServedReply`), made where every endpoint finishes a reply
(requests.py's `RequestCore.finish_reply`: /v1/chat/completions, /v1/messages and
/v1/responses, streamed or not): the request's messages as the model read them (the system
prompt with the tool block this server added, user, assistant with its calls and, where this
server made it, its exact ids; tool results), the reply's text, calls and exact sampled ids,
the prompt's ids, the model and who asked. The server knows nothing of storage: it calls
`ReplySink.served`, and `stoke serve` alone passes no sink. A sink's failure never reaches the
client; it is logged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from app.server.replay import ReplyStore, calls_key
from app.server.schema import Message
from app.toolcalls.tools import ToolCall

MAX_CLIENT = 200  # characters of a user agent kept


@dataclass(frozen=True)
class ServedMessage:
    """One message after the system prompt: user, assistant or tool."""

    role: Literal["user", "assistant", "tool"]
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tokens: tuple[int, ...] | None = None  # an assistant message's exact ids, this model's
    images: tuple[bytes, ...] = ()  # a user message's pictures, at IMAGE_MARKs in `text`


@dataclass(frozen=True)
class ServedReply:
    """A finished reply and the request it answers."""

    endpoint: str  # the route, e.g. "/v1/messages"
    model: str  # the model's name, as the API reports it
    model_path: str | None  # its file, where it has one
    fingerprint: str  # the model the ids belong to
    system: str | None
    messages: tuple[ServedMessage, ...]
    text: str  # the reply as the window shows it: reasoning in <think>, content, no call syntax
    tool_calls: tuple[ToolCall, ...]
    prompt_tokens: tuple[int, ...]
    reply_tokens: tuple[int, ...] | None  # None: a stop sequence cut inside a token
    finish_reason: str  # "stop", "length" or "tool_calls"
    stats: dict | None  # the engine's GenerationStats.as_dict()
    client: str | None  # the client's user agent, when it sent one


class ReplySink(Protocol):
    def served(self, reply: ServedReply) -> None:
        """Take a finished reply; may be called on the server's loop, must not block it."""
        ...


def served_messages(
    messages: Sequence[Message], replies: ReplyStore, fingerprint: str
) -> tuple[str | None, tuple[ServedMessage, ...]] | None:
    """(system prompt, the rest) of a request's messages, each assistant message with the
    exact ids replay found for it; None for a history a conversation cannot hold (a system
    message after the first message)."""
    system = messages[0].text if messages and messages[0].role == "system" else None
    rest = messages[1:] if system is not None else messages
    served: list[ServedMessage] = []
    for message in rest:
        if message.role == "system":
            return None
        tokens = None
        if message.role == "assistant":
            calls = (
                calls_key(message.text, [c.canonical() for c in message.tool_calls])
                if message.tool_calls
                else None
            )
            found = replies.find(message.text, message.reasoning, calls)
            if found is not None and found.fingerprint == fingerprint:
                tokens = found.tokens
        served.append(
            ServedMessage(
                message.role,
                message.text,
                message.tool_calls,
                message.tool_call_id,
                tokens,
                message.images,
            )
        )
    return system, tuple(served)


def client_of(user_agent: str | None) -> str | None:
    return user_agent.strip()[:MAX_CLIENT] or None if user_agent else None
