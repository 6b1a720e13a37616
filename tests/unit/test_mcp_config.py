"""Stoke's mcp.json: read back with problems in words, edited in place, private; other apps'
files imported; secrets kept out of reprs; what the person approved remembered."""

from __future__ import annotations

import json
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from app.mcp import config, other_apps, trust
from app.mcp.config import ConfigError, Http, Server, Stdio


def _write(document: object) -> Path:
    path = config.config_path()
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    return path


def test_a_bad_entry_is_refused_naming_its_field_and_the_file_is_left_as_it_is() -> None:
    path = _write(
        {
            "mcpServers": {
                "git": {"command": "uvx", "args": "mcp-server-git"},
                "vault": {"command": "vault-mcp", "env": {"VAULT_TOKEN": 123456789}},
                "both": {"command": "x", "url": "http://127.0.0.1:1/mcp"},
                "fine": {"command": "uvx", "args": ["mcp-server-time"]},
            }
        }
    )
    before = path.read_bytes()

    found = config.load()

    assert [s.name for s in found.servers] == ["fine"]
    assert found.refused["git"] == 'mcpServers.git.args = "mcp-server-git" is not a list of strings'
    assert "mcpServers.vault.env.VAULT_TOKEN is not a string" in found.refused["vault"]
    assert "123456789" not in found.refused["vault"]  # a secret's value is never shown
    assert "both a command and a url" in found.refused["both"]
    assert path.read_bytes() == before


def test_a_file_that_is_not_json_is_refused_in_words_and_not_overwritten() -> None:
    path = _write('{"mcpServers": {"git": {"command": "uvx",}}}')

    found = config.load()

    assert found.servers == ()
    assert found.problem is not None
    assert "is not valid JSON" in found.problem and "line 1, column 42" in found.problem
    with pytest.raises(ConfigError, match="Fix it by hand"):
        config.add_server(Server("time", Stdio("uvx", ("mcp-server-time",))))
    assert path.read_text() == '{"mcpServers": {"git": {"command": "uvx",}}}'


def test_edits_keep_the_rest_of_the_file_and_write_it_privately() -> None:
    path = _write({"globalShortcut": "Ctrl+Space", "mcpServers": {"odd": {"command": 5}}})

    config.add_server(Server("time", Stdio("uvx", ("mcp-server-time",), {"TZ": "UTC"})))
    config.add_server(Server("web", Http("https://example.invalid/mcp", {"X-Key": "k"})))
    config.update("time", enabled=False)
    config.edit_server("web", Server("site", Http("https://example.invalid/mcp", {"X-Key": "k"})))
    with pytest.raises(ConfigError, match="already an MCP server named “time”"):
        config.add_server(Server("time", Stdio("other")))
    with pytest.raises(ConfigError, match=r"mcpServers\.blank\.command"):
        config.add_server(Server("blank", Stdio(" ")))

    document = json.loads(path.read_text())
    assert document["globalShortcut"] == "Ctrl+Space"
    assert list(document["mcpServers"]) == ["odd", "time", "site"]
    assert document["mcpServers"]["odd"] == {"command": 5}  # a refused entry kept as written
    assert document["mcpServers"]["time"] == {
        "command": "uvx",
        "args": ["mcp-server-time"],
        "env": {"TZ": "UTC"},
        "enabled": False,
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config.remove_server("odd")
    assert set(json.loads(path.read_text())["mcpServers"]) == {"time", "site"}


def test_secrets_stay_out_of_reprs() -> None:
    stdio = Server("gh", Stdio("github-mcp", ("--stdio",), {"GITHUB_TOKEN": "ghp_s3cret"}))
    web = Server(
        "web", Http("https://me:pw@example.invalid/mcp?key=k3y", {"Authorization": "tok3n"})
    )
    shown = repr(stdio) + repr(web) + str(config.McpConfig((stdio, web)))

    for secret in ("ghp_s3cret", "pw", "k3y", "tok3n"):
        assert secret not in shown
    assert "GITHUB_TOKEN" in shown and "Authorization" in shown and "example.invalid/mcp" in shown


def test_an_import_from_a_claude_desktop_file_brings_servers_but_not_trust(tmp_path: Path) -> None:
    config.add_server(Server("time", Stdio("uvx", ("mcp-server-time",))))
    claude = tmp_path / "claude_desktop_config.json"
    claude.write_text(
        json.dumps(
            {
                "globalShortcut": "",
                "mcpServers": {
                    "github": {
                        "command": "npx",
                        "args": ["-y", "@modelcontextprotocol/server-github"],
                        "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_x"},
                        "alwaysAllow": ["create_issue"],
                        "autoApprove": ["create_issue"],
                    },
                    "off": {"command": "uvx", "args": ["mcp-server-fetch"], "disabled": True},
                    "old": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
                    "time": {"command": "elsewhere"},
                },
            }
        )
    )

    imported = other_apps.import_from(claude)

    assert imported.added == ("github", "off")
    assert any("mcpServers.old.type" in why and "not SSE" in why for why in imported.left_out)
    assert any("“time” is already among Stoke's servers" in why for why in imported.left_out)
    found = config.load()
    github = found.server("github")
    assert github is not None and isinstance(github.launch, Stdio)
    assert github.launch.env == {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_x"}
    assert not github.trusted and github.always_allow == ()
    assert found.server("off") is not None and not found.server("off").enabled  # type: ignore[union-attr]
    assert found.server("time").launch == Stdio("uvx", ("mcp-server-time",))  # type: ignore[union-attr]


@pytest.mark.skipif(sys.platform != "linux", reason="the Linux folders")
def test_the_other_apps_files_are_found_where_they_keep_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    claude = tmp_path / "xdg" / "Claude" / "claude_desktop_config.json"
    lm_studio = tmp_path / ".lmstudio" / "mcp.json"
    for path in (claude, lm_studio):
        path.parent.mkdir(parents=True)
        path.write_text('{"mcpServers": {}}')

    assert other_apps.known_files() == [
        other_apps.OtherFile("Claude Desktop", claude),
        other_apps.OtherFile("LM Studio", lm_studio),
    ]


def test_approvals_are_remembered_per_tool_and_server_until_the_command_changes() -> None:
    config.add_server(Server("git", Stdio("uvx", ("mcp-server-git",))))
    git = config.load().server("git")
    assert git is not None and trust.needs_approval(git, "git_status")

    git = trust.set_always_allowed("git", "git_status", True)
    assert not trust.needs_approval(git, "git_status") and trust.needs_approval(git, "git_commit")
    git = trust.set_trusted("git", True)
    assert not trust.needs_approval(git, "git_commit")

    config.edit_server("git", replace(git, enabled=False))  # the same command: trust stays
    assert config.load().server("git") == replace(git, enabled=False)
    config.edit_server("git", replace(git, launch=Stdio("uvx", ("mcp-server-git", "--repo", "/"))))
    git = config.load().server("git")
    assert git is not None
    assert trust.needs_approval(git, "git_status") and trust.needs_approval(git, "git_commit")
