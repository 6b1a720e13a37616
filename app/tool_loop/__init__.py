"""The chat's turns with tools: the loop (loop.py) and what runs MCP servers' tools in it
(mcp_runner.py: each call approved, then run through app/mcp's pool).

This room sits beside the API server; the window and the terminal chat use it. May import:
the session it drives, the tool-call mechanism (app/toolcalls), the MCP room (app/mcp), the
conversation store and the engine's protocol; never the server beside it or the window.
"""

from app.tool_loop.loop import (
    CANCELLED_CALL,
    DEFAULT_MAX_ROUNDS,
    FAILED_CALL,
    CallProgress,
    OnToolEvent,
    RoundDone,
    ToolEvent,
    ToolLoop,
    ToolLoopError,
    ToolOutcome,
    ToolRunner,
    ToolTurn,
)
from app.tool_loop.mcp_runner import Ask, CallRequest, Decision, McpRunner

__all__ = [
    "CANCELLED_CALL",
    "DEFAULT_MAX_ROUNDS",
    "FAILED_CALL",
    "Ask",
    "CallProgress",
    "CallRequest",
    "Decision",
    "McpRunner",
    "OnToolEvent",
    "RoundDone",
    "ToolEvent",
    "ToolLoop",
    "ToolLoopError",
    "ToolOutcome",
    "ToolRunner",
    "ToolTurn",
]
