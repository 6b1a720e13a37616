"""`stoke doctor`: the report of app/doctor.py, as text or JSON; `--reset-safe-mode` forgets
the models that crashed here instead (app/engine/safe_mode.py)."""

from __future__ import annotations

import argparse
import json


def _doctor(args: argparse.Namespace) -> int:
    from app import doctor  # its probes import the engines: only this command pays for them

    if args.reset_safe_mode:
        cleared = doctor.reset_safe_mode()
        if args.json:
            print(json.dumps({"cleared": cleared}, indent=2))
        else:
            count = f"{len(cleared)} safe-mode record{'' if len(cleared) == 1 else 's'}"
            print(
                "\n".join([f"Cleared {count}.", *cleared]) if cleared else "No safe-mode records."
            )
        return 0
    report = doctor.collect(args.rpc or ())
    print(json.dumps(report, indent=2) if args.json else doctor.render(report))
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("doctor", help="versions, paths, devices, engine checks")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--rpc",
        action="append",
        metavar="HOST:PORT,...",
        help="also check these llama.cpp rpc-servers (memory, round trip)",
    )
    parser.add_argument(
        "--reset-safe-mode",
        action="store_true",
        help="forget the models that crashed here, so each loads with its own settings again",
    )
    parser.set_defaults(run=_doctor)
