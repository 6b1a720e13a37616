"""`stoke chat`: an interactive terminal chat, and one-shot JSON turns for scripts; with MCP
servers in mcp.json (or named by `--tools`), a turn may call their tools, each asked about on
the terminal first (chat_tools.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Iterator

from app import paths
from app.cli.chat_tools import TerminalTools, add_arguments, chosen_servers
from app.conversations import Conversation, ConversationStore, StoreError
from app.engine.choice import CHOICES
from app.engine.host import EngineClient, EngineCrashedError
from app.engine.prewarm import Prewarmer
from app.engine.protocol import (
    ContextOverflowError,
    EngineError,
    GenerationStats,
    TokenEvent,
)
from app.engine.remote import MODES
from app.launch import load_options_of
from app.models.names import model_name
from app.session import ChatSession, MessageTooLongError, ReplyNotSavedError, TurnResult
from app.tool_loop import RoundDone, ToolLoop, ToolTurn

HELP = """Commands:
  /new              start a new conversation
  /list             list conversations
  /open ID          continue a conversation (an id prefix is enough)
  /regen            regenerate the last reply (a new branch)
  /edit TEXT        replace your last message with TEXT and resend (a new branch)
  /system TEXT      set this conversation's system prompt (/system alone clears it)
  /drop             drop the oldest turns when the conversation outgrows the context
  /help             this help
  /quit             leave (Ctrl+D works too); Ctrl+C stops a reply"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("chat", help="chat in the terminal, or send one message")
    add_model_arguments(parser)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--new", action="store_true", help="start a new conversation")
    which.add_argument("--conversation", "-c", metavar="ID", help="continue this conversation")
    parser.add_argument("--message", "-m", metavar="TEXT", help="send one message and exit")
    parser.add_argument("--json", action="store_true", help="print the reply and stats as JSON")
    parser.add_argument("--system", metavar="TEXT", help="system prompt of a new conversation")
    parser.add_argument("--temperature", type=float, help="sampling temperature (0: greedy)")
    parser.add_argument("--seed", type=int, help="sampling seed")
    parser.add_argument("--max-tokens", type=int, help="longest reply, in tokens")
    parser.add_argument(
        "--drop-oldest",
        action="store_true",
        help="when the conversation outgrows the context, leave out its oldest turns",
    )
    parser.add_argument("--list", action="store_true", help="list conversations and exit")
    add_arguments(parser)
    parser.set_defaults(run=run)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", metavar="PATH", help="a GGUF file or MLX folder (default: SmolLM2-135M)"
    )
    parser.add_argument("--ctx", type=int, metavar="N", help="context size in tokens")
    parser.add_argument(
        "--engine",
        choices=(*CHOICES, "remote"),
        help="where the model runs (default: the model's or the app's setting, else auto: "
        "MLX on Apple Silicon, llama.cpp elsewhere)",
    )
    parser.add_argument("--remote-url", metavar="URL", help="an OpenAI-compatible server")
    parser.add_argument("--remote-model", metavar="ID", help="the server's model id")
    parser.add_argument("--remote-mode", choices=MODES, help="how to talk to it (default: auto)")
    parser.add_argument(
        "--remote-tokenizer",
        metavar="PATH",
        help="a local GGUF of the served model, for exact token prompts",
    )


class UserError(Exception):
    """A problem the user can fix; printed as one line, never a traceback."""


def run(args: argparse.Namespace) -> int:
    try:
        if args.list and paths.read_only_folders():  # only reads: nothing to lease or repair
            with ConversationStore.open_read_only() as store:
                _print_list(store)
                return 0
        with ConversationStore.open() as store:
            for notice in store.notices:
                _warn(notice)
            if args.list:
                _print_list(store)
                return 0
            return asyncio.run(_run(args, store))
    except (StoreError, EngineError, UserError) as exc:
        return _fail(args, exc)
    except KeyboardInterrupt:
        return 130


async def _run(args: argparse.Namespace, store: ConversationStore) -> int:
    client = EngineClient(load_options_of(args), log_path=paths.cache_dir() / "engine.log")
    if not args.json:  # --json carries them in its output instead
        client.add_notice_listener(_warn)
    session = ChatSession(store, client)
    conversation = _pick_conversation(args, store)
    servers = chosen_servers(args, _warn)
    can_ask = sys.stdin.isatty() or not args.json  # a script's pipe may answer; --json alone not
    tools = TerminalTools(servers, args, can_ask=can_ask, on_round=_print_round, warn=_warn)
    try:
        async with tools:
            loop = tools.loop(session) if servers else None
            if args.message is None and not sys.stdin.isatty() and not args.json:
                args.message = sys.stdin.read()
            if args.message is not None and loop is not None:
                turn = await loop.send(
                    conversation.id, args.message, on_token=None if args.json else _echo
                )
                _print_turn(args, turn, tools, client.notices)
                return 0 if turn.stopped is None else 1
            if args.message is not None:  # the session starts the engine once this is saved
                result = await session.send(
                    conversation.id,
                    args.message,
                    drop_oldest=args.drop_oldest,
                    on_token=None if args.json else _echo,
                )
                _print_result(args, result, client.notices)
                return 0 if result.status == "complete" else 1
            return await _interactive(session, conversation, args, loop)
    finally:
        await client.close()


