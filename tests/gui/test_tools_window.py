"""The window's tools on the real engine and the tests' tiny model, with the tests' own MCP server
(tests/mcp_server.py, over stdio) in the test's mcp.json: the approval prompt and the calls'
rows, a five-round loop that prefills only each result and the template's glue, and a loop
whose engine is killed mid-way, then continued; and a turn whose whole process was killed
mid-way (tests/gui/killed_tools_turn.py runs the window's turn without Qt), continued in the
window; and the rounds-per-turn setting stopping a turn that Continue goes on with.

The model would not call a tool by itself, so the window's `tools.choice` forces the rounds
before the last to call `pid` (a tool without arguments) with the grammar the API server
forces `tool_choice` with; the last answers in words. What is proven is the approval, the
calls, the rows and the prefills, not the model's words, so the model is the tests' tiny one
(tests/tiny_model.py: SmolLM2's tokenizer and template, random weights), as in
tests/e2e/test_chat_tools.py: SmolLM2's rounds took most of this file's three minutes. The
five-round loop's prefills are checked on SmolLM2 itself, the default model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from PySide6.QtWidgets import QApplication

from app.conversations import ConversationStore, Message
from app.engine.host import EngineState
from app.mcp import config, trust
from app.models.default import default_model_path
from app.settings import Settings
from app.ui.approval import ApprovalDialog
from app.ui.chat_tools import SERVERS_KEY, WAITING
from app.ui.main_window import MainWindow
from app.ui.message_widget import MessageWidget
from app.ui.tool_rows import ToolResultWidget
from tests.gui.harness import Harness
from tests.unit.test_mcp_pool import tiny

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 5
SAMPLING = {"temperature": 0.0, "max_tokens": 48}


def _forced(rounds: int):
    return lambda number: "pid" if number < rounds else "none"


def _window(harness: Harness, model: str, *, trusted: bool, rounds: int) -> MainWindow:
    if config.load().server("tiny") is None:
        config.add_server(tiny())
    if trusted:
        trust.set_trusted("tiny", True)
    window = harness.start(model)
    window.store.set_sampling(window.conversation_id, SAMPLING)
    window.tools.choice = _forced(rounds)
    return window


def _path(window: MainWindow) -> list[Message]:
    return window.store.current_path(window.conversation_id)


def _prompt() -> ApprovalDialog | None:
    shown = [
        w for w in QApplication.topLevelWidgets() if isinstance(w, ApprovalDialog) and w.isVisible()
    ]
    return shown[0] if shown else None


def _row_state(window: MainWindow, call_id: str) -> str:
    for widget in window.chat.findChildren(MessageWidget):
        for call, row in zip(widget.message.tool_calls, widget.call_rows, strict=True):
            if call.id == call_id:
                return row.state
    return ""


def test_a_call_waits_for_approval_and_runs_once_allowed_or_is_denied(
    harness: Harness, tiny_model: str
):
    window = _window(harness, tiny_model, trusted=False, rounds=2)
    heard: list[tuple[str, str]] = []
    window.tools.call_changed.connect(lambda call_id, words: heard.append((call_id, words)))

    harness.type_and_send("What is the server's process id?")
    harness.wait_until(lambda: _prompt() is not None)
    prompt = _prompt()
    assert prompt.request.server == "tiny" and prompt.request.tool == "pid"
    (call_id, _), *_ = heard
    assert _row_state(window, call_id) == WAITING
    harness.act(prompt.allow_once.click)
    harness.turn()

    states = [words for heard_id, words in heard if heard_id == call_id]
    assert states[0] == WAITING and states[-1] == "done"
    assert "running" in states[1:-1]
    assert _row_state(window, call_id) == "done"
    *_, result, answer = _path(window)
    assert result.role == "tool" and result.finish_reason == "done"
    assert result.content == str(int(result.content))  # the server's pid
    assert answer.status == "complete" and not answer.tool_calls
    assert "round 2: prefilled" in window.status.text()
    assert config.load().server("tiny").always_allow == ()  # once is not always

    heard.clear()
    harness.type_and_send("And now?")
    harness.wait_until(lambda: _prompt() is not None)
    prompt = _prompt()
    harness.act(lambda: prompt.reason.setText("not today"))
    harness.act(prompt.deny.click)
    harness.turn()
    (call_id, _), *_ = heard
    assert [words for heard_id, words in heard if heard_id == call_id][-1] == "denied"
    assert _row_state(window, call_id) == "denied"
    *_, denied, answer = _path(window)
    assert denied.finish_reason == "denied" and "not today" in denied.content
    (shown,) = [w for w in window.chat.findChildren(ToolResultWidget) if w.message.id == denied.id]
    assert shown.row.state.startswith("denied, ") and shown.row.state.endswith(" s")
    assert answer.status == "complete"

    heard.clear()
    harness.type_and_send("Once more?")
    harness.wait_until(lambda: _prompt() is not None)
    harness.act(window.stop)  # Esc: the call waiting for approval, and the turn, end
    harness.turn()
    (call_id, _), *_ = heard
    assert _prompt() is None and _row_state(window, call_id) == "cancelled"
    cancelled = _path(window)[-1]
    assert cancelled.finish_reason == "cancelled"
    assert "a call was cancelled" in window.banner.text.text()
    (result,) = [
        w for w in window.chat.findChildren(ToolResultWidget) if w.message.id == cancelled.id
    ]
    assert result.continue_button.isVisible()  # the turn can go on from here

    window.store.set_sampling(window.conversation_id, {**SAMPLING, SERVERS_KEY: []})
    harness.type_and_send("Just talk.")  # tools off in this conversation: a plain turn
    harness.turn()
    assert _prompt() is None
    *_, user, plain = _path(window)
    assert user.content == "Just talk." and plain.status == "complete" and not plain.tool_calls


def test_every_round_after_the_first_prefills_only_the_result_and_the_glue(
    harness: Harness,
):
    """On the default model (SmolLM2 itself): the loop's KV promise where people run it."""
    window = _window(harness, str(default_model_path()), trusted=True, rounds=ROUNDS)
    harness.type_and_send("Find the server's process id, five times.")
    harness.turn()

    assert _prompt() is None  # a trusted server's calls run without asking
    _user, *rest = _path(window)
    replies, results = rest[0::2], rest[1::2]
    assert len(replies) == ROUNDS and len(results) == ROUNDS - 1
    assert all(r.finish_reason == "done" for r in results)
    tokenizer = window.session.engine.local_tokenizer()
    glue = len(tokenizer.tokenize("<|im_end|>\n<|im_start|>tool\n", special=True)) + len(
        tokenizer.tokenize("<|im_end|>\n<|im_start|>assistant\n", special=True)
    )
    rounds = window.tools.rounds
    assert [r.reply_id for r in rounds] == [r.id for r in replies]
    for before, after, result in zip(replies[:-1], replies[1:], results, strict=True):
        held, stats = before.stats, after.stats
        assert stats["reused_tokens"] == held["prompt_tokens"] + held["generated_tokens"]
        assert stats["prefilled_tokens"] == len(tokenizer.tokenize(result.content)) + glue
    last = rounds[-1].stats
    assert f"round {ROUNDS}: prefilled {last.prefilled_tokens:,}" in window.status.text()


