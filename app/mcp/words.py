"""What went wrong with an MCP server or a call, in words a person can act on.

Every failure a person or a model can see goes through here, so none shows a traceback or an
exception's text: the command not found, the server's own last stderr line, an HTTP refusal
with its status, a call that timed out or lost its server. What a server itself said (its
stderr line, its JSON-RPC error message) is quoted, cut to a line; a url is shown without
what may carry a secret (`config.shown_url`).
"""

from __future__ import annotations

from collections.abc import Iterator
from http import HTTPStatus
from typing import TYPE_CHECKING

import httpx2

from app.mcp.config import Http, Server, shown_url

if TYPE_CHECKING:  # the SDK is imported where words need it: a second of every `stoke` start
    from mcp import MCPError

QUOTED = 300  # characters of a server's own words quoted


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside `exc`, exception groups opened (the SDK's task groups raise them)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def _sdk_errors(exc: BaseException) -> list[MCPError]:
    """The SDK's JSON-RPC errors inside `exc`."""
    from mcp import MCPError

    return [e for e in leaves(exc) if isinstance(e, MCPError)]


def connection_lost(exc: BaseException) -> bool:
    """Whether `exc` says the connection itself ended (the server stopped, the link broke)."""
    from mcp_types import CONNECTION_CLOSED

    return any(e.code == CONNECTION_CLOSED for e in _sdk_errors(exc))


def quoted(said: str) -> str:
    said = " ".join(said.split())
    return f"“{said if len(said) <= QUOTED else said[: QUOTED - 1] + '…'}”"


def _last_words(last_line: str | None) -> str:
    return f"; its last words: {quoted(last_line)}" if last_line else ""


def _status(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def start_failure(
    server: Server,
    exc: BaseException,
    *,
    last_line: str | None,
    status: int | None,
    timeout: float,
) -> str:
    """Why `server` did not start: `exc` as raised, its last stderr line, the last HTTP error
    status it answered."""
    found = list(leaves(exc))
    launch = server.launch
    if isinstance(launch, Http):
        url = shown_url(launch.url)
        if status in (401, 403):
            return f"{url} refused Stoke ({_status(status)}): check the token in its headers."
        if status == 404:
            return f"There is no MCP server at {url} (404 Not Found)."
        if status is not None:
            return f"{url} answered {_status(status)}."
        if any(isinstance(e, httpx2.ConnectError) for e in found):
            return f"Nothing answers at {url}: is the server running there?"
        if any(isinstance(e, httpx2.TimeoutException) for e in found):
            return f"{url} did not answer in time."
        if any(isinstance(e, httpx2.HTTPError) for e in found):
            return f"{url} could not be reached."
    else:
        command = launch.command
        if any(isinstance(e, FileNotFoundError) for e in found):
            return (
                f"The command “{command}” was not found. Install it, or give its full path "
                "in mcp.json (Stoke looks for it in the folders of PATH)."
            )
        if any(isinstance(e, PermissionError) for e in found):
            return f"The command “{command}” cannot be run here (permission denied)."
        errors = [e for e in found if isinstance(e, OSError) and e.strerror]
        if errors:
            return f"“{command}” could not be started ({errors[0].strerror})."
    from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    sdk = _sdk_errors(exc)
    if REQUEST_TIMEOUT in [e.code for e in sdk]:
        return (
            f"The server did not answer within {timeout:g} s of starting{_last_words(last_line)}."
        )
    refusals = [e for e in sdk if e.code != CONNECTION_CLOSED]
    if refusals:
        return f"The server refused to start a session: {quoted(refusals[0].error.message)}."
    return f"The server stopped while starting{_last_words(last_line)}."


def stopped(last_line: str | None) -> str:
    """A server that ended while it was ready."""
    return f"The server stopped{_last_words(last_line)}."


def call_failure(
    server: Server, tool: str, exc: BaseException, *, last_line: str | None, timeout: float
) -> str:
    """Why a call of `tool` gave no result."""
    from mcp_types import REQUEST_TIMEOUT

    errors = _sdk_errors(exc)
    if REQUEST_TIMEOUT in [e.code for e in errors]:
        return f"{tool} did not answer within {timeout:g} s, so the call was stopped."
    if connection_lost(exc):
        if isinstance(server.launch, Http):
            return f"The connection to {server.name} was lost during the call."
        return f"The server {server.name} stopped during the call{_last_words(last_line)}."
    if errors:
        return f"{server.name} answered with an error: {quoted(errors[0].error.message)}."
    return f"{server.name}'s answer could not be read."
