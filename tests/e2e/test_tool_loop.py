"""The chat's tool loop on the real engine and the default model, with a real SQLite store and
real tools (Python functions, tests/e2e/python_tools.py). The small model would not call a
tool by itself, so rounds are forced with the grammar the API server forces
`tool_choice: required` with. One engine serves the module's tests, each in its own home.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from app.conversations import ConversationStore, Message
from app.engine.host import EngineClient
from app.engine.protocol import LoadOptions
from app.models.default import default_model_path
from app.session import ChatSession
from app.tool_loop import (
    CANCELLED_CALL,
    FAILED_CALL,
    CallProgress,
    RoundDone,
    ToolEvent,
    ToolLoop,
)
from tests.e2e.python_tools import (
    CLOCK,
    N_CTX,
    QUESTION,
    ROUNDS,
    SAMPLING,
    WEATHER,
    PythonTool,
    PythonTools,
    forced,
    weather,
)

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]


class Engine:
    """The module's engine, on the event loop every test of the module runs on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: EngineClient) -> None:
        self.loop = loop
        self.client = client

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(work)


@pytest.fixture(scope="module")
def engine_here(shared_home: Callable[[str], Path]) -> Iterator[Engine]:
    loop = asyncio.new_event_loop()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(shared_home("tool-loop-engine")))
        client = EngineClient(LoadOptions(str(default_model_path()), n_ctx=N_CTX))
        loop.run_until_complete(client.start())
    try:
        yield Engine(loop, client)
    finally:
        loop.run_until_complete(client.close())
        loop.close()


def _path(store: ConversationStore, conversation_id: str) -> list[Message]:
    return store.current_path(conversation_id)


def _weather_runner() -> PythonTools:
    return PythonTools(PythonTool(WEATHER, weather))


def test_five_rounds_prefill_only_each_result_and_the_template_glue(
    store: ConversationStore, engine_here: Engine
) -> None:
    session = ChatSession(store, engine_here.client)
    events: list[ToolEvent] = []
    loop = ToolLoop(session, _weather_runner(), choice=forced, on_event=events.append)
    conversation = store.create_conversation(sampling=SAMPLING)

    turn = engine_here.run(loop.send(conversation.id, QUESTION))

    assert turn.stopped is None and len(turn.replies) == ROUNDS
    user, *rest = _path(store, conversation.id)
    replies, results = rest[0::2], rest[1::2]
    assert user.content == QUESTION and len(replies) == ROUNDS and len(results) == ROUNDS - 1
    for reply, result, made in zip(replies, results, turn.replies, strict=False):
        (call,) = reply.tool_calls
        assert reply.token_ids == made.token_ids  # the exact ids sampled, stored with the calls
        assert reply.finish_reason == "tool_calls" and "<tool_call>" not in reply.content
        assert result.tool_call_id == call.id and result.finish_reason == "done"
        assert result.content == weather(json.loads(call.arguments)["city"])
    assert not replies[-1].tool_calls

    tokenizer = engine_here.client.local_tokenizer()
    glue = len(tokenizer.tokenize("<|im_end|>\n<|im_start|>tool\n", special=True)) + len(
        tokenizer.tokenize("<|im_end|>\n<|im_start|>assistant\n", special=True)
    )
    rounds = [e for e in events if isinstance(e, RoundDone)]
    assert [e.reply_id for e in rounds] == [r.id for r in replies]
    for before, after, result in zip(replies[:-1], replies[1:], results, strict=True):
        held, stats = before.stats, after.stats
        assert stats == next(e.stats for e in rounds if e.reply_id == after.id).as_dict()
        assert stats["reused_tokens"] == held["prompt_tokens"] + held["generated_tokens"]
        assert stats["prefilled_tokens"] == len(tokenizer.tokenize(result.content)) + glue

    calls = [e for e in events if isinstance(e, CallProgress) and e.phase != "running"]
    assert [e.phase for e in calls] == ["started", "done"] * (ROUNDS - 1)
    assert [e.result_id for e in calls if e.phase == "done"] == [r.id for r in results]


def test_a_loop_killed_mid_way_goes_on_with_its_calls_kept(
    store: ConversationStore, engine_here: Engine, stoke_home: Path, tmp_path: Path
) -> None:
    conversation = store.create_conversation(sampling=SAMPLING)
    marker, log = tmp_path / "second-call", tmp_path / "child.log"
    with log.open("w") as errors:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.python_tools", conversation.id, str(marker)],
            cwd=REPO,
            env={**os.environ, "STOKE_HOME": str(stoke_home)},
            stdout=subprocess.DEVNULL,
            stderr=errors,
            start_new_session=True,
        )
    deadline = time.monotonic() + 240  # generous: a loaded machine starts an engine slowly
    while not marker.exists():
        assert time.monotonic() < deadline, "the loop never reached its second call"
        assert child.poll() is None, f"the loop ended before it was killed: {log.read_text()}"
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)  # the loop and its engine child
    child.wait()
    kept = _path(store, conversation.id)
    assert [m.role for m in kept] == ["user", "assistant", "tool", "assistant"]
    assert kept[2].finish_reason == "done" and kept[3].tool_calls  # the call it was running

    session = ChatSession(store, engine_here.client)
    turn = engine_here.run(
        ToolLoop(session, _weather_runner(), choice=forced).resume(conversation.id)
    )

    path = _path(store, conversation.id)
    assert turn.stopped is None and len(turn.replies) == ROUNDS - 2
    assert [m.id for m in path[:4]] == [m.id for m in kept]
    assert [m.role for m in path] == ["user"] + ["assistant", "tool"] * (ROUNDS - 1) + ["assistant"]
    calls = [c.id for m in path for c in m.tool_calls]
    assert [m.tool_call_id for m in path if m.role == "tool"] == calls
    assert path[4].content == weather(json.loads(kept[3].tool_calls[0].arguments)["city"])
    assert not path[-1].tool_calls and path[-1].status == "complete"


