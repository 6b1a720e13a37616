"""What the person approved, remembered: a tool always allowed, a server trusted.

No tool runs without the person's approval unless they said so here: `needs_approval` is
false only for a tool they always allowed (per server and tool) or a server they marked
trusted. The memory is kept in mcp.json itself, in Stoke's fields of the server's entry
(`"trusted"`, `"alwaysAllow"`), rather than in a file of its own, because:

- trust belongs to the entry it was given to: it goes when the entry is removed, and
  `config.edit_server` drops it when what the entry runs changes (a second file keyed by name
  would hand it to whatever next took that name);
- the file is private already, and whoever can write it can already make Stoke run any
  command, so keeping trust there lets nobody do more than before;
- one file, one write path (`config.update`): the person sees and can undo it by hand too.

An import never brings trust from another app (other_apps.py).
"""

from __future__ import annotations

from app.mcp import config
from app.mcp.config import Server


def needs_approval(server: Server, tool: str) -> bool:
    """Whether the person must approve this call of `tool` before it runs."""
    return not (server.trusted or tool in server.always_allow)


def set_always_allowed(name: str, tool: str, allowed: bool) -> Server:
    """`tool` of server `name` always allowed (or no longer); the entry as now written.
    ConfigError in words when there is no such usable entry or the file cannot be changed."""
    server = config.load().server(name)
    if server is None:
        raise config.ConfigError(f"There is no usable MCP server named “{name}”.")
    others = tuple(t for t in server.always_allow if t != tool)
    return config.update(name, always_allow=(*others, tool) if allowed else others)


def set_trusted(name: str, trusted: bool) -> Server:
    """Every tool of server `name` runs without asking (or asks again); the entry as now
    written. ConfigError in words as `set_always_allowed`."""
    return config.update(name, trusted=trusted)
