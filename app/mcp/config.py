"""Stoke's `mcp.json`: which MCP servers there are, how to reach each, and what Stoke keeps
about them.

The file is the shape Claude Desktop, LM Studio and Cursor use, so a person can paste an entry
from any of their guides: `{"mcpServers": {name: {"command", "args", "env", "cwd"} | {"url",
"headers"}}}` (a `"type"` of "stdio" or "http" is accepted too). Stoke's own fields sit beside
them in an entry and leave the shape as it is: `"enabled"` (false: the server is kept but never
started), `"trusted"` (its tools run without asking) and `"alwaysAllow"` (the tools the person
always allowed). Keys other than `mcpServers` at the top are left alone.

Reading never raises for what is in the file (`load`): a file that cannot be read or parsed is
refused whole, a server entry with a wrong part is refused alone, each in words naming the part
(`mcpServers.git.args = "x" is not a list of strings`), through `app.stored`'s schemas. Unlike
Stoke's other files, a bad mcp.json is not repaired: a person writes it by hand, maybe in an
editor still open, so it is left as it is until they fix it. Edits (`add_server`,
`add_servers`, `edit_server`, `remove_server`, `update`) change entries of the file as found,
keep every other entry (even a refused one) and top-level key as it was, write only entries
Stoke would read back, and raise ConfigError in words instead of writing over a file they
cannot parse. Two processes editing at once: the last write wins, whole. The file is private
(0600 in the 0700 config folder, written atomically by `paths.write_private`).

Env values and header values are secrets (tokens): the objects' reprs show their names only,
and no problem sentence shows a secret's value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from app import paths
from app.stored import DROP, Fields, Value, array_of, boolean, one_of, text

FILE_NAME = "mcp.json"
HIDDEN = "<hidden>"


class ConfigError(Exception):
    """mcp.json cannot be changed as asked; the message says why, in words."""


@dataclass(frozen=True, repr=False)
class Stdio:
    """A server Stoke runs: `command` with `args` as a list (never a shell string), with the
    user's rights, `env` over a minimal environment, in `cwd` when given."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def __repr__(self) -> str:
        return (
            f"Stdio(command={self.command!r}, args={self.args!r}, env={hidden(self.env)}, "
            f"cwd={self.cwd!r})"
        )


@dataclass(frozen=True, repr=False)
class Http:
    """A server Stoke reaches over Streamable HTTP at `url`, sending `headers` (a token)."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Http(url={shown_url(self.url)!r}, headers={hidden(self.headers)})"


@dataclass(frozen=True)
class Server:
    """One entry of mcp.json: its name, how to reach it, and Stoke's own fields."""

    name: str
    launch: Stdio | Http
    enabled: bool = True
    trusted: bool = False
    always_allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class McpConfig:
    """What mcp.json holds: the servers Stoke can use, the entries it refused (name -> why, in
    words), and `problem` when the whole file was refused."""

    servers: tuple[Server, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)
    problem: str | None = None

    def server(self, name: str) -> Server | None:
        return next((s for s in self.servers if s.name == name), None)


def hidden(secrets: Mapping[str, str]) -> dict[str, str]:
    """`secrets` with every value hidden: what a repr, a log or an export may show."""
    return dict.fromkeys(secrets, HIDDEN)


def shown_url(url: str) -> str:
    """`url` without what may carry a secret: the user and password, the query, the fragment."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return HIDDEN
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, HIDDEN if parts.query else "", ""))


# -- the schema, through app.stored -------------------------------------------------------------


def _filled(v: Any) -> bool:
    return isinstance(v, str) and v.strip() != ""


@dataclass(frozen=True)
class _Secrets:
    """An object of strings whose values are secrets: a wrong one is named, never shown."""

    def clean(self, value: Any, where: str, problems: list[str]) -> Any:
        if not isinstance(value, dict):
            problems.append(f"{where} is not an object of names and strings")
            return DROP
        wrong = [f"{where}.{key}" for key, item in value.items() if not isinstance(item, str)]
        problems.extend(f"{name} is not a string (its value is not shown)" for name in wrong)
        return DROP if wrong else value


@dataclass(frozen=True)
class _Url:
    """An http:// or https:// address; a wrong one is shown without what may be a secret."""

    def clean(self, value: Any, where: str, problems: list[str]) -> Any:
        if isinstance(value, str) and re.fullmatch(r"https?://\S+", value):
            return value
        shown = f" = {json.dumps(shown_url(value))}" if isinstance(value, str) else ""
        problems.append(f"{where}{shown} is not an http:// or https:// address")
        return DROP


