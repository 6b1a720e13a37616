"""Prompt presets: a named system prompt and sampling settings to give a conversation at once.

A few are built in; the user's own are kept in one private JSON file beside the settings
(`presets.json`, written atomically through paths.write_private). Applying a preset sets the
conversation's system prompt and the sampling keys presets own; the seed, the reply length
and the reasoning switch stay as they were. A preset saved from a conversation that chose its
MCP servers (`mcp_servers`: a list of names, [] for none) carries that choice and applying it
sets it; a preset without one leaves the conversation's tools as they are. Which preset a
conversation follows is not stored: it is the one whose prompt and sampling it matches (tools
aside), so an edit by hand shows as "Custom".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app import paths
from app.engine.protocol import SamplingParams
from app.stored import Fields, Items, Stored, Value, number, text, text_or_none, whole

FILE_NAME = "presets.json"
# What a preset sets, each key as presets.json must hold it; every other sampling key of the
# conversation is kept.
_SAMPLING = {
    "temperature": Value(number(0), "a number, 0 or more"),
    "top_p": Value(lambda v: number(0)(v) and v <= 1, "a number from 0 to 1"),
    "min_p": Value(lambda v: number(0)(v) and v <= 1, "a number from 0 to 1"),
    "top_k": Value(whole(0), "a whole number, 0 or more"),
}
PRESET_KEYS = tuple(_SAMPLING)
TOOLS_KEY = "mcp_servers"  # the conversation's MCP servers (the window's chat_tools reads it)
_STORED = {
    **_SAMPLING,
    TOOLS_KEY: Value(
        lambda v: isinstance(v, list) and all(text(x) for x in v), "a list of MCP server names"
    ),
}
NAME_LIMIT = 60
_DEFAULTS = {k: getattr(SamplingParams(), k) for k in PRESET_KEYS}  # what a key left out means


class PresetError(Exception):
    """A preset that cannot be saved or deleted; the message says why, in words."""


@dataclass(frozen=True)
class Preset:
    name: str
    system_prompt: str | None
    sampling: dict[str, Any] = field(default_factory=dict)  # PRESET_KEYS and TOOLS_KEY
    builtin: bool = False

    def applied_to(self, sampling: Mapping[str, Any]) -> dict[str, Any]:
        """A conversation's sampling with this preset's keys in place of its own (its MCP
        servers too, where the preset chose them)."""
        kept = {k: v for k, v in sampling.items() if k not in PRESET_KEYS}
        return {**kept, **self.sampling}

    def matches(self, system_prompt: str | None, sampling: Mapping[str, Any]) -> bool:
        """Whether a conversation with this prompt and sampling follows this preset."""
        return (system_prompt or None) == (self.system_prompt or None) and all(
            sampling.get(k, _DEFAULTS[k]) == self.sampling.get(k, _DEFAULTS[k]) for k in PRESET_KEYS
        )


BUILTIN: tuple[Preset, ...] = (
    Preset("Default", None, {}, builtin=True),
    Preset(
        "Precise",
        "Answer accurately and concisely. If you are not sure, say so instead of guessing.",
        {"temperature": 0.2, "top_p": 0.9, "min_p": 0.05},
        builtin=True,
    ),
    Preset(
        "Creative",
        "Be imaginative and vivid: offer unexpected ideas, images and turns of phrase.",
        {"temperature": 1.1, "top_p": 0.98, "min_p": 0.02},
        builtin=True,
    ),
    Preset(
        "Coder",
        "You are an expert programmer. Answer with correct, idiomatic, complete code in "
        "fenced blocks, and explain briefly what it does and why.",
        {"temperature": 0.2, "top_p": 0.95, "min_p": 0.05},
        builtin=True,
    ),
)


def presets_path() -> Path:
    return paths.config_dir() / FILE_NAME


def load_presets(path: Path | None = None) -> list[Preset]:
    """The built-in presets, then the user's (sorted by name). A damaged file or entry is
    left out (named in a warning, the file as found kept aside: app/stored.py): presets are a
    convenience, never a reason not to start."""
    return [*BUILTIN, *sorted(_user_presets(path).values(), key=lambda p: p.name.casefold())]


def save_preset(
    name: str, system_prompt: str | None, sampling: Mapping[str, Any], path: Path | None = None
) -> Preset:
    """Save (or replace) the user's preset `name` from a conversation's prompt and sampling."""
    name = " ".join(name.split())
    if not name:
        raise PresetError("Give the preset a name.")
    if len(name) > NAME_LIMIT:
        raise PresetError(f"A preset name can be at most {NAME_LIMIT} characters.")
    if any(p.name.casefold() == name.casefold() for p in BUILTIN):
        raise PresetError(f"“{name}” is a built-in preset. Choose another name.")
    kept = {k: sampling[k] for k in (*PRESET_KEYS, TOOLS_KEY) if k in sampling}
    preset = Preset(name, system_prompt or None, kept)
    user = _user_presets(path)
    user = {k: p for k, p in user.items() if k.casefold() != name.casefold()}
    user[name] = preset
    _write(user, path)
    return preset


def delete_preset(name: str, path: Path | None = None) -> None:
    if any(p.name == name for p in BUILTIN):
        raise PresetError(f"“{name}” is built in and cannot be deleted.")
    user = _user_presets(path)
    if user.pop(name, None) is None:
        raise PresetError(f"There is no preset named “{name}”.")
    _write(user, path)


def _user_presets(path: Path | None) -> dict[str, Preset]:
    entries = PRESETS_FILE.read(path or presets_path()).value.get("presets", [])
    return {
        e["name"]: Preset(e["name"], e.get("system_prompt") or None, e["sampling"]) for e in entries
    }


# A damaged entry is left out alone, a wrong sampling value alone; the file as found is kept.
PRESETS_FILE = Stored(
    Fields(
        {
            "presets": Items(
                Fields(
                    {
                        "name": Value(lambda v: text(v) and bool(v.strip()), "a name"),
                        "system_prompt": Value(text_or_none, "a prompt or null"),
                        "sampling": Fields(_STORED),
                    },
                    required=("name", "sampling"),
                )
            )
        }
    ),
    keep=True,
)


def _write(user: Mapping[str, Preset], path: Path | None) -> None:
    records = [
        {"name": p.name, "system_prompt": p.system_prompt, "sampling": p.sampling}
        for p in user.values()
    ]
    paths.write_private(path or presets_path(), json.dumps({"presets": records}, indent=2))
