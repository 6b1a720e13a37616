"""The chat's tool loop: a turn in which the model may call tools, which a ToolRunner runs,
round after round until the model answers without a call.

The tools reach the model through its chat template as the API server tells a request's
tools (app/toolcalls/prompt.py), each reply is read for calls with the server's parser (its
reasoning apart, calls.py), and a round that must call a tool is held to one by the server's
grammar (`choice` says, per round: auto, none, required or a function's name). A round:

1. the reply streams into an assistant message as every reply does (saved as it streams);
   its last write carries its calls, its content as the window shows it, and the exact ids
   it sampled, so on disk a reply's calls and tokens are never apart;
2. each call goes to the runner, in order, and its result is stored as a `tool` message the
   moment it is back: how it ended in `finish_reason` (done, failed, denied, cancelled), its
   seconds and, when the model reads less than its row shows, the full text in `stats`;
3. the next prompt is the same transcript extended by the results: the call is the ids the
   model sampled, so the engine prefills only the results and the template's glue.

The loop ends when the model answers without a call, after `max_rounds` rounds of calls
(said in words), or when the person cancels (session.cancel: the reply is kept interrupted, a
running call is stored as cancelled). Nothing stored is lost: after a kill -9 mid-loop,
`resume` goes on from the conversation's leaf: calls without a result are run, a reply cut
short is made again beside the one kept, results are answered.

The callback hears each round's reply (its stats: prompt, reused and prefilled tokens) and
each call's progress (started, running with its elapsed time every TICK_S, and how it
ended), for a window's rows and status line. Approving a call is the runner's business.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from app.conversations import Conversation, Message
from app.conversations import ToolCall as StoredCall
from app.engine.protocol import EngineError, GenerationStats
from app.engine.remote_wire import WIRE_TEMPLATE
from app.session import ChatSession, EmptyMessageError, OnStart, OnToken, TurnResult
from app.toolcalls.calls import reply_calls, shown_text
from app.toolcalls.grammar import enforceable, reply_grammar
from app.toolcalls.prompt import ToolPrompt, tool_prompt
from app.toolcalls.reasoning import opens_reasoning, split_reasoning
from app.toolcalls.syntax import ToolSyntax, syntax_for
from app.toolcalls.tools import ResponseFormat, ToolCall, ToolError, Tools, ToolSpec, tools_of

logger = logging.getLogger("stoke.tools")

DEFAULT_MAX_ROUNDS = 10
TICK_S = 0.5  # how often a running call's elapsed time is told
T = TypeVar("T")

CallState = Literal["done", "failed", "denied", "cancelled"]
CallPhase = Literal["started", "running", "done", "failed", "denied", "cancelled"]
CANCELLED_CALL = "The person stopped this call before it finished."
FAILED_CALL = "The call failed inside Stoke before the tool could answer."


class ToolLoopError(EngineError):
    """A tool turn that cannot run, in words."""


@dataclass(frozen=True)
class ToolOutcome:
    """How a call ended. `text` is what the model reads: the result, or why it failed or was
    denied, in words; `shown` is the full text a row shows when the model reads less (a long
    result cut for the model), else None."""

    state: CallState
    text: str
    shown: str | None = None


class ToolRunner(Protocol):
    """What runs a chat's tools (the window and the terminal chat, over MCP). Asking the
    person to approve a call is the runner's business: a call it may not run comes back
    denied, with the reason the model reads."""

    async def specs(self) -> Sequence[ToolSpec]:
        """The tools the model is offered this turn."""
        ...

    async def run(self, call: ToolCall) -> ToolOutcome:
        """Run one call to its end; cancelled (asyncio) when the person cancels the turn."""
        ...


@dataclass(frozen=True)
class RoundDone:
    """A round's reply is in: its calls (none: the model's answer) and its stats."""

    round: int  # the reply's place in the turn, from 1
    reply_id: str
    calls: tuple[ToolCall, ...]
    stats: GenerationStats | None


@dataclass(frozen=True)
class CallProgress:
    """A call started, is still running (every TICK_S), or ended (`outcome`, `result_id`)."""

    round: int
    call: ToolCall
    phase: CallPhase
    elapsed_s: float
    outcome: ToolOutcome | None = None
    result_id: str | None = None  # the stored `tool` message


ToolEvent = RoundDone | CallProgress
OnToolEvent = Callable[[ToolEvent], None]


@dataclass(frozen=True)
class ToolTurn:
    """What one run of the loop did: its replies in order, and why it ended before the
    model answered without a call (None when it did answer)."""

    conversation_id: str
    replies: tuple[TurnResult, ...]
    stopped: str | None = None


def _auto(_round: int) -> str:
    return "auto"


@dataclass(frozen=True)
class _Setup:
    """What every round of one run shares: the syntax, how tools are told, the specs."""

    specs: Sequence[ToolSpec]
    syntax: ToolSyntax
    told: ToolPrompt
    opened: bool  # the template's generation prompt opens <think>


class ToolLoop:
    """Tool turns for one session with one runner (see the module's docstring)."""

    def __init__(
        self,
        session: ChatSession,
        runner: ToolRunner,
        *,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        choice: Callable[[int], str] = _auto,
        on_event: OnToolEvent | None = None,
    ) -> None:
        self.session = session
        self.runner = runner
        self.max_rounds = max_rounds
        self.choice = choice  # a round's number -> auto | none | required | a function's name
        self.on_event = on_event

    async def send(
        self,
        conversation_id: str,
        text: str,
        *,
        attachments: list[dict] | None = None,
        on_token: OnToken | None = None,
        on_start: OnStart | None = None,
    ) -> ToolTurn:
        """The user's message (on disk before anything else), then rounds until the model
        answers without a call."""
        if not text.strip():
            raise EmptyMessageError()
        async with self.session.hold_turn(conversation_id) as conversation:
            user = self.session.store.append_user_message(conversation.id, text, attachments)
            return await self._rounds(conversation, user, on_token, on_start)

    async def resume(
        self,
        conversation_id: str,
        *,
        on_token: OnToken | None = None,
        on_start: OnStart | None = None,
    ) -> ToolTurn:
        """Go on with the turn at the conversation's leaf: after a kill, a cancel or the
        rounds limit, the calls and results already stored are kept."""
        async with self.session.hold_turn(conversation_id) as conversation:
            path = self.session.store.current_path(conversation.id)
            if not path:
                raise ToolLoopError("This conversation has no turn to continue yet.")
            leaf = path[-1]
            if leaf.role == "assistant" and leaf.status == "complete" and not leaf.tool_calls:
                raise ToolLoopError(
                    "This turn is finished: the model answered without calling a tool."
                )
            return await self._rounds(conversation, leaf, on_token, on_start)

    async def regenerate(
        self,
        reply_id: str,
        *,
        on_token: OnToken | None = None,
        on_start: OnStart | None = None,
    ) -> ToolTurn:
        """A new reply beside `reply_id`, to the same message (the person's, or a call's
        result), and rounds on from it; the old reply and what followed it stay a branch."""
        store = self.session.store
        old = store.get_message(reply_id)
        if old.role != "assistant" or old.parent_id is None:
            raise ToolLoopError("Only a reply can be regenerated.")
        async with self.session.hold_turn(old.conversation_id) as conversation:
            at = store.get_message(old.parent_id)
            return await self._rounds(conversation, at, on_token, on_start)

    async def edit(
        self,
        user_message_id: str,
        text: str,
        *,
        on_token: OnToken | None = None,
        on_start: OnStart | None = None,
    ) -> ToolTurn:
        """Edit-and-resend: a new message of the person's beside the old one (its files
        kept), then rounds until the model answers."""
        store = self.session.store
        old = store.get_message(user_message_id)
        if old.role != "user":
            raise ToolLoopError("Only your own messages can be edited.")
        if not text.strip():
            raise EmptyMessageError()
        async with self.session.hold_turn(old.conversation_id) as conversation:
            user = store.add_message(
                conversation.id, old.parent_id, "user", text, attachments=old.attachments
            )
            return await self._rounds(conversation, user, on_token, on_start)

    async def _rounds(
        self,
        conversation: Conversation,
        at: Message,
        on_token: OnToken | None,
        on_start: OnStart | None,
    ) -> ToolTurn:
        """Rounds from the message `at` until the model answers, the limit or a cancel."""
        store = self.session.store
        replies: list[TurnResult] = []
        specs = await self._cancellable(self.runner.specs())
        if specs is None:
            return ToolTurn(conversation.id, (), "Stopped before the model was asked.")
        setup = await self._setup(conversation, specs)
        rounds_run = 0
        while True:
            if at.role == "assistant" and at.status != "complete" and at.parent_id is not None:
                at = store.get_message(at.parent_id)  # cut short: made again beside it
                continue
            path = store.path_to(at.id)
            made, pending = _unanswered(path)
            if made is not None and pending:
                number = _turn_replies(path).index(made) + 1
                at = await self._run_calls(conversation, at, number, pending)
                rounds_run += 1
                if self.session.cancelled:
                    return ToolTurn(
                        conversation.id, tuple(replies), "Stopped: a call was cancelled."
                    )
                if rounds_run >= self.max_rounds:
                    return ToolTurn(conversation.id, tuple(replies), _limit(self.max_rounds))
                continue
            if at.role == "assistant":
                return ToolTurn(conversation.id, tuple(replies))
            number = len(_turn_replies(path)) + 1
            result, calls = await self._reply(conversation, at, setup, number, on_token, on_start)
            replies.append(result)
            self._emit(RoundDone(number, result.reply_message_id, tuple(calls), result.stats))
            if result.status != "complete":
                return ToolTurn(
                    conversation.id, tuple(replies), "Stopped: the reply was cancelled."
                )
            at = store.get_message(result.reply_message_id)

    async def _setup(self, conversation: Conversation, specs: Sequence[ToolSpec]) -> _Setup:
        """How this model is told about `specs`, checked as a request's tools are."""
        info = await self.session.engine_ready()
        source = self.session.template(conversation).source
        if source == WIRE_TEMPLATE:
            raise ToolLoopError(
                "Tools in the chat need a model that runs here, or a remote engine in token "
                "mode; a remote engine in chat mode applies its own tool calls."
            )
        syntax = syntax_for(source, info.architecture)
        told = tool_prompt(_offered(specs, "auto"), source, syntax)
        opened = opens_reasoning(self.session.template(conversation, told))
        return _Setup(specs, syntax, told, opened)

    async def _reply(
        self,
        conversation: Conversation,
        after: Message,
        setup: _Setup,
        number: int,
        on_token: OnToken | None,
        on_start: OnStart | None,
    ) -> tuple[TurnResult, list[ToolCall]]:
        """One round's reply after `after`, and the calls it made (stored with it)."""
        tools = _offered(setup.specs, self.choice(number))
        grammar = self._grammar(tools, setup.syntax)
        found: list[ToolCall] = []

        def finish(text: str) -> dict[str, Any]:
            reasoning, content = split_reasoning(text, opened=setup.opened)
            content, calls = reply_calls(tools, setup.syntax, content)
            found.extend(calls)
            if not calls:
                return {}
            return {
                "content": shown_text(text, reasoning, content, calls),
                "tool_calls": [StoredCall(c.id, c.name, c.arguments) for c in calls],
                "finish_reason": "tool_calls",
            }

        result = await self.session.reply(
            conversation,
            after,
            on_token=on_token,
            on_start=on_start,
            tools=setup.told,
            grammar=grammar,
            finish=finish,
        )
        return result, found

    def _grammar(self, tools: Tools, syntax: ToolSyntax) -> str | None:
        """The grammar that holds a round to a call, when its choice forces one."""
        tokenizer = self.session.engine.local_tokenizer()
        grammar = reply_grammar(
            ResponseFormat(), tools, syntax, lambda t: tokenizer.tokenize(t, special=True)
        )
        if grammar is None:
            return None
        try:
            return enforceable(grammar, "tools")
        except ToolError:
            raise ToolLoopError(
                "A tool's parameters use a JSON schema the model cannot be held to, so this "
                "round cannot be made to call it. Let the model choose (auto) instead."
            ) from None

    async def _run_calls(
        self, conversation: Conversation, at: Message, number: int, calls: Sequence[ToolCall]
    ) -> Message:
        """Run `calls` in order, each result stored as it comes, under `at`; returns the
        last result stored. A cancel stops after the call it cancelled."""
        for call in calls:
            if self.session.cancelled:
                break
            at = await self._run_call(conversation, at, number, call)
        return at

    async def _run_call(
        self, conversation: Conversation, at: Message, number: int, call: ToolCall
    ) -> Message:
        self._emit(CallProgress(number, call, "started", 0.0))
        started = time.monotonic()
        work = asyncio.ensure_future(self.runner.run(call))
        try:
            with self.session.cancels(work):
                while not work.done():
                    await asyncio.wait({work}, timeout=TICK_S)
                    if not work.done():
                        self._emit(
                            CallProgress(number, call, "running", time.monotonic() - started)
                        )
        finally:
            if not work.done():  # the loop itself was cancelled
                work.cancel()
        outcome = _outcome(work, call)
        elapsed = time.monotonic() - started
        stats: dict[str, Any] = {"elapsed_s": round(elapsed, 3)}
        if outcome.shown is not None:
            stats["shown"] = outcome.shown
        result = self.session.store.add_message(
            conversation.id,
            at.id,
            "tool",
            outcome.text,
            finish_reason=outcome.state,
            stats=stats,
            tool_call_id=call.id,
            tool_name=call.name,
        )
        self._emit(CallProgress(number, call, outcome.state, elapsed, outcome, result.id))
        return result

    async def _cancellable(self, work: Awaitable[T]) -> T | None:
        """`work`'s result, or None when the person cancels while it runs."""
        future = asyncio.ensure_future(work)
        with self.session.cancels(future):
            try:
                return await future
            except asyncio.CancelledError:
                if future.cancelled() and self.session.cancelled:
                    return None
                raise

    def _emit(self, event: ToolEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)


def _offered(specs: Sequence[ToolSpec], choice: str) -> Tools:
    try:
        return tools_of(specs, choice)
    except ToolError as error:
        raise ToolLoopError(f"The tools cannot be offered to the model: {error.message}") from None


def _outcome(work: asyncio.Future, call: ToolCall) -> ToolOutcome:
    """How a call's work ended, in words: a runner that failed is logged, never shown."""
    if work.cancelled():
        return ToolOutcome("cancelled", CANCELLED_CALL)
    error = work.exception()
    if error is not None:
        logger.error("the tool runner failed on %s", call.name, exc_info=error)
        return ToolOutcome("failed", FAILED_CALL)
    return work.result()


def _unanswered(path: Sequence[Message]) -> tuple[Message | None, list[ToolCall]]:
    """The last reply of the turn that made calls, and those of its calls no result on the
    path answers yet (in the order made)."""
    answered: set[str] = set()
    for message in reversed(path):
        if message.role == "tool" and message.tool_call_id:
            answered.add(message.tool_call_id)
        elif message.role == "assistant":
            calls = [ToolCall(c.id, c.name, c.arguments) for c in message.tool_calls]
            return message, [c for c in calls if c.id not in answered]
        else:
            break
    return None, []


def _turn_replies(path: Sequence[Message]) -> list[Message]:
    """The replies since the user's last message on `path`, in order: a round's number is
    its reply's place among them, from 1."""
    start = max((i for i, m in enumerate(path) if m.role == "user"), default=-1) + 1
    return [m for m in path[start:] if m.role == "assistant"]


def _limit(rounds: int) -> str:
    return (
        f"Stopped after {rounds} rounds of tool calls, the most one turn may take; continue "
        "the turn to let the model go on."
    )
