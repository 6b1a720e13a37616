"""One MCP server's live connection: started on demand, its state, its tools, its calls.

A stdio server is its command run with the user's rights, the args passed as a list (never
through a shell), its env over the SDK's minimal environment, its stderr kept (stderr.py). A
Streamable HTTP server is reached at its url with its headers on every request.

The SDK's connection is a nest of task groups that must be entered and left by one task, so
each connection lives in a task of its own (`_run`), started by the first `start` and ended by
`stop` (or by the server's end). Calls are made from the callers' tasks on that connection. The
state says where it stands: "stopped" (not started, or stopped), "starting", "ready" (with its
tools), "failed" (with the reason in words, words.py). Promises:

- `start` never raises for a server that fails: the state says why; a caller cancelled while
  it waits leaves the start going on for the others.
- `call` returns the SDK's result or raises CallFailed in words: the call timed out (the server
  is told to stop it), or the server stopped during it (the state says so, and the next
  `start` runs it again). A caller cancelled mid-call ends the call: the server is told, and
  the connection stays ready for the next.
- `stop` ends the connection and, for stdio, the server's whole process group (the SDK closes
  its stdin, then terminates, then kills it): no process outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import httpx2

from app.mcp import words
from app.mcp.config import Http, Server, Stdio
from app.mcp.stderr import StderrTail

if TYPE_CHECKING:  # the SDK is imported where a server starts: a second of every `stoke` start
    from mcp import Client
    from mcp_types import CallToolResult

START_TIMEOUT_S = 60.0  # a first `npx` or `uvx` start downloads its package
LIST_PAGES = 100  # pages of tools read at most: a server that pages forever cannot hang a start
HTTP_TIMEOUT_S = 30.0  # connecting, sending (the SDK's own defaults)
HTTP_READ_TIMEOUT_S = 300.0  # a server may hold a response stream open this long between events
LAST_WORDS_WAIT_S = 2.0  # how long a failure waits for the rest of a dying server's stderr

Phase = Literal["stopped", "starting", "ready", "failed"]


@dataclass(frozen=True)
class ServerState:
    """Where a server stands: its phase, its number of tools when ready, why when failed."""

    phase: Phase
    tools: int = 0
    reason: str | None = None

    def __str__(self) -> str:
        if self.phase == "ready":
            return f"ready ({self.tools} tool{'' if self.tools == 1 else 's'})"
        return f"failed: {self.reason}" if self.phase == "failed" else self.phase


@dataclass(frozen=True)
class ToolInfo:
    """One tool a server offers, as it describes it."""

    server: str
    name: str
    description: str
    input_schema: Mapping[str, Any]


class CallFailed(Exception):
    """A call gave no result; the message says why, in words."""


class _Status:
    """The last HTTP error status the server answered (the SDK keeps only its own words)."""

    def __init__(self) -> None:
        self.last: int | None = None

    async def seen(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self.last = response.status_code


class Connection:
    """The live connection to one server; `on_state` hears each change of its state."""

    def __init__(self, server: Server, on_state: Callable[[ServerState], None]) -> None:
        self.server = server
        self._on_state = on_state
        self.state = ServerState("stopped")
        self.tools: tuple[ToolInfo, ...] = ()
        self._client: Client | None = None
        self._runner: asyncio.Task[None] | None = None
        self._started: asyncio.Future[None] | None = None
        self._scope: anyio.CancelScope | None = None
        self._tail: StderrTail | None = None

    async def start(self) -> ServerState:
        """The server connected, unless it is already; its state once that is settled."""
        runner, started = self._runner, self._started
        if runner is not None and started is not None and not runner.done():
            if not started.done():  # starting: wait with the others
                await asyncio.shield(started)
                return self.state
            if self._client is not None:
                return self.state
            await asyncio.shield(runner)  # lost or stopping: let it end, then run it again
        self._started = started = asyncio.get_running_loop().create_future()
        self._scope = anyio.CancelScope()  # made here, so that `stop` can end a runner not yet run
        self._runner = asyncio.create_task(self._run(started, self._scope))
        await asyncio.shield(started)
        return self.state

    async def call(self, tool: str, arguments: Mapping[str, Any], timeout: float) -> CallToolResult:
        """`tool` run with `arguments`; CallFailed in words when it gives no result."""
        client, tail = self._client, self._tail
        if client is None:
            raise CallFailed(f"{self.server.name} is not running ({self.state}).")
        try:
            return await client.call_tool(tool, dict(arguments), read_timeout_seconds=timeout)
        except Exception as exc:
            lost = self._client is not client or words.connection_lost(exc)
            last = await _last_words(tail) if lost else None
            said = words.call_failure(self.server, tool, exc, last_line=last, timeout=timeout)
            if lost:
                self._end(said)
            raise CallFailed(said) from None

    async def stop(self) -> None:
        """The connection ended and the server with it; the state "stopped"."""
        runner = self._runner
        if runner is None:
            return
        if self._scope is not None:
            self._scope.cancel()
        await asyncio.shield(runner)
        self._set(ServerState("stopped"))

    def _end(self, reason: str) -> None:
        """The connection is lost: its task winds it down, the state says why."""
        self._client = None
        if self._scope is not None:
            self._scope.cancel()
        self._set(ServerState("failed", reason=reason))

    def _set(self, state: ServerState) -> None:
        if state != self.state:
            self.state = state
            self._on_state(state)

    async def _run(self, started: asyncio.Future[None], scope: anyio.CancelScope) -> None:
        """The connection's whole life, in this one task, until `scope` is cancelled."""
        from mcp import Client

        self._set(ServerState("starting"))
        self.tools = ()
        status = _Status()
        tail = self._tail = StderrTail() if isinstance(self.server.launch, Stdio) else None
        ended: str | None = None
        try:
            with scope:
                if tail is not None:
                    await tail.start()
                async with Client(
                    self._transport(tail, status), read_timeout_seconds=START_TIMEOUT_S
                ) as client:
                    self.tools = await _listed(client, self.server.name)
                    self._client = client
                    self._set(ServerState("ready", len(self.tools)))
                    started.set_result(None)
                    if tail is None:
                        await anyio.sleep_forever()
                    else:
                        await tail.ended.wait()
                        ended = words.stopped(tail.last_line)
        except Exception as exc:
            last = await _last_words(tail)
            if not started.done():
                ended = words.start_failure(
                    self.server, exc, last_line=last, status=status.last, timeout=START_TIMEOUT_S
                )
            elif self.state.phase != "failed":
                ended = ended or words.stopped(last)
        finally:
            self._client = None
            if tail is not None:
                tail.close()
            if self.state.phase != "failed":  # a failed call said why first: that stays
                self._set(ServerState("failed", reason=ended) if ended else ServerState("stopped"))
            if not started.done():
                started.set_result(None)

    def _transport(self, tail: StderrTail | None, status: _Status) -> Any:
        """The SDK's transport for this server: its process's pipes, or HTTP with headers."""
        launch = self.server.launch
        if isinstance(launch, Http):
            return _http(launch, status)
        assert tail is not None
        return _stdio(launch, tail)