def test_a_loop_whose_engine_is_killed_mid_way_continues_with_its_calls_kept(
    harness: Harness, tiny_model: str
):
    window = _window(harness, tiny_model, trusted=True, rounds=ROUNDS)
    engine = window.session.engine
    replies_seen: list[str] = []

    def streamed(message_id: str, piece: str, shown=window.chat.append_reply) -> None:
        if message_id not in replies_seen:
            replies_seen.append(message_id)
            if len(replies_seen) == 3:  # the third reply's first token: kill its engine
                os.kill(engine.pid, signal.SIGKILL)
        shown(message_id, piece)

    window.chat.append_reply = streamed
    harness.type_and_send("Find the server's process id, five times.")
    harness.turn()
    harness.wait_until(lambda: engine.state == EngineState.READY)
    user, first, first_result, second, second_result, cut = _path(window)
    assert cut.status == "interrupted" and cut.id == replies_seen[2]
    assert "you can continue it" in window.banner.text.text()

    (widget,) = [w for w in window.chat.findChildren(MessageWidget) if w.message.id == cut.id]
    assert widget.continue_button.isVisible()
    harness.act(widget.continue_button.click)
    harness.turn()

    path = _path(window)
    assert path[:5] == [user, first, first_result, second, second_result]  # kept as they were
    replies = [m for m in path if m.role == "assistant"]
    assert len(replies) == ROUNDS and cut.id not in [m.id for m in path]
    assert [m.finish_reason for m in path if m.role == "tool"] == ["done"] * (ROUNDS - 1)
    assert path[-1].status == "complete" and not path[-1].tool_calls