_STOKE = {
    "enabled": Value(boolean, "true or false"),
    "trusted": Value(boolean, "true or false"),
    "alwaysAllow": Value(array_of(text), "a list of tool names"),
}
_STDIO = Fields(
    {
        "command": Value(_filled, "a command to run"),
        "args": Value(array_of(text), "a list of strings"),
        "env": _Secrets(),
        "cwd": Value(_filled, "a folder"),
        "type": Value(one_of("stdio"), '"stdio" (an entry with a command runs it)'),
        **_STOKE,
    },
    required=("command",),
)
_HTTP = Fields(
    {
        "url": _Url(),
        "headers": _Secrets(),
        "type": Value(
            one_of("http", "streamable-http", "streamableHttp"),
            '"http": Stoke reaches a url over Streamable HTTP, not SSE',
        ),
        **_STOKE,
    },
    required=("url",),
)


def where(name: str) -> str:
    """How an entry is named in a sentence: `mcpServers.git`, `mcpServers["my server"]`."""
    return f"mcpServers.{name}" if name.isidentifier() else f"mcpServers[{json.dumps(name)}]"


def checked(name: str, entry: Any) -> Server | str:
    """The entry as a Server, or why it is refused, in words naming each wrong part."""
    here = where(name)
    if not name.strip():
        return f"{here}: a server needs a name"
    if isinstance(entry, dict) and "command" in entry and "url" in entry:
        return f"{here} has both a command and a url: give one"
    if isinstance(entry, dict) and "command" not in entry and "url" not in entry:
        return f"{here} needs a command (a program to run) or a url (a server to reach)"
    problems: list[str] = []
    schema = _HTTP if isinstance(entry, dict) and "url" in entry else _STDIO
    value = schema.clean(entry, here, problems)
    if problems:
        return "; ".join(problems)
    launch: Stdio | Http
    if "url" in value:
        launch = Http(value["url"], dict(value.get("headers", {})))
    else:
        launch = Stdio(
            value["command"],
            tuple(value.get("args", ())),
            dict(value.get("env", {})),
            value.get("cwd"),
        )
    return Server(
        name,
        launch,
        enabled=value.get("enabled", True),
        trusted=value.get("trusted", False),
        always_allow=tuple(value.get("alwaysAllow", ())),
    )


def entry(server: Server) -> dict[str, Any]:
    """`server` as its entry in the file: the shared shape, then Stoke's fields that differ
    from their defaults."""
    launch = server.launch
    found: dict[str, Any]
    if isinstance(launch, Http):
        found = {"url": launch.url} | ({"headers": dict(launch.headers)} if launch.headers else {})
    else:
        found = {"command": launch.command, "args": list(launch.args)}
        found |= {"env": dict(launch.env)} if launch.env else {}
        found |= {"cwd": launch.cwd} if launch.cwd else {}
    found |= {} if server.enabled else {"enabled": False}
    found |= {"trusted": True} if server.trusted else {}
    return found | ({"alwaysAllow": list(server.always_allow)} if server.always_allow else {})


def parse(document: Any, source: str) -> McpConfig:
    """The servers of an mcp.json document (parsed JSON); `source` names it in the words."""
    if not isinstance(document, dict):
        return McpConfig(problem=f"{source} is not an object with mcpServers in it")
    servers = document.get("mcpServers", {})
    if not isinstance(servers, dict):
        return McpConfig(problem=f"{source}: mcpServers is not an object of servers by name")
    found = {name: checked(name, item) for name, item in servers.items()}
    return McpConfig(
        tuple(s for s in found.values() if isinstance(s, Server)),
        {name: why for name, why in found.items() if isinstance(why, str)},
    )


def read_json(path: Path) -> tuple[Any, str | None]:
    """The parsed file and None, or None and why it cannot be used, in words (never raises for
    what is at `path`; a missing file is `{}`)."""
    try:
        return json.loads(path.read_text("utf-8")), None
    except FileNotFoundError:
        return {}, None
    except IsADirectoryError:
        return None, f"{path} is a folder, not a file"
    except UnicodeDecodeError:
        return None, f"{path} is not UTF-8 text"
    except RecursionError:
        return None, f"{path} is nested too deeply to read"
    except json.JSONDecodeError as exc:
        return (
            None,
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
        )
    except OSError as exc:
        return None, f"{path} could not be read ({exc.strerror or 'an I/O error'})"


