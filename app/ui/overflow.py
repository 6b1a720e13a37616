"""When a message does not fit the context: only the ways out that can work.

Leaving older turns out cannot help a message that alone is too long, so the banner then
offers to shorten it (the inline editor, so the edit becomes a branch) and, when the model
was trained for more than the loaded context, to reload it with a context that holds the
message and room for a reply, then send it again. The window hands itself as an
`OverflowWindow`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from app.engine.protocol import EngineError, ModelInfo
from app.session import REPLY_ROOM, ChatSession, MessageTooLongError, TurnResult

if TYPE_CHECKING:
    from app.conversations import ConversationStore
    from app.engine.prewarm import Prewarmer
    from app.ui.chat_view import ChatView

CONTEXT_STEP = 1024  # contexts offered are whole multiples of this
Action = tuple[str, Callable[[], object]]


class OverflowWindow(Protocol):
    """The main window as the ways out use it: the open conversation and its chat, the
    session and its prewarming, and the window's turns."""

    session: ChatSession
    store: ConversationStore
    prewarm: Prewarmer
    chat: ChatView
    conversation_id: str | None

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task | None: ...

    async def run_turn(
        self, start: Callable[..., Awaitable[TurnResult]], *args: Any, drop_oldest: bool = False
    ) -> TurnResult | None: ...


def larger_context(info: ModelInfo | None, prompt_tokens: int) -> int | None:
    """The smallest context (a multiple of CONTEXT_STEP) that holds `prompt_tokens` with room
    for a reply, when the model was trained for it and it is larger than the loaded one."""
    if info is None or info.n_ctx_train <= 0:
        return None
    needed = math.ceil(prompt_tokens / (1 - REPLY_ROOM))
    n_ctx = -(-needed // CONTEXT_STEP) * CONTEXT_STEP
    if n_ctx <= info.n_ctx or n_ctx > info.n_ctx_train:
        return None
    return n_ctx


def too_long_actions(window: OverflowWindow, error: MessageTooLongError) -> list[Action]:
    """The banner's actions for a message too long on its own."""
    path = window.store.current_path(window.conversation_id)
    users = [m for m in path if m.role == "user"]
    actions: list[Action] = []
    if users:
        actions.append(("Shorten it", lambda: window.chat.edit_message(users[-1].id)))
    n_ctx = larger_context(window.session.engine.info, error.prompt_tokens)
    if n_ctx is not None:
        actions.append(
            (
                f"Reload with a {n_ctx:,}-token context",
                lambda: window.spawn(reload_and_resend(window, n_ctx)),
            )
        )
    return actions


async def reload_and_resend(window: OverflowWindow, n_ctx: int) -> None:
    """Restart the engine with a larger context, then answer the message that did not fit."""
    session = window.session
    window.prewarm.cancel()
    await window.prewarm.idle()
    engine = session.engine
    await engine.close()
    engine.options = replace(engine.options, n_ctx=n_ctx)
    with contextlib.suppress(EngineError):  # the header and the banner say why
        await engine.start()
    conversation_id = window.conversation_id
    leaf = window.store.current_path(conversation_id)[-1]
    if leaf.role != "user":
        return
    await window.run_turn(
        lambda **kw: session.send(conversation_id, leaf.content, attachments=leaf.attachments, **kw)
    )
