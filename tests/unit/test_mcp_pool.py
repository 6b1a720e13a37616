"""The pool with real MCP servers: the tests' own (tests/mcp_server.py, the official SDK) over
stdio and over Streamable HTTP on 127.0.0.1, and the published `mcp-server-time`. Each waits
on events or polls with a generous deadline, never a fixed sleep."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.mcp.client import ServerState
from app.mcp.config import Http, Server, Stdio
from app.mcp.pool import Pool

SERVER = Path(__file__).resolve().parents[1] / "mcp_server.py"
WAIT_S = 60.0  # generous: a busy machine starts Python slowly, a bug still fails the test
SECRET = "s3cret-t0ken"


def tiny(name: str = "tiny", *extra: str, env: dict[str, str] | None = None) -> Server:
    return Server(name, Stdio(sys.executable, (str(SERVER), *extra), env or {}))


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, 3 * WAIT_S)

    return asyncio.run(bounded())


async def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_stdio_server_starts_when_needed_lists_tools_and_runs_calls() -> None:
    heard: list[tuple[str, str]] = []

    async def scenario() -> int:
        server = tiny(env={"STOKE_TEST_TOKEN": SECRET})
        async with Pool([server], on_state=lambda n, s: heard.append((n, str(s)))) as pool:
            assert pool.states() == {"tiny": ServerState("stopped")}
            tools = {tool.name: tool for tool in await pool.tools()}
            assert set(tools) == {"echo", "env", "pid", "parts", "long", "wait"}
            assert tools["echo"].server == "tiny" and tools["echo"].description == "The text, back."
            assert tools["echo"].input_schema["properties"]["text"]["type"] == "string"
            assert pool.states() == {"tiny": ServerState("ready", 6)}

            echo = await pool.call("tiny", "echo", {"text": "hello"})
            assert (echo.full, echo.for_model, echo.is_error) == ("hello", "hello", False)
            assert (await pool.call("tiny", "env", {"name": "STOKE_TEST_TOKEN"})).full == SECRET

            parts = (await pool.call("tiny", "parts", {})).full.splitlines()
            assert parts[0] == "a red square"
            assert re.fullmatch(r"\[image: image/png, \d+ bytes\]", parts[1])
            assert parts[2:] == [
                "[audio: audio/wav, 3.0 kB]",
                "[link: notes <file:///notes.md>, text/markdown, 1.5 kB]",
                "[resource: file:///a.txt]",
                "inside a",
                "[resource: file:///b.bin, application/zip, 3.0 kB]",
            ]

            long = await pool.call("tiny", "long", {"n": 500}, limit=100)
            assert len(long.full) == 500 and long.cut == 400
            assert long.for_model.startswith(long.full[:100] + "\n[400 more characters")
            assert "(500 in all); the person sees all of it]" in long.for_model
            return int((await pool.call("tiny", "pid", {})).full)

    pid = run(scenario())

    assert heard == [("tiny", "starting"), ("tiny", "ready (6 tools)"), ("tiny", "stopped")]
    assert gone(pid)  # close() waited for the process to end


def test_a_call_that_times_out_is_stopped_on_the_server(tmp_path: Path) -> None:
    marker = tmp_path / "wait"

    async def scenario() -> None:
        async with Pool([tiny()]) as pool:
            late = await pool.call("tiny", "wait", {"marker": str(marker)}, timeout=1)
            assert (
                late.is_error
                and late.full == "wait did not answer within 1 s, so the call was stopped."
            )
            await until(Path(f"{marker}.ended").exists, "the server cancelled the call")
            assert (await pool.call("tiny", "pid", {})).full == marker.read_text()

    run(scenario())


def test_a_cancelled_call_ends_on_the_server_and_the_server_stays(tmp_path: Path) -> None:
    marker = tmp_path / "wait"

    async def scenario() -> None:
        async with Pool([tiny()]) as pool:
            call = asyncio.create_task(pool.call("tiny", "wait", {"marker": str(marker)}))
            await until(marker.exists, "the call started")
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await until(Path(f"{marker}.ended").exists, "the server cancelled the call")
            assert (await pool.call("tiny", "pid", {})).full == marker.read_text()
            assert pool.states()["tiny"].phase == "ready"

    run(scenario())


def test_a_server_killed_mid_call_or_idle_is_said_in_words_and_runs_again_when_needed(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "wait"

    async def scenario() -> None:
        async with Pool([tiny()]) as pool:
            call = asyncio.create_task(pool.call("tiny", "wait", {"marker": str(marker)}))
            await until(marker.exists, "the call started")
            first = int(marker.read_text())
            os.kill(first, signal.SIGKILL)

            lost = await call
            assert lost.is_error and lost.full.startswith("The server tiny stopped during the call")
            assert pool.states()["tiny"] == ServerState("failed", reason=lost.full)

            again = await pool.call("tiny", "pid", {})
            assert not again.is_error and int(again.full) != first
            assert pool.states()["tiny"].phase == "ready"

            os.kill(int(again.full), signal.SIGKILL)  # while idle: noticed by its stderr's end
            await until(lambda: pool.states()["tiny"].phase == "failed", "the death noticed")
            assert pool.states()["tiny"].reason == "The server stopped."
            assert int((await pool.call("tiny", "pid", {})).full) != int(again.full)

    run(scenario())


def test_servers_that_cannot_start_say_why_in_words(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    missing = Server("missing", Stdio("stoke-no-such-command", ("--stdio",), {"TOKEN": SECRET}))
    failing = tiny("failing", "--fail", "ModuleNotFoundError: No module named 'left_out'")

    async def scenario() -> None:
        async with Pool([missing, failing]) as pool:
            assert await pool.tools() == []
            states = pool.states()
            assert states["missing"].reason == (
                "The command “stoke-no-such-command” was not found. Install it, or give its "
                "full path in mcp.json (Stoke looks for it in the folders of PATH)."
            )
            assert states["failing"].reason == (
                "The server stopped while starting; its last words: "
                "“ModuleNotFoundError: No module named 'left_out'”."
            )
            call = await pool.call("failing", "echo", {"text": "x"})
            assert call.is_error and "No module named 'left_out'" in call.full
            unknown = await pool.call("nobody", "echo", {})
            assert unknown.full == "There is no MCP server named “nobody”."
            assert SECRET not in repr(pool.states()) + repr(missing)

    run(scenario())
    assert caplog.records  # the SDK logged the failed starts
    assert SECRET not in caplog.text


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def web_server() -> Iterator[str]:
    """The tests' server over Streamable HTTP on 127.0.0.1, answering only SECRET's bearer."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port), "--token", SECRET],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert process.poll() is None, "the HTTP test server ended"
            assert time.monotonic() < deadline, "the HTTP test server never listened"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_streamable_http_server_with_a_token_in_its_headers(
    web_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    web = Server("web", Http(web_server, {"Authorization": f"Bearer {SECRET}"}))
    locked = Server("locked", Http(web_server, {"Authorization": "Bearer wrong"}))
    nobody = Server("nobody", Http(f"http://127.0.0.1:{_free_port()}/mcp"))

    async def scenario() -> None:
        async with Pool([web, locked, nobody]) as pool:
            assert {t.name for t in await pool.tools(["web"])} >= {"echo", "wait"}
            assert (await pool.call("web", "echo", {"text": "over http"})).full == "over http"
            await pool.tools()
            states = pool.states()
            assert states["web"] == ServerState("ready", 6)
            assert states["locked"].reason == (
                f"{web_server} refused Stoke (401 Unauthorized): check the token in its headers."
            )
            assert states["nobody"].reason == (
                f"Nothing answers at {nobody.launch.url}: is the server running there?"  # type: ignore[union-attr]
            )
            assert SECRET not in repr(pool.states()) + repr(web)

    run(scenario())
    assert caplog.records  # the SDK and its HTTP client logged every request
    assert SECRET not in caplog.text


def test_the_published_time_server() -> None:
    command = Path(sys.executable).with_name("mcp-server-time")
    if not command.exists():
        pytest.skip("mcp-server-time is not installed: pip install -e '.[dev]' brings it")

    async def scenario() -> None:
        async with Pool([Server("time", Stdio(str(command), ("--local-timezone", "UTC")))]) as pool:
            assert "get_current_time" in {t.name for t in await pool.tools()}
            now = await pool.call("time", "get_current_time", {"timezone": "UTC"})
            assert not now.is_error and '"timezone": "UTC"' in now.full

    run(scenario())
