"""The `stoke` command: no arguments starts the app; subcommands for the terminal."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.cli import chat
from app.conversations import StoreError
from app.engine.protocol import EngineError
from app.models import cli as models_cli
from app.server import cli as serve_cli


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
    chat.add_model_arguments(parser)
    parser.add_argument("--conversation", metavar="ID", help="open this conversation")
    parser.add_argument("--screenshot", metavar="PATH", help="render the window to a PNG, exit")
    parser.add_argument("--theme", choices=("light", "dark"), help="with --screenshot")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    chat.add_parser(subparsers)
    models_cli.add_parser(subparsers)
    serve_cli.add_parser(subparsers)
    doctor = subparsers.add_parser("doctor", help="versions, paths, devices, engine checks")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(run=_doctor)
    bench = subparsers.add_parser("bench", help="benchmarks (see bench/)")
    benchmarks = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    from app.hardware import plan_cli
    from bench import kv, ui_stall
    from bench import serve as serve_bench

    plan_cli.add_parser(subparsers)

    kv.add_parser(benchmarks)
    ui_stall.add_parser(benchmarks)
    serve_bench.add_parser(benchmarks)
    dev = subparsers.add_parser("dev", help="developer tools")
    tools = dev.add_subparsers(dest="tool", metavar="TOOL", required=True)
    from app.hardware import synthetic_gguf

    synthetic_gguf.add_parser(tools)
    return parser


def _gui(args: argparse.Namespace) -> int:
    """No subcommand: the desktop app (or, with no display, the terminal chat)."""
    from app.ui.app import display_available, run_gui, screenshot

    options = chat.load_options(args)
    if args.screenshot:
        return screenshot(
            options, Path(args.screenshot), conversation=args.conversation, theme=args.theme
        )
    if not display_available():
        print(
            "stoke: no display found; starting the terminal chat (`stoke chat`).", file=sys.stderr
        )
        return chat.run(build_parser().parse_args(["chat", *sys.argv[1:]]))
    return run_gui(options, conversation=args.conversation)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _gui(args) if args.command is None else args.run(args)
    except (EngineError, StoreError) as exc:  # any command: words, never a traceback
        print(f"stoke: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
