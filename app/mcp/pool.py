"""Stoke's MCP servers at work: one connection per server, started when first needed, stopped
when the pool closes.

Promises:

- Nothing starts until it is needed: `tools` starts the servers it is asked about (at once,
  side by side), `call` starts its server. A server turned off in mcp.json never starts.
- A server that fails to start, or stops, is tried again at its next use; its state says why
  in the meantime (`states`, and `on_state` hears every change: name and state).
- `call` always gives a ToolResult (results.py), never raises for what a server does: an
  unknown or turned-off server, a failed start, a timeout, a server that stops mid-call are
  error results in words. Only the caller's own cancellation ends it without one; the server
  is told to stop the call.
- `close` (or leaving `async with`) stops every server: no process outlives the pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from app.mcp import results
from app.mcp.client import CallFailed, Connection, ServerState, ToolInfo
from app.mcp.config import Server

CALL_TIMEOUT_S = 120.0  # how long a call may run unless the caller says otherwise


class Pool:
    """The connections to `servers` (mcp.json's usable entries, config.load().servers)."""

    def __init__(
        self,
        servers: Iterable[Server],
        on_state: Callable[[str, ServerState], None] | None = None,
    ) -> None:
        self._servers = {server.name: server for server in servers}
        self._heard = on_state or (lambda name, state: None)
        self._connections: dict[str, Connection] = {}

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def states(self) -> dict[str, ServerState]:
        """Every enabled server's state ("stopped" until first needed)."""
        return {
            name: c.state for name in self._servers if (c := self._connection(name)) is not None
        }

    async def tools(self, names: Iterable[str] | None = None) -> list[ToolInfo]:
        """The tools of the named servers (all enabled ones when None), started as needed;
        a server that fails offers none, and its state says why."""
        wanted = [self._connection(n) for n in (self._servers if names is None else names)]
        connections = [c for c in wanted if c is not None]
        await asyncio.gather(*(c.start() for c in connections))
        return [tool for c in connections if c.state.phase == "ready" for tool in c.tools]

    async def call(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        timeout: float = CALL_TIMEOUT_S,
        limit: int = results.LIMIT,
    ) -> results.ToolResult:
        """`tool` of `server` run with `arguments`, its answer shaped with `limit` (results.py)."""
        connection = self._connection(server)
        if connection is None:
            known = self._servers.get(server)
            return results.failed(
                f"The MCP server “{server}” is turned off."
                if known is not None
                else f"There is no MCP server named “{server}”."
            )
        state = await connection.start()
        if state.phase != "ready":
            why = state.reason or "Stoke stopped it."
            return results.failed(f"The MCP server “{server}” could not start: {why}")
        try:
            answer = await connection.call(tool, arguments, timeout)
        except CallFailed as exc:
            return results.failed(str(exc))
        return results.shaped(answer, limit)

    async def close(self) -> None:
        """Every server stopped, its process ended."""
        await asyncio.gather(*(c.stop() for c in self._connections.values()))

    def _connection(self, name: str) -> Connection | None:
        """The connection to `name` (made, not started, on first use); None when there is no
        such enabled server."""
        server = self._servers.get(name)
        if server is None or not server.enabled:
            return None
        if name not in self._connections:
            self._connections[name] = Connection(server, lambda s: self._heard(name, s))
        return self._connections[name]
