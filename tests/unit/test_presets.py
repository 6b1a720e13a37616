"""Prompt presets: the built-in ones, the user's saved in a private file, applied by keys."""

from __future__ import annotations

import json
import stat

import pytest

from app import presets
from app.presets import BUILTIN, PresetError, delete_preset, load_presets, save_preset


def names() -> list[str]:
    return [p.name for p in load_presets()]


def test_the_built_in_presets_come_first_and_cannot_be_overwritten_or_deleted() -> None:
    assert names() == ["Default", "Precise", "Creative", "Coder"]
    precise = next(p for p in BUILTIN if p.name == "Precise")
    assert precise.sampling["temperature"] < 0.5 and precise.builtin
    assert next(p for p in BUILTIN if p.name == "Coder").system_prompt
    with pytest.raises(PresetError, match="built-in"):
        save_preset("precise", "x", {})
    with pytest.raises(PresetError, match="cannot be deleted"):
        delete_preset("Default")


def test_saved_presets_are_private_sorted_replaced_and_deleted() -> None:
    save_preset("  Zed   reviewer ", "Review code.", {"temperature": 0.3, "seed": 7, "top_k": 40})
    save_preset("alpha", None, {"temperature": 1.0})
    assert names()[4:] == ["alpha", "Zed reviewer"]
    zed = load_presets()[-1]
    assert zed.system_prompt == "Review code." and zed.sampling == {"temperature": 0.3, "top_k": 40}
    path = presets.presets_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    save_preset("ALPHA", "Now with a prompt.", {})
    assert names()[4:] == ["ALPHA", "Zed reviewer"]
    delete_preset("ALPHA")
    assert names()[4:] == ["Zed reviewer"]
    with pytest.raises(PresetError, match="no preset"):
        delete_preset("ALPHA")
    for bad in ("", "   ", "x" * 61):
        with pytest.raises(PresetError):
            save_preset(bad, None, {})


def test_a_damaged_file_or_entry_is_left_out() -> None:
    path = presets.presets_path()
    path.write_text("{not json")
    assert names() == [p.name for p in BUILTIN]
    entries = [
        {"name": "ok", "system_prompt": None, "sampling": {"temperature": 0.5, "top_p": "x"}},
        {"name": 3, "sampling": {}},
        "nonsense",
    ]
    path.write_text(json.dumps({"presets": entries}))
    assert names()[4:] == ["ok"] and load_presets()[-1].sampling == {"temperature": 0.5}


def test_applying_sets_the_preset_keys_keeps_the_others_and_matching_reads_defaults() -> None:
    default, precise = BUILTIN[0], BUILTIN[1]
    mine = {"temperature": 1.5, "top_p": 0.5, "seed": 42, "max_tokens": 99, "reasoning": True}
    applied = precise.applied_to(mine)
    assert applied == {"seed": 42, "max_tokens": 99, "reasoning": True, **precise.sampling}
    assert precise.matches(precise.system_prompt, applied)
    assert not precise.matches(None, applied)
    assert default.applied_to(mine) == {"seed": 42, "max_tokens": 99, "reasoning": True}
    assert default.matches(None, {"temperature": 0.7, "seed": 1})  # the defaults, spelled out
    assert not default.matches("", {"temperature": 0.8})


def test_a_preset_carries_the_conversations_mcp_servers_where_it_chose_them() -> None:
    """Saved from a conversation that chose its MCP servers, a preset sets them when applied
    (and reads back from presets.json); one saved without a choice keeps the conversation's.
    Tools never make a conversation stop matching its preset."""
    chose = save_preset("Offline", None, {"temperature": 0.3, "mcp_servers": []})
    either = save_preset("Plain", None, {"temperature": 0.3})
    loaded = {p.name: p for p in load_presets()}
    assert loaded["Offline"].sampling == {"temperature": 0.3, "mcp_servers": []}
    assert loaded["Offline"].applied_to({"mcp_servers": ["git"]})["mcp_servers"] == []
    assert either.applied_to({"mcp_servers": ["git"]})["mcp_servers"] == ["git"]
    assert chose.matches(None, {"temperature": 0.3, "mcp_servers": ["time"]})