def _pick_conversation(args: argparse.Namespace, store: ConversationStore) -> Conversation:
    if args.conversation:
        conversation = store.get_conversation(args.conversation)
    elif args.new or args.message is not None:
        conversation = store.create_conversation(system_prompt=args.system)
    else:
        conversation = store.most_recent() or store.create_conversation(system_prompt=args.system)
    sampling = dict(conversation.sampling)
    for key, value in (
        ("temperature", args.temperature),
        ("seed", args.seed),
        ("max_tokens", args.max_tokens),
    ):
        if value is not None:
            sampling[key] = value
    if sampling != conversation.sampling:
        store.set_sampling(conversation.id, sampling)
    return store.get_conversation(conversation.id)


async def _interactive(
    session: ChatSession,
    conversation: Conversation,
    args: argparse.Namespace,
    tools: ToolLoop | None,
) -> int:
    store = session.store
    print(f"Loading {session.engine.options.model_path} …", file=sys.stderr)
    info = await session.engine.start()
    name = model_name(info.path) if session.engine.options.model_path else info.name
    print(f"{name} · {info.backend} · context {info.n_ctx:,} tokens. /help for commands.")
    _show_history(store, conversation)
    prewarm = Prewarmer(session)
    await prewarm.startup(conversation.id)  # restored from disk while the first line is typed
    try:
        return await _repl(session, conversation, prewarm, tools, drop_oldest=args.drop_oldest)
    finally:
        prewarm.cancel()
        await prewarm.idle()