def test_a_turn_whose_app_was_killed_mid_way_continues_in_the_window(
    harness: Harness, stoke_home: Path, tmp_path: Path, tiny_model: str
):
    config.add_server(tiny())
    with ConversationStore.open() as store:
        conversation = store.create_conversation(sampling=SAMPLING).id
    marker, log = tmp_path / "second-call", tmp_path / "child.log"
    turn = ["tests.gui.killed_tools_turn", tiny_model, conversation, str(marker), str(ROUNDS)]
    with log.open("w") as errors:
        child = subprocess.Popen(
            [sys.executable, "-m", *turn],
            cwd=REPO,
            env={**os.environ, "STOKE_HOME": str(stoke_home)},
            stdout=subprocess.DEVNULL,
            stderr=errors,
            start_new_session=True,
        )
    deadline = time.monotonic() + 240  # generous: a loaded machine starts an engine slowly
    while not marker.exists():
        assert time.monotonic() < deadline, "the turn never reached its second call"
        assert child.poll() is None, f"the turn ended before it was killed: {log.read_text()}"
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)  # the turn, its engine and its MCP server
    child.wait()

    window = _window(harness, tiny_model, trusted=True, rounds=ROUNDS)
    harness.act(lambda: window.open_conversation(conversation))
    kept = _path(window)
    assert [m.role for m in kept] == ["user", "assistant", "tool", "assistant"]
    assert kept[2].finish_reason == "done" and kept[3].tool_calls  # the call it was asking about
    assert kept[3].tool_calls[0].id == marker.read_text()
    (widget,) = [w for w in window.chat.findChildren(MessageWidget) if w.message.id == kept[3].id]
    assert widget.continue_button.isVisible()
    harness.act(widget.continue_button.click)
    harness.turn()

    path = _path(window)
    assert path[:4] == kept  # kept as they were
    assert len([m for m in path if m.role == "assistant"]) == ROUNDS
    assert [m.finish_reason for m in path if m.role == "tool"] == ["done"] * (ROUNDS - 1)
    assert path[-1].status == "complete" and not path[-1].tool_calls


def test_the_rounds_setting_stops_a_turn_that_continue_goes_on_with(
    harness: Harness, tiny_model: str
):
    settings = Settings.load()
    settings.tool_rounds = 2  # Settings > Tools' rounds per turn
    settings.save()
    window = _window(harness, tiny_model, trusted=True, rounds=4)
    harness.type_and_send("Find the server's process id, three times.")
    harness.turn()

    stopped = _path(window)
    assert [m.role for m in stopped] == ["user", "assistant", "tool", "assistant", "tool"]
    assert "Stopped after 2 rounds" in window.banner.text.text()
    (result,) = [
        w for w in window.chat.findChildren(ToolResultWidget) if w.message.id == stopped[-1].id
    ]
    assert result.continue_button.isVisible()
    harness.act(result.continue_button.click)
    harness.turn()

    path = _path(window)
    assert path[:5] == stopped
    assert [m.role for m in path[5:]] == ["assistant", "tool", "assistant"]
    assert path[-1].status == "complete" and not path[-1].tool_calls
    # Regenerate on the answer goes through the loop too: a new answer beside it, from the
    # same prompt (tools in it), so the engine reuses all of that prompt it holds.
    answer = path[-1]
    harness.act(window.regenerate_last)
    harness.turn()
    again = _path(window)
    assert again[:-1] == path[:-1] and again[-1].id != answer.id
    assert answer.id in [m.id for m in window.store.siblings(again[-1].id)[0]]
    assert again[-1].stats["reused_tokens"] >= answer.stats["prompt_tokens"] - 1
