"""`stoke service install|uninstall|status`: `stoke serve` kept running by the system (a
systemd user unit on Linux, a launchd agent on macOS: app/service.py)."""

from __future__ import annotations

import argparse
import sys

from app import service
from app.models import secrets


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "service", help="run `stoke serve` as a service (systemd user unit or launchd agent)"
    )
    parser.add_argument("action", choices=("install", "uninstall", "status"))
    parser.add_argument("--model", help="the model the server loads (default: the app's)")
    parser.add_argument("--port", type=int, help="the server's port (default: 8484)")
    parser.add_argument(
        "--no-start", action="store_true", help="write the file only; start it yourself"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "install":
            key_file = service.key_file_if_needed(secrets.keychain_available())
            unit = service.describe(service.command(args.model, args.port, key_file))
            print(service.install(unit, start=not args.no_start))
            if key_file is not None:
                print(f"There is no system keychain here: the key is in {key_file} (mode 600).")
        else:
            unit = service.describe(service.command(None, None, None))
            print(service.uninstall(unit) if args.action == "uninstall" else service.status(unit))
    except service.ServiceError as exc:
        print(f"stoke: {exc}", file=sys.stderr)
        return 1
    return 0