def test_cancel_stops_the_running_call_then_the_reply_and_the_turn_goes_on(
    store: ConversationStore, engine_here: Engine
) -> None:
    session = ChatSession(store, engine_here.client)
    conversation = store.create_conversation(sampling=SAMPLING)

    async def never(city: str) -> str:
        await asyncio.Event().wait()
        return city

    def cancel_once_running(event: ToolEvent) -> None:
        if isinstance(event, CallProgress) and event.phase == "running":
            session.cancel()

    hanging = ToolLoop(
        session,
        PythonTools(PythonTool(WEATHER, never)),
        choice=forced,
        on_event=cancel_once_running,
    )
    first = engine_here.run(hanging.send(conversation.id, QUESTION))
    user, call, cancelled = _path(store, conversation.id)
    assert len(first.replies) == 1 and first.stopped
    assert cancelled.finish_reason == "cancelled" and cancelled.content == CANCELLED_CALL

    answering = ToolLoop(session, _weather_runner(), choice=lambda n: "none")
    second = engine_here.run(
        answering.resume(conversation.id, on_token=lambda token: session.cancel())
    )
    cut = _path(store, conversation.id)[-1]
    assert second.stopped and cut.role == "assistant" and cut.status == "interrupted"

    third = engine_here.run(answering.resume(conversation.id))
    path = _path(store, conversation.id)
    assert [m.id for m in path[:3]] == [user.id, call.id, cancelled.id]
    assert third.stopped is None and len(path) == 4 and path[-1].status == "complete"
    beside = [m.id for m in store.siblings(path[-1].id)[0]]
    assert path[-1].id != cut.id and cut.id in beside  # the cut reply is kept beside it


def test_denied_and_failed_calls_reach_the_model_in_words_and_the_rounds_limit_holds(
    store: ConversationStore, engine_here: Engine
) -> None:
    def clock() -> str:
        raise RuntimeError("internal detail 42")

    reason = "The person did not allow it: no weather today."
    runner = PythonTools(
        PythonTool(WEATHER, weather), PythonTool(CLOCK, clock), denied={"weather": reason}
    )
    events: list[ToolEvent] = []
    loop = ToolLoop(
        ChatSession(store, engine_here.client),
        runner,
        max_rounds=2,
        choice=lambda n: "weather" if n == 1 else "clock",
        on_event=events.append,
    )
    conversation = store.create_conversation(sampling=SAMPLING)

    turn = engine_here.run(loop.send(conversation.id, QUESTION))

    _, asked, denied, tried, failed = _path(store, conversation.id)
    assert asked.tool_calls[0].name == "weather" and tried.tool_calls[0].name == "clock"
    assert (denied.finish_reason, denied.content) == ("denied", reason)
    assert (failed.finish_reason, failed.content) == ("failed", FAILED_CALL)
    assert turn.stopped is not None and "2 rounds" in turn.stopped and len(turn.replies) == 2
    ends = [e.phase for e in events if isinstance(e, CallProgress) and e.phase != "running"]
    assert ends == ["started", "denied", "started", "failed"]


def test_regenerate_and_edit_run_through_the_loop(
    store: ConversationStore, engine_here: Engine
) -> None:
    """Regenerating a reply of a tool turn, or editing the question, runs the loop again
    from there: calls made and answered anew, the old branch kept beside the new one."""
    loop = ToolLoop(
        ChatSession(store, engine_here.client),
        _weather_runner(),
        choice=lambda n: "weather" if n == 1 else "none",
    )
    conversation = store.create_conversation(sampling=SAMPLING)
    engine_here.run(loop.send(conversation.id, QUESTION))
    user, called, result, answer = _path(store, conversation.id)
    assert called.tool_calls and result.role == "tool" and not answer.tool_calls

    engine_here.run(loop.regenerate(called.id))
    same_user, again, again_result, again_answer = _path(store, conversation.id)
    assert same_user.id == user.id and again.id != called.id and again.tool_calls
    assert called.id in [m.id for m in store.siblings(again.id)[0]]
    assert again_result.tool_call_id == again.tool_calls[0].id and again_answer.role == "assistant"

    engine_here.run(loop.edit(user.id, "What is the weather in Oslo?"))
    edited, edited_call, edited_result, _ = _path(store, conversation.id)
    assert edited.id != user.id and edited.content == "What is the weather in Oslo?"
    assert edited_call.tool_calls and edited_result.role == "tool"
