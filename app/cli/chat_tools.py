"""The tools of `stoke chat`: the MCP servers of mcp.json (the window's), a call asked about on
the terminal before it runs, and each call's outcome said as a line.

Promises:

- Tools are on when mcp.json has enabled servers or `--tools` names some (a named server is
  used even when turned off in the file); `--no-tools` turns them off. A name mcp.json does
  not have is refused in words; a file or entry Stoke cannot read is said, never a traceback.
- No call runs without approval unless the person said so in mcp.json (a trusted server, a
  tool always allowed: app/mcp/trust.py). Before each other call the server, the tool and the
  arguments are printed and `Allow? [y]es / [a]lways / [n]o:` asked; a no asks for a reason
  the model reads. Answers are read from standard input, a terminal or a script's pipe; where
  none can be read (`--json` without a terminal, or the input ended) the call is denied with a
  reason that says approval was not possible: nothing runs silently.
- What is printed of a server is its name, its tools' names and the arguments the model
  wrote; never its command's environment or headers (tokens).
- Questions and call lines go to standard error, so standard output stays the reply (or the
  JSON of `--json`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

from app.mcp import config
from app.mcp.client import ServerState
from app.mcp.config import Server
from app.mcp.pool import Pool
from app.session import ChatSession
from app.tool_loop import (
    DEFAULT_MAX_ROUNDS,
    CallRequest,
    Decision,
    McpRunner,
    RoundDone,
    ToolEvent,
    ToolLoop,
    ToolLoopError,
)

QUESTION = "Allow? [y]es / [a]lways / [n]o: "
NO_TERMINAL = (
    "approval was not possible: Stoke ran without a terminal to ask the person on. Mark the "
    "tool always allowed (or the server trusted) in mcp.json to let it run unattended."
)
NO_ANSWER = "approval was not possible: no answer could be read."
PREVIEW = 200  # characters of a result shown on its line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--tools",
        nargs="+",
        metavar="SERVER",
        help="use these MCP servers of mcp.json (default: every enabled one)",
    )
    which.add_argument("--no-tools", action="store_true", help="use no MCP server")
    parser.add_argument(
        "--max-rounds",
        type=_positive,
        default=DEFAULT_MAX_ROUNDS,
        metavar="N",
        help=f"most rounds of tool calls in one turn (default: {DEFAULT_MAX_ROUNDS})",
    )
    parser.add_argument(
        "--tool-choice",
        default="auto",
        metavar="CHOICE",
        help="what a turn's first reply must do: auto (default), required (call some tool), "
        "none, or a tool's name; later replies choose freely. For scripts and small models "
        "that would not call by themselves",
    )


def chosen_servers(args: argparse.Namespace, warn: Callable[[str], None]) -> list[Server]:
    """The servers this chat uses (none: tools off); what mcp.json gets wrong goes to `warn`."""
    if args.no_tools:
        return []
    found = config.load()
    if found.problem is not None:
        warn(found.problem)
    for why in found.refused.values():
        warn(f"{why}: that MCP server is not used until it is fixed")
    if not args.tools:
        return [s for s in found.servers if s.enabled]
    servers = []
    for name in dict.fromkeys(args.tools):
        server = found.server(name)
        if server is None:
            known = ", ".join(s.name for s in found.servers) or "none"
            raise ToolLoopError(
                f"There is no usable MCP server named “{name}” in {config.config_path()} "
                f"(usable: {known})."
            )
        servers.append(dataclasses.replace(server, enabled=True))
    return servers


class TerminalTools:
    """The pool of the chosen servers, the loop over them for a session, and the terminal's
    side of each call (see the module's docstring). `can_ask`: whether answers can be read;
    `on_round` hears each round's reply. Close it (`async with`) to stop every server."""

    def __init__(
        self,
        servers: list[Server],
        args: argparse.Namespace,
        *,
        can_ask: bool,
        on_round: Callable[[RoundDone], None],
        warn: Callable[[str], None],
    ) -> None:
        self.pool = Pool(servers, self._heard)
        self.runner = McpRunner(self.pool, self._ask)
        self.max_rounds = args.max_rounds
        self.first_choice = args.tool_choice
        self.can_ask = can_ask
        self.on_round = on_round
        self.warn = warn
        self.calls: list[dict[str, Any]] = []  # each call's end, for --json

    async def __aenter__(self) -> TerminalTools:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.close()

    def loop(self, session: ChatSession) -> ToolLoop:
        return ToolLoop(
            session,
            self.runner,
            max_rounds=self.max_rounds,
            choice=lambda number: self.first_choice if number == 1 else "auto",
            on_event=self._on_event,
        )

    def _heard(self, name: str, state: ServerState) -> None:
        if state.phase == "failed":
            self.warn(f"the MCP server “{name}” {state}")

    def _on_event(self, event: ToolEvent) -> None:
        if isinstance(event, RoundDone):
            self.on_round(event)
            return
        if event.phase == "running":
            return
        server, tool = self.runner.route(event.call.name) or ("?", event.call.name)
        if event.phase == "started":
            _say(f"\n[tool] {server} › {tool} {_arguments(event.call.arguments)}")
            return
        outcome = event.outcome
        text = outcome.text if outcome is not None else ""
        self.calls.append(
            {
                "server": server,
                "tool": tool,
                "arguments": event.call.arguments,
                "state": event.phase,
                "result": text,
                "elapsed_s": round(event.elapsed_s, 3),
            }
        )
        _say(f"[tool] {event.phase} in {event.elapsed_s:.1f} s: {_preview(text)}")

    async def _ask(self, request: CallRequest) -> Decision:
        if not self.can_ask:
            return Decision(False, reason=NO_TERMINAL)
        while True:
            answer = await _read(QUESTION)
            if answer is None:
                return Decision(False, reason=NO_ANSWER)
            answer = answer.strip().lower()
            if answer in ("y", "yes"):
                return Decision(True)
            if answer in ("a", "always"):
                return Decision(True, always=True)
            if answer in ("n", "no"):
                reason = await _read("Why not? (optional, the model reads it): ")
                return Decision(False, reason=(reason or "").strip())


async def _read(question: str) -> str | None:
    """One line of standard input after `question` (None: the input ended)."""
    _say(question, end="")
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return line.rstrip("\n") if line else None


def _arguments(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments or "{}"), ensure_ascii=False)
    except json.JSONDecodeError:
        return arguments


def _preview(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= PREVIEW else line[: PREVIEW - 1] + "…"


def _say(text: str, end: str = "\n") -> None:
    print(text, end=end, file=sys.stderr, flush=True)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value
