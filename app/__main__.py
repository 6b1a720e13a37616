"""The `stoke` command: no arguments starts the app; subcommands for the terminal."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app import paths, qt_check
from app.cli import bench, chat, dev, doctor, models, plan, serve, service
from app.conversations import StoreError
from app.engine.protocol import EngineError
from app.launch import load_options_of

# The subcommands, in the order `stoke --help` lists them: each module adds its parser.
COMMANDS = (chat, models, serve, service, doctor, bench, plan, dev)


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
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def _gui(args: argparse.Namespace) -> int:
    """No subcommand: the desktop app (or, with no display, the terminal chat)."""
    from app.ui.app import display_available, run_gui, screenshot

    options = load_options_of(args)
    if args.screenshot:
        return screenshot(
            options, Path(args.screenshot), conversation=args.conversation, theme=args.theme
        )
    if not display_available():
        print(
            "stoke: no display found; starting the terminal chat (`stoke chat`).", file=sys.stderr
        )
        return chat.run(build_parser().parse_args(["chat", *sys.argv[1:]]))
    problem = qt_check.window_problem()  # before Qt, whose plugin failure aborts the process
    if problem is not None:
        print(f"stoke: {problem}", file=sys.stderr)
        if not _yes("Start the terminal chat now? [Y/n] "):
            return 1
        return chat.run(build_parser().parse_args(["chat", *sys.argv[1:]]))
    return run_gui(options, conversation=args.conversation)


def _yes(question: str) -> bool:
    """Asked only of a person at a terminal; a script gets no as the answer."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    print(question, end="", file=sys.stderr, flush=True)
    try:
        return input().strip().lower() in ("", "y", "yes")
    except EOFError:
        return False


def _writes(args: argparse.Namespace) -> bool:
    """Whether the command saves anything in Stoke's folders (the rest only read them)."""
    if args.command is None or args.command == "bench":
        return True
    if args.command == "chat":
        return not args.list
    if args.command == "serve":
        return not args.show_key
    if args.command == "models":
        action = args.models_command
        return (
            action in ("import", "delete", "rename")
            or (action == "download" and not args.list)
            or (action == "folders" and bool(args.add or args.remove))
        )
    return False  # doctor, plan, dev


def _read_only(args: argparse.Namespace) -> int | None:
    """With a read-only folder, a command that writes stops with words (exit 1) and one that
    only reads goes on after a note; None when every folder can be written."""
    found = paths.read_only_folders()
    if not found:
        return None
    if not _writes(args):
        text = paths.read_only_text(found)
        print(f"stoke: note: {text}: showing what is there, saving nothing.", file=sys.stderr)
        return None
    message = paths.read_only_message(found)
    if getattr(args, "json", False):
        print(json.dumps({"error": message, "kind": "ReadOnlyError"}, ensure_ascii=False))
    else:
        print(f"stoke: {message}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    paths.start_private()
    parser = build_parser()
    args = parser.parse_args(argv)
    refused = _read_only(args)
    if refused is not None:
        return refused
    try:
        return _gui(args) if args.command is None else args.run(args)
    except (EngineError, StoreError, paths.ReadOnlyError) as exc:  # words, never a traceback
        print(f"stoke: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
