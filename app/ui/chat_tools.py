"""The window's tools: one app-wide pool of MCP servers, and the chat's turns through the tool
loop when the open conversation has tools on.

Promises:

- A conversation has tools on unless its settings say `mcp_servers: []` (a list of names: only
  those servers; absent: every server turned on in mcp.json), and only while mcp.json has a
  server turned on. With none configured, no turn goes through here: the chat works as
  without tools.
- The pool is made at the first turn or state asked for, servers starting when first needed
  (app/mcp/pool.py); `reconfigured` (after Settings > Tools changed mcp.json) closes it so the
  next use reads the file again; `close` stops every server (the app's shutdown).
- Every call is approved by the person (approval.py) unless mcp.json trusts it; what each
  call is doing is told by `call_changed` in words (waiting for approval, running with its
  seconds, done, failed, denied, cancelled), each round by `round_done` (kept in `rounds`,
  of the turn in `conversation_id`).
- The rounds a turn may take are Settings' `tool_rounds`; `choice` says per round whether the
  model must call (auto unless set: the GUI tests force calls the small model would not make).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from app.conversations import Conversation, Message
from app.mcp import config, trust
from app.mcp.client import ServerState
from app.mcp.pool import Pool
from app.presets import TOOLS_KEY
from app.session import ChatSession
from app.settings import Settings
from app.tool_loop import (
    CallProgress,
    CallRequest,
    Decision,
    McpRunner,
    RoundDone,
    ToolEvent,
    ToolLoop,
    ToolTurn,
)
from app.toolcalls.tools import ToolCall
from app.ui import approval

SERVERS_KEY = TOOLS_KEY  # in a conversation's settings (its sampling dict), presets carry it

WAITING = "waiting for approval"
ENDED_WORDS = ("done", "failed", "denied", "cancelled")  # as the loop stores a call's end


def in_tool_turn(path: Sequence[Message]) -> bool:
    """Whether the turn `path` ends in made tool calls: a call or a result since the user's
    last message."""
    for message in reversed(path):
        if message.role == "user":
            return False
        if message.role == "tool" or message.tool_calls:
            return True
    return False


def tools_on(conversation: Conversation) -> bool:
    """Whether the conversation's settings leave its tools on (see the module's docstring)."""
    return conversation.sampling.get(SERVERS_KEY) != []


def call_words(event: CallProgress, waiting: bool) -> str:
    """A call's state as its row says it."""
    if waiting:
        return WAITING
    if event.phase == "running":
        return f"running {event.elapsed_s:.1f} s"
    return "running" if event.phase == "started" else event.phase


def unfinished(path: Sequence[Message]) -> bool:
    """Whether `path` ends a tool turn left unfinished (a kill, a cancel, the rounds limit):
    at a result, or at a reply whose calls were made. A reply cut short says so itself."""
    if not path or not in_tool_turn(path):
        return False
    leaf = path[-1]
    return leaf.role == "tool" or (leaf.status == "complete" and bool(leaf.tool_calls))


def rounds_line(rounds: Sequence[RoundDone]) -> str:
    """Each round's prefilled and reused tokens, for the status line."""
    return " · ".join(
        f"round {r.round}: prefilled {r.stats.prefilled_tokens:,}, reused {r.stats.reused_tokens:,}"
        for r in rounds
        if r.stats is not None
    )


