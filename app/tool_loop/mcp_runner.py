"""MCP servers' tools as a chat's ToolRunner: offered by name, each call approved, then run.

Promises:

- The model is offered the tools of the servers this conversation has on (`servers`; None:
  every server turned on in mcp.json), started when first asked for. A tool's name is its
  own; where two servers offer one name, each becomes `server__tool`, so a call always
  reaches exactly one server.
- No call runs without approval unless the person said so: a server marked trusted, or a
  tool set to always allowed (kept in mcp.json, app/mcp/trust.py). Otherwise `ask` hears the
  server, the tool and the arguments and answers allow once, always allow, or deny (with a
  reason the model reads).
- Arguments go to the server as the JSON object the model wrote; anything else is a failed
  call in words, never a command line built from the model's text.
- A call ends as done, failed (the server's words, a timeout, a server that stopped), denied
  or cancelled; the model reads at most `limit` characters of a result (said when cut) and
  the row keeps the whole of it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from app.mcp import config, results, trust
from app.mcp.pool import CALL_TIMEOUT_S, Pool
from app.tool_loop.loop import ToolOutcome
from app.toolcalls.tools import ToolCall, ToolSpec

logger = logging.getLogger("stoke.tools")


@dataclass(frozen=True)
class CallRequest:
    """A call waiting for the person's approval."""

    server: str
    tool: str
    arguments: dict[str, Any]
    call: ToolCall


@dataclass(frozen=True)
class Decision:
    """The person's answer: allow (once, or `always` for this server's tool) or deny, with a
    reason the model reads."""

    allow: bool
    always: bool = False
    reason: str = ""


Ask = Callable[[CallRequest], Awaitable[Decision]]


class McpRunner:
    """A ToolRunner over `pool` (see the module's docstring)."""

    def __init__(
        self,
        pool: Pool,
        ask: Ask,
        *,
        servers: Collection[str] | None = None,
        timeout: float = CALL_TIMEOUT_S,
        limit: int = results.LIMIT,
    ) -> None:
        self.pool, self.ask = pool, ask
        self.servers = None if servers is None else tuple(servers)
        self.timeout, self.limit = timeout, limit
        self._routes: dict[str, tuple[str, str]] = {}  # offered name -> (server, tool)

    async def specs(self) -> Sequence[ToolSpec]:
        tools = await self.pool.tools(self.servers)
        counts: dict[str, int] = {}
        for tool in tools:
            counts[tool.name] = counts.get(tool.name, 0) + 1
        self._routes, specs = {}, []
        for tool in tools:
            name = tool.name if counts[tool.name] == 1 else f"{tool.server}__{tool.name}"
            self._routes[name] = (tool.server, tool.name)
            schema = dict(tool.input_schema) or {"type": "object", "properties": {}}
            specs.append(ToolSpec(name, tool.description, schema))
        return specs

    def route(self, name: str) -> tuple[str, str] | None:
        """The server and tool an offered name reaches (None: not offered this turn)."""
        return self._routes.get(name)

    async def run(self, call: ToolCall) -> ToolOutcome:
        route = self._routes.get(call.name)
        if route is None:
            return ToolOutcome("failed", f"There is no tool named “{call.name}” in this chat.")
        server_name, tool = route
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            return ToolOutcome("failed", f"The arguments for “{call.name}” were not a JSON object.")
        server = config.load().server(server_name)
        if server is None:
            return ToolOutcome("failed", f"The MCP server “{server_name}” was removed.")
        if trust.needs_approval(server, tool):
            decision = await self.ask(CallRequest(server_name, tool, arguments, call))
            if not decision.allow:
                why = decision.reason.strip()
                return ToolOutcome(
                    "denied", f"The person did not allow this call{': ' + why if why else '.'}"
                )
            if decision.always:
                self._remember(server_name, tool)
        result = await self.pool.call(
            server_name, tool, arguments, timeout=self.timeout, limit=self.limit
        )
        return ToolOutcome(
            "failed" if result.is_error else "done",
            result.for_model,
            result.full if result.cut else None,
        )

    def _remember(self, server: str, tool: str) -> None:
        try:
            trust.set_always_allowed(server, tool, True)
        except config.ConfigError as exc:  # the call still runs: it was allowed
            logger.warning(
                "Could not remember that %s's %s is always allowed: %s", server, tool, exc
            )
