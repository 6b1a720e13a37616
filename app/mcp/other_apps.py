"""Other apps' MCP config files, and their servers brought into Stoke's mcp.json.

Claude Desktop (`claude_desktop_config.json` in its config folder: ~/Library/Application
Support/Claude on macOS, ~/.config/Claude on Linux, %APPDATA%\\Claude on Windows), LM Studio
(~/.lmstudio/mcp.json) and Cursor (~/.cursor/mcp.json, or a project's .cursor/mcp.json, given
by its path) keep their servers in the shape Stoke's file has, under `mcpServers`.

An import carries each server's command, args, env, folder, url and headers (env values and
headers too: the server needs them, and Stoke's file is as private as theirs), and a server the
other app had turned off (`"disabled": true`) comes in turned off. Nothing else the other app
kept comes along, and trust least of all: an imported server is not trusted and none of its
tools is always allowed, whatever the other app said. A server whose name Stoke already has is
left as Stoke has it; one Stoke would refuse is left out. Each left out is said in words.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from app.mcp import config

_CARRIED = ("command", "args", "env", "cwd", "url", "headers", "type")


@dataclass(frozen=True)
class OtherFile:
    """Another app's MCP config file: which app, and where."""

    app: str
    path: Path


@dataclass(frozen=True)
class Imported:
    """What an import did: the servers added, and each one left out with why, in words."""

    added: tuple[str, ...]
    left_out: tuple[str, ...]


def candidates() -> list[OtherFile]:
    """Where Claude Desktop, LM Studio and Cursor keep their files on this system."""
    if sys.platform == "darwin":
        claude = Path.home() / "Library" / "Application Support" / "Claude"
    else:  # ~/.config/Claude (or under XDG_CONFIG_HOME); %APPDATA%\Claude on Windows
        claude = Path(platformdirs.user_config_dir("Claude", appauthor=False, roaming=True))
    return [
        OtherFile("Claude Desktop", claude / "claude_desktop_config.json"),
        OtherFile("LM Studio", Path.home() / ".lmstudio" / "mcp.json"),
        OtherFile("Cursor", Path.home() / ".cursor" / "mcp.json"),
    ]


def known_files() -> list[OtherFile]:
    """The other apps' files that are on this machine, to offer for import."""
    return [found for found in candidates() if found.path.is_file()]


def _carried(document: Any) -> Any:
    """What Stoke keeps of another app's file: its servers' entries, each with the parts Stoke
    reads (what is not an object as it is, to be refused in words)."""
    servers = document.get("mcpServers", {}) if isinstance(document, dict) else None
    if not isinstance(servers, dict):
        return document
    return {"mcpServers": {name: _entry(item) for name, item in servers.items()}}


def _entry(entry: Any) -> Any:
    if not isinstance(entry, dict):
        return entry
    kept = {key: value for key, value in entry.items() if key in _CARRIED}
    return kept | ({"enabled": False} if entry.get("disabled") is True else {})


def import_from(path: Path) -> Imported:
    """The servers of the file at `path` added to Stoke's mcp.json in one write. ConfigError,
    in words, when that file cannot be used or Stoke's cannot be changed."""
    if not path.is_file():
        raise config.ConfigError(f"There is no file {path}, so nothing was imported.")
    document, problem = config.read_json(path)
    found = (
        config.McpConfig(problem=problem)
        if problem
        else config.parse(_carried(document), str(path))
    )
    if found.problem is not None:
        raise config.ConfigError(f"{found.problem}, so nothing was imported.")
    stoke = config.load()
    have = {s.name for s in stoke.servers} | set(stoke.refused)
    added = [s for s in found.servers if s.name not in have]
    left_out = [f"{path}: {why}" for why in found.refused.values()]
    left_out += [
        f"“{s.name}” is already among Stoke's servers: left as it is"
        for s in found.servers
        if s.name in have
    ]
    if added:
        config.add_servers(added)
    return Imported(tuple(s.name for s in added), tuple(left_out))
