"""`stoke doctor`: the report of app/doctor.py, as text or JSON."""

from __future__ import annotations

import argparse
import json


def _doctor(args: argparse.Namespace) -> int:
    from app import doctor  # its probes import the engines: only this command pays for them

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
    parser.set_defaults(run=_doctor)