class ChatTools(QObject):
    """The window's tools (see the module's docstring)."""

    state_changed = Signal(str, object)  # server name, ServerState
    call_changed = Signal(str, str)  # call id, its state in words
    round_done = Signal(object)  # RoundDone

    def __init__(self, session: ChatSession, parent: QWidget) -> None:
        super().__init__(parent)
        self.session = session
        self.choice: Callable[[int], str] = lambda _round: "auto"
        self.rounds: list[RoundDone] = []  # the last turn's rounds
        self.conversation_id: str | None = None  # the last turn's conversation
        self._window = parent
        self._pool: Pool | None = None
        self._runner: McpRunner | None = None  # the running turn's
        self._waiting: dict[str, bool] = {}  # call id -> whether it waits for approval now

    # -- servers --

    @property
    def pool(self) -> Pool:
        if self._pool is None:
            self._pool = Pool(
                config.load().servers, lambda name, state: self.state_changed.emit(name, state)
            )
        return self._pool

    def states(self) -> dict[str, ServerState]:
        """Every enabled server's state; stopped until first needed."""
        return self.pool.states()

    def reconfigured(self) -> asyncio.Task | None:
        """mcp.json changed: the running servers stop, the next use reads it again."""
        old, self._pool = self._pool, None
        return None if old is None else asyncio.ensure_future(old.close())

    async def close(self) -> None:
        """Every server stopped (the app quits)."""
        old, self._pool = self._pool, None
        if old is not None:
            await old.close()

    def servers_for(self, conversation_id: str) -> tuple[str, ...] | None:
        """The servers a turn of this conversation offers (None: tools are off for it)."""
        conversation = self.session.store.get_conversation(conversation_id)
        enabled = [s.name for s in config.load().servers if s.enabled]
        if not enabled or not tools_on(conversation):
            return None
        wanted = conversation.sampling.get(SERVERS_KEY)
        if isinstance(wanted, list):
            enabled = [name for name in enabled if name in wanted]
        return tuple(enabled) or None

    # -- turns --

    async def send(self, conversation_id: str, text: str, **kw: Any) -> ToolTurn:
        """The user's message (`attachments`, `on_token`, `on_start` as ToolLoop.send takes
        them), then rounds until the model answers without a call."""
        return await self._loop(conversation_id).send(conversation_id, text, **kw)

    async def resume(self, conversation_id: str, **kw: Any) -> ToolTurn:
        """Go on with the conversation's tool turn (after a crash, a kill or a cancel)."""
        return await self._loop(conversation_id).resume(conversation_id, **kw)

    async def regenerate(self, conversation_id: str, reply_id: str, **kw: Any) -> ToolTurn:
        """A new reply beside `reply_id`, and rounds on from it."""
        return await self._loop(conversation_id).regenerate(reply_id, **kw)

    async def edit(
        self, conversation_id: str, user_message_id: str, text: str, **kw: Any
    ) -> ToolTurn:
        """The person's message edited and sent again, then rounds until an answer."""
        return await self._loop(conversation_id).edit(user_message_id, text, **kw)

    def _loop(self, conversation_id: str) -> ToolLoop:
        self.rounds, self._waiting, self.conversation_id = [], {}, conversation_id
        self._runner = McpRunner(self.pool, self._ask, servers=self.servers_for(conversation_id))
        return ToolLoop(
            self.session,
            self._runner,
            max_rounds=Settings.load().tool_rounds,
            choice=self.choice,
            on_event=self._heard,
        )

    async def _ask(self, request: CallRequest) -> Decision:
        decision = await approval.ask(request, self._window)
        self._waiting[request.call.id] = False
        if decision.allow:
            self.call_changed.emit(request.call.id, "running")
        return decision

    def _asks(self, call: ToolCall) -> bool:
        """Whether `call` waits for the person's approval before it runs (trust.py)."""
        route = self._runner.route(call.name) if self._runner is not None else None
        if route is None:
            return False
        server = config.load().server(route[0])
        return server is not None and trust.needs_approval(server, route[1])

    def _heard(self, event: ToolEvent) -> None:
        if isinstance(event, RoundDone):
            self.rounds.append(event)
            self.round_done.emit(event)
            return
        if event.phase == "started":
            self._waiting[event.call.id] = self._asks(event.call)
        waiting = self._waiting.get(event.call.id, False) and event.phase in ("started", "running")
        self.call_changed.emit(event.call.id, call_words(event, waiting))