# -- Stoke's own file ---------------------------------------------------------------------------


def config_path() -> Path:
    """Stoke's mcp.json, in its private config folder."""
    return paths.config_dir() / FILE_NAME


def load() -> McpConfig:
    """Stoke's servers as its mcp.json holds them; never raises for what is in the file."""
    path = config_path()
    document, problem = read_json(path)
    if problem is not None:
        return McpConfig(problem=f"{problem}: no MCP server is used until it is fixed")
    return parse(document, str(path))


def _document() -> dict[str, Any]:
    """The file as found, to change one entry of; ConfigError where it cannot be parsed, so
    an edit never replaces what the person wrote."""
    document, problem = read_json(config_path())
    if problem is not None:
        raise ConfigError(f"{problem}. Fix it by hand (or remove it) before changing servers.")
    if not isinstance(document, dict) or not isinstance(document.get("mcpServers", {}), dict):
        raise ConfigError(
            f"{config_path()} has no object mcpServers to add to. Fix it by hand (or remove "
            "it) before changing servers."
        )
    document.setdefault("mcpServers", {})
    return document


def _write(document: dict[str, Any]) -> None:
    paths.write_private(config_path(), json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def _stored(document: dict[str, Any], name: str) -> Server:
    """The entry `name` as it stands; ConfigError when there is none or it is refused."""
    if name not in document["mcpServers"]:
        raise ConfigError(f"There is no MCP server named “{name}”.")
    found = checked(name, document["mcpServers"][name])
    if isinstance(found, str):
        raise ConfigError(f"{found}. Fix it by hand in {config_path()} first.")
    return found


def _entry(server: Server) -> dict[str, Any]:
    """`server`'s entry, checked as it will be read back; ConfigError when it would be refused."""
    found = checked(server.name, entry(server))
    if isinstance(found, str):
        raise ConfigError(f"{found}.")
    return entry(server)


def add_server(server: Server) -> None:
    """A new entry; ConfigError when the name is taken or the entry would be refused."""
    add_servers([server])


def add_servers(servers: list[Server]) -> None:
    """New entries in one write (an import); ConfigError, nothing written, as add_server."""
    document = _document()
    for server in servers:
        if server.name in document["mcpServers"]:
            raise ConfigError(f"There is already an MCP server named “{server.name}”.")
        document["mcpServers"][server.name] = _entry(server)
    _write(document)


def edit_server(name: str, server: Server) -> None:
    """Entry `name` (a refused one too: this is how it is fixed) replaced by `server`, renamed
    in place when its name differs. Trust was given to what the entry ran: when the command,
    args, env, folder, url or headers change, the server is no longer trusted and no tool of it
    is always allowed."""
    document = _document()
    servers = document["mcpServers"]
    if name not in servers:
        raise ConfigError(f"There is no MCP server named “{name}”.")
    if server.name != name and server.name in servers:
        raise ConfigError(f"There is already an MCP server named “{server.name}”.")
    old = checked(name, servers[name])
    if not isinstance(old, Server) or server.launch != old.launch:
        server = replace(server, trusted=False, always_allow=())
    new = _entry(server)
    document["mcpServers"] = {
        (server.name if key == name else key): (new if key == name else value)
        for key, value in servers.items()
    }
    _write(document)


def remove_server(name: str) -> None:
    """Entry `name` gone (a refused one too); ConfigError when there is none."""
    document = _document()
    if name not in document["mcpServers"]:
        raise ConfigError(f"There is no MCP server named “{name}”.")
    del document["mcpServers"][name]
    _write(document)


def update(
    name: str,
    *,
    enabled: bool | None = None,
    trusted: bool | None = None,
    always_allow: tuple[str, ...] | None = None,
) -> Server:
    """Stoke's own fields of entry `name` changed (None: as they were), the rest of it as it
    was; returns the entry as now written. ConfigError for a missing or refused entry."""
    document = _document()
    server = _stored(document, name)
    server = replace(
        server,
        enabled=server.enabled if enabled is None else enabled,
        trusted=server.trusted if trusted is None else trusted,
        always_allow=server.always_allow if always_allow is None else always_allow,
    )
    document["mcpServers"][name] = _entry(server)
    _write(document)
    return server
