"""`stoke chat` with MCP tools: the real stdio test server (tests/mcp_server.py) in mcp.json,
the real engine on the tests' tiny chat model (what is proven is the approval and the calls,
not the model's words), the real store. The model would not call a tool by itself, so the
first round is forced to `pid` with `--tool-choice` (the grammar the API server forces
`tool_choice` with); `--max-rounds 1` ends the turn after that call's result is stored.
Answers are fed on standard input (a pipe) or typed on a terminal (a pty).
"""

from __future__ import annotations

import json
from pathlib import Path

from app.cli.chat_tools import NO_TERMINAL
from app.conversations import ConversationStore, Message
from app.mcp import config
from tests.e2e.conftest import StokeHere
from tests.e2e.stoke_proc import stoke
from tests.e2e.test_cli_interactive import Terminal
from tests.unit.test_mcp_pool import SECRET, tiny

FORCED = ("--tool-choice", "pid", "--max-rounds", "1", "--temperature", "0")
ASKED = "Allow? [y]es / [a]lways / [n]o:"


def _one_turn(home: Path, model: str, answers: str, *extra: str) -> tuple[int, str, str]:
    asked = ("chat", "--model", model, "-m", "What is your process id?", *FORCED, *extra)
    done = stoke(home, *asked, stdin=answers)
    return done.returncode, done.stdout, done.stderr


def _results() -> list[Message]:
    """Every tool result of the store, oldest first."""
    with ConversationStore.open() as store:
        found = []
        for conversation in reversed(store.list_conversations()):
            found += [m for m in store.current_path(conversation.id) if m.role == "tool"]
        return found


def test_a_call_runs_when_allowed_and_the_model_reads_why_when_denied(
    stoke_home: Path, tiny_model: str
) -> None:
    config.add_server(tiny(env={"STOKE_TEST_TOKEN": SECRET}))

    allowed = _one_turn(stoke_home, tiny_model, "y\n")
    denied = _one_turn(stoke_home, tiny_model, "n\nnot on a Sunday\n")

    for _, _, errors in (allowed, denied):
        assert "tiny › pid {}" in errors and ASKED in errors
        assert SECRET not in errors and "Traceback" not in errors
    (ran, said_no) = _results()
    assert ran.tool_name == "pid" and ran.finish_reason == "done" and ran.content.isdigit()
    assert "[tool] done in" in allowed[2] and ran.content in allowed[2]
    assert said_no.finish_reason == "denied"
    assert said_no.content == "The person did not allow this call: not on a Sunday"
    assert "[tool] denied" in denied[2] and "not on a Sunday" in denied[2]


def test_json_without_a_terminal_denies_until_always_allowed_on_a_terminal(
    stoke_home: Path, tiny_model: str
) -> None:
    config.add_server(tiny())

    # the pipe's y is not asked for
    code, out, errors = _one_turn(stoke_home, tiny_model, "y\n", "--json")
    answer = json.loads(out)
    (call,) = answer["tool_calls"]
    assert (call["server"], call["tool"], call["state"]) == ("tiny", "pid", "denied")
    assert call["result"].endswith(NO_TERMINAL) and ASKED not in errors
    assert answer["stopped"] and code == 1  # the rounds limit: the model never answered

    term = Terminal("chat", "--model", tiny_model, "--new", *FORCED, "--max-tokens", "60")
    try:
        term.wait_for("/help for commands.")
        term.type("What is your process id?")
        term.wait_for(ASKED)
        term.type("a")
        term.wait_for("[tool] done")
        term.type("/quit")
        assert term.close() == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()
    assert config.load().server("tiny").always_allow == ("pid",)

    code, out, errors = _one_turn(stoke_home, tiny_model, "", "--json")
    (call,) = json.loads(out)["tool_calls"]
    assert call["state"] == "done" and call["result"].isdigit() and ASKED not in errors
    assert [m.finish_reason for m in _results()] == ["denied", "done", "done"]


def test_a_server_mcp_json_does_not_have_is_refused_in_words(
    stoke_here: StokeHere,
) -> None:
    config.add_server(tiny())

    code, _, errors = stoke_here("chat", "-m", "hi", "--tools", "nope")

    assert code == 1 and "no usable MCP server named “nope”" in errors and "tiny" in errors
    assert "Traceback" not in errors