@contextlib.asynccontextmanager
async def _http(launch: Http, status: _Status) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(
            headers=dict(launch.headers),
            timeout=httpx2.Timeout(HTTP_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S),
            event_hooks={"response": [status.seen]},
        ) as http,
        streamable_http_client(launch.url, http_client=http) as streams,
    ):
        yield streams


@contextlib.asynccontextmanager
async def _stdio(launch: Stdio, tail: StderrTail) -> AsyncIterator[Any]:
    from mcp import StdioServerParameters, stdio_client

    folder = Path(launch.cwd).expanduser() if launch.cwd else None
    if folder is not None and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"its folder {launch.cwd} does not exist")
    parameters = StdioServerParameters(
        command=launch.command, args=list(launch.args), env=dict(launch.env), cwd=folder
    )
    try:
        async with stdio_client(parameters, errlog=tail.writer) as streams:
            tail.spawned()
            yield streams
    finally:
        tail.spawned()


async def _last_words(tail: StderrTail | None) -> str | None:
    """The last line a stdio server wrote, once its stderr has ended (or a moment passed)."""
    if tail is None:
        return None
    with anyio.move_on_after(LAST_WORDS_WAIT_S):
        await tail.ended.wait()
    return tail.last_line


async def _listed(client: Client, server: str) -> tuple[ToolInfo, ...]:
    """Every tool the server lists, page after page."""
    tools: list[ToolInfo] = []
    cursor: str | None = None
    for _ in range(LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += [ToolInfo(server, t.name, t.description or "", t.input_schema) for t in page.tools]
        cursor = page.next_cursor
        if not cursor:
            break
    return tuple(tools)
