"""`stoke service install|uninstall|status`: the systemd user unit it writes passes
`systemd-analyze verify`, runs this Stoke's serve with STOKE_HOME carried and no key in the
file, is private; the launchd agent is a valid plist; uninstall removes it."""

from __future__ import annotations

import plistlib
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app import service
from app.__main__ import main


def test_the_systemd_unit_verifies_and_carries_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))

    def stoke_here(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = stoke_here("service", "install", "--no-start", "--port", "9011")
    assert code == 0, err
    unit = tmp_path / "config" / "systemd" / "user" / service.UNIT
    text = unit.read_text()
    assert stat.S_IMODE(unit.stat().st_mode) == 0o600
    assert f"ExecStart={sys.executable} -m app serve --port 9011" in text
    assert "STOKE_HOME=" in text and "api-key " not in text
    assert "systemctl --user enable --now stoke-serve.service" in out
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(
            ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
        )
        assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr
    code, out, _ = stoke_here("service", "status")
    assert code == 0 and "Installed at" in out
    code, out, _ = stoke_here("service", "uninstall")
    assert code == 0 and "Removed" in out and not unit.exists()


def test_the_launchd_agent_is_a_plist_that_runs_serve(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    agent = service.describe(service.command("/models/a.gguf", 9012, None), platform="darwin")
    body = plistlib.loads(agent.text.encode())
    assert body["Label"] == service.AGENT and body["RunAtLoad"] is True
    assert body["ProgramArguments"][-4:] == ["--model", "/models/a.gguf", "--port", "9012"]
    assert agent.path == tmp_path / "Library" / "LaunchAgents" / f"{service.AGENT}.plist"


def test_without_a_keychain_a_private_key_file_is_named(tmp_path: Path) -> None:
    key_file = service.key_file_if_needed(keychain=False)
    assert key_file is not None and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert service.key_file_if_needed(keychain=False).read_text() == key_file.read_text()
    assert service.key_file_if_needed(keychain=True) is None
    unit = service.describe(service.command(None, None, key_file), platform="linux")
    assert f"--api-key-file {key_file}" in unit.text
