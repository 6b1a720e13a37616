"""The `stoke` command: no arguments starts the app; subcommands for the terminal."""

from __future__ import annotations

import argparse
import json
import sys

from app.cli import chat


def _doctor(args: argparse.Namespace) -> int:
    from app import doctor

    report = doctor.collect()
    print(json.dumps(report, indent=2) if args.json else doctor.render(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stoke",
        description="Chat with large local models without re-reading the conversation.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    chat.add_parser(subparsers)
    doctor = subparsers.add_parser("doctor", help="versions, paths, devices, engine checks")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(run=_doctor)
    bench = subparsers.add_parser("bench", help="benchmarks (see bench/)")
    benchmarks = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    from bench import kv

    kv.add_parser(benchmarks)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # the desktop window arrives with the GUI; until then, chat
        args = parser.parse_args(["chat", *(argv or sys.argv[1:])])
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
