"""`stoke serve` as a service the system keeps running: a systemd user unit on Linux, a
launchd agent on macOS.

Promises:

- The unit runs this Stoke's own Python (`python -m app serve`, with the model and port
  given), as the user, restarted when it fails; its output goes where the platform keeps
  logs (the journal: `journalctl --user -u stoke-serve`; on macOS ~/Library/Logs/Stoke).
- The key is not written into the unit: `stoke serve` takes it from the system keychain as it
  does on the command line; where there is no keychain, a private key file (0600) in Stoke's
  config folder is made once and named with --api-key-file.
- STOKE_HOME is carried into the unit when set, so the service uses the same library.
- Installing writes the file (0600) and, unless told not to, asks the service manager to
  start it now and at login; uninstalling stops it and removes the file. What the manager
  says when it cannot do that is shown in words with the command to run by hand.
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from app import paths

UNIT = "stoke-serve.service"
AGENT = "dev.stoke.serve"
KEY_FILE = "service-api-key"


class ServiceError(Exception):
    """The service could not be installed, removed or read; the message says why."""


@dataclass(frozen=True)
class Service:
    """Where the platform keeps the service's file, and the file itself."""

    path: Path
    text: str
    kind: str  # "systemd" | "launchd"


def command(model: str | None, port: int | None, key_file: Path | None) -> list[str]:
    """The serve command the service runs."""
    argv = [sys.executable, "-m", "app", "serve"]
    if model:
        argv += ["--model", model]
    if port is not None:
        argv += ["--port", str(port)]
    if key_file is not None:
        argv += ["--api-key-file", str(key_file)]
    return argv


def key_file_if_needed(keychain: bool) -> Path | None:
    """None where the keychain holds the key; else the private key file, made once."""
    if keychain:
        return None
    path = paths.config_dir() / KEY_FILE
    if not path.is_file():
        paths.write_private(path, secrets.token_urlsafe(32) + "\n")
    return path


def describe(argv: list[str], platform: str = sys.platform) -> Service:
    """The unit (Linux) or agent (macOS) that runs `argv`."""
    env = {"STOKE_HOME": os.environ["STOKE_HOME"]} if os.environ.get("STOKE_HOME") else {}
    if platform == "darwin":
        logs = Path.home() / "Library" / "Logs" / "Stoke"
        items = "".join(f"<string>{escape(a)}</string>" for a in argv)
        variables = "".join(
            f"<key>{escape(k)}</key><string>{escape(v)}</string>" for k, v in env.items()
        )
        text = f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict>
<key>Label</key><string>{AGENT}</string>
<key>ProgramArguments</key><array>{items}</array>
<key>EnvironmentVariables</key><dict>{variables}</dict>
<key>RunAtLoad</key><true/>
<key>KeepAlive</key><dict><key>SuccessfulExit</key><false/></dict>
<key>StandardOutPath</key><string>{escape(str(logs / "serve.log"))}</string>
<key>StandardErrorPath</key><string>{escape(str(logs / "serve.log"))}</string>
</dict></plist>
"""
        path = Path.home() / "Library" / "LaunchAgents" / f"{AGENT}.plist"
        return Service(path, text, "launchd")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    environment = "".join(f"Environment={shlex.quote(f'{k}={v}')}\n" for k, v in env.items())
    text = f"""[Unit]
Description=Stoke's API server (stoke serve)
After=network.target

[Service]
Type=simple
ExecStart={shlex.join(argv)}
{environment}Restart=on-failure
RestartSec=5
StandardOutput=journal
StandardError=journal

[Install]
WantedBy=default.target
"""
    return Service(config / "systemd" / "user" / UNIT, text, "systemd")


def install(service: Service, start: bool) -> str:
    """Write the file; start and enable it unless `start` is False. Returns what was done."""
    try:
        service.path.parent.mkdir(parents=True, exist_ok=True)
        paths.write_private(service.path, service.text)
    except OSError as exc:
        raise ServiceError(f"Could not write {service.path}: {exc.strerror}.") from None
    if service.kind == "launchd":
        steps = [["launchctl", "load", "-w", str(service.path)]]
        logs = Path.home() / "Library" / "Logs" / "Stoke"
        logs.mkdir(parents=True, exist_ok=True)
    else:
        steps = [
            ["systemctl", "--user", "daemon-reload"],
            ["systemctl", "--user", "enable", "--now", UNIT],
        ]
    if not start:
        return f"Wrote {service.path}. Start it with: {shlex.join(steps[-1])}"
    for step in steps:
        _run(step)
    return f"Installed and started {service.path}."


def uninstall(service: Service) -> str:
    if service.kind == "launchd":
        if service.path.is_file():
            _run(["launchctl", "unload", "-w", str(service.path)], check=False)
    elif service.path.is_file():
        _run(["systemctl", "--user", "disable", "--now", UNIT], check=False)
    if not service.path.is_file():
        return "The service is not installed."
    service.path.unlink()
    if service.kind == "systemd":
        _run(["systemctl", "--user", "daemon-reload"], check=False)
    return f"Removed {service.path}."


def status(service: Service) -> str:
    if not service.path.is_file():
        return "Not installed: `stoke service install` sets it up."
    probe = (
        ["launchctl", "list", AGENT]
        if service.kind == "launchd"
        else ["systemctl", "--user", "is-active", UNIT]
    )
    result = _run(probe, check=False)
    state = result.strip().splitlines()[-1] if result.strip() else "unknown"
    return f"Installed at {service.path}; the service manager says: {state}."


def _run(argv: list[str], check: bool = True) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ServiceError(
            f"{argv[0]} is not on this system, so the service cannot be started for you."
        ) from None
    except subprocess.TimeoutExpired:
        raise ServiceError(f"`{shlex.join(argv)}` did not answer in 60 s.") from None
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ServiceError(
            f"`{shlex.join(argv)}` failed: {said[-1] if said else f'exit {done.returncode}'}. "
            "The file is written; run the command by hand once the service manager is there."
        )
    return done.stdout or done.stderr