async def _repl(
    session: ChatSession,
    conversation: Conversation,
    prewarm: Prewarmer,
    tools: ToolLoop | None,
    *,
    drop_oldest: bool,
) -> int:
    """Read a line, act on it, until /quit or end of input. With `tools`, a message's turn
    runs through the tool loop (/regen and /edit stay plain replies)."""
    store = session.store
    loop = asyncio.get_running_loop()
    while True:
        try:
            line = await loop.run_in_executor(None, input, "\n> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        command, _, rest = line.strip().partition(" ")
        try:
            if command in ("/quit", "/exit"):
                return 0
            if command == "/help":
                print(HELP)
            elif command == "/new":
                prewarm.switch_away(conversation.id)
                conversation = store.create_conversation()
                print(f"New conversation {conversation.id[:8]}.")
            elif command == "/list":
                _print_list(store)
            elif command == "/open":
                opened = store.get_conversation(rest.strip())
                prewarm.switch_away(conversation.id)
                conversation = opened
                prewarm.open(conversation.id)
                _show_history(store, conversation)
            elif command == "/system":
                store.set_system_prompt(conversation.id, rest.strip() or None)
                conversation = store.get_conversation(conversation.id)
                print("System prompt set." if rest.strip() else "System prompt cleared.")
            elif command == "/drop":
                drop_oldest = True
                print("Oldest turns will be left out when the context is full.")
            elif command in ("/regen", "/edit"):
                last = _last_of(store, conversation, "assistant" if command == "/regen" else "user")
                prewarm.cancel(conversation.id)
                with _cancel_on_ctrl_c(session):
                    if command == "/regen":
                        result = await session.regenerate(
                            last, drop_oldest=drop_oldest, on_token=_echo
                        )
                    else:
                        result = await session.edit(
                            last, rest, drop_oldest=drop_oldest, on_token=_echo
                        )
                _print_stats(result)
                prewarm.after_reply(conversation.id)
            elif command.startswith("/"):
                print(f"Unknown command {command}. /help lists them.")
            elif line.strip() and tools is not None:
                prewarm.cancel(conversation.id)
                with _cancel_on_ctrl_c(session):
                    turn = await tools.send(conversation.id, line, on_token=_echo)
                if turn.stopped is not None:
                    print(f"\n[{turn.stopped}]")
                prewarm.after_reply(conversation.id)
            elif line.strip():
                prewarm.cancel(conversation.id)
                with _cancel_on_ctrl_c(session):
                    result = await session.send(
                        conversation.id, line, drop_oldest=drop_oldest, on_token=_echo
                    )
                _print_stats(result)
                prewarm.after_reply(conversation.id)
        except MessageTooLongError as exc:  # /drop cannot help a message too long alone
            print(f"\n{exc}")
        except ContextOverflowError as exc:
            print(f"\n{exc}\nType /drop to leave out the oldest turns, or /new to start anew.")
        except EngineCrashedError as exc:
            print(f"\n[{exc} Your partial reply was kept, marked interrupted.]")
        except (StoreError, EngineError, UserError) as exc:
            print(f"\n{exc}")
        conversation = store.get_conversation(conversation.id)


@contextlib.contextmanager
def _cancel_on_ctrl_c(session: ChatSession) -> Iterator[None]:
    """While a reply streams, Ctrl+C stops it (the reply is kept) instead of quitting."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, session.cancel)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _last_of(store: ConversationStore, conversation: Conversation, role: str) -> str:
    for message in reversed(store.current_path(conversation.id)):
        if message.role == role:
            return message.id
    raise UserError(
        "There is no reply to regenerate yet."
        if role == "assistant"
        else "There is no message of yours to edit yet."
    )


def _show_history(store: ConversationStore, conversation: Conversation) -> None:
    path = store.current_path(conversation.id)
    title = conversation.title or "new conversation"
    print(f"— {title} ({conversation.id[:8]}, {len(path)} messages) —")
    for message in path[-6:]:
        who = {"user": "you", "tool": f"result of {message.tool_name or 'a tool'}"}.get(
            message.role, "stoke"
        )
        mark = " [interrupted]" if message.status == "interrupted" else ""
        calls = "".join(f" [called {call.name}]" for call in message.tool_calls)
        print(f"{who}: {message.content}{calls}{mark}")


def _print_list(store: ConversationStore) -> None:
    conversations = store.list_conversations()
    if not conversations:
        print("No conversations yet. `stoke chat` starts one.")
    for c in conversations:
        pin = "*" if c.pinned else " "
        print(f"{pin} {c.id[:8]}  {c.title or '(untitled)'}")


def _echo(event: TokenEvent) -> None:
    sys.stdout.write(event.text)
    sys.stdout.flush()


def _print_stats(result: TurnResult) -> None:
    note = " [stopped]" if result.status == "interrupted" else ""
    if result.stats is None:
        print(note)
        return
    dropped = f" · left out {result.dropped_turns} old messages" if result.dropped_turns else ""
    print(f"{note}\n  {_stats_line(result.stats)}{dropped}", file=sys.stderr)


def _print_round(done: RoundDone) -> None:
    """A tool turn's round is in: its stats (each round after the first prefills only what
    is new: the results and the template's glue)."""
    if done.stats is not None:
        print(f"\n  round {done.round}: {_stats_line(done.stats)}", file=sys.stderr)


def _stats_line(stats: GenerationStats) -> str:
    kept = stats.acceptance  # None: nothing drafted (speculation off, or never worth a guess)
    drafts = f" · drafts {kept:.0%} accepted" if kept is not None else ""
    return (
        f"ttft {stats.ttft_s:.2f} s · reused {stats.reused_tokens:,} of "
        f"{stats.prompt_tokens:,} prompt tokens · prefilled {stats.prefilled_tokens:,} · "
        f"{stats.decode_tok_s:.1f} tok/s{drafts}"
    )


def _print_result(args: argparse.Namespace, result: TurnResult, notices: list[str]) -> None:
    if args.json:
        output = result.as_dict()
        if notices:
            output["notices"] = notices
        print(json.dumps(output, ensure_ascii=False))
    else:
        print()
        _print_stats(result)


def _print_turn(
    args: argparse.Namespace, turn: ToolTurn, tools: TerminalTools, notices: list[str]
) -> None:
    """A one-shot tool turn's end: with --json its last reply as a plain turn's, with every
    round's reply, every call and why it stopped early (None: the model answered)."""
    if args.json:
        output = turn.replies[-1].as_dict() if turn.replies else {}
        output.update(
            conversation_id=turn.conversation_id,
            rounds=[reply.as_dict() for reply in turn.replies],
            tool_calls=tools.calls,
            stopped=turn.stopped,
        )
        if notices:
            output["notices"] = notices
        print(json.dumps(output, ensure_ascii=False))
    else:
        print()
        if turn.stopped is not None:
            print(f"[{turn.stopped}]", file=sys.stderr)


def _fail(args: argparse.Namespace, exc: Exception) -> int:
    if getattr(args, "json", False):
        error: dict[str, object] = {"error": str(exc), "kind": type(exc).__name__}
        if isinstance(exc, ContextOverflowError):
            error.update(prompt_tokens=exc.prompt_tokens, n_ctx=exc.n_ctx)
        if isinstance(exc, ReplyNotSavedError):  # this process ends: hand the text over
            error["reply"] = exc.reply
        print(json.dumps(error, ensure_ascii=False))
    else:
        print(f"stoke: {exc}", file=sys.stderr)
    return 1


def _warn(message: str) -> None:
    print(f"stoke: {message}", file=sys.stderr)
