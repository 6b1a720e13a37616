"""`stoke serve`: the OpenAI-compatible API on this machine, until Ctrl+C.

The key is best given with `--api-key-file` or STOKE_API_KEY: a key on the command line is
visible to every local user in `ps`, so `--api-key` works but draws a warning.
`--chat-template FILE` serves the model with another Jinja chat template than its own
(LoadOptions.chat_template), e.g. a newer one with tool calls or reasoning.

Every library model is served on demand (app/pool): a request naming one loads it within
`--budget`, unloading the least recently used; `--ttl` unloads idle models, `--pin` keeps one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import stat
import sys
from pathlib import Path

from app import paths
from app.cli import chat
from app.engine.host import EngineClient, EngineState
from app.engine.protocol import LoadOptions
from app.launch import LoadFlags, load_options_of, resolve_load_options
from app.models.library import Library, LibraryError, ModelEntry
from app.pool.engines import EnginePool
from app.pool.need import default_budget
from app.server import auth
from app.server.app import ApiServer
from app.server.requests import ServerConfig
from app.settings import Settings
from app.units import GIB, gib

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="an OpenAI-compatible API on this machine")
    chat.add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument(
        "--port", type=int, help="port (default: Settings > API Server's, 8484; 0: any free one)"
    )
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-key",
        metavar="KEY",
        help="the key clients must send (visible in `ps`: prefer --api-key-file or "
        f"{auth.ENV_VAR})",
    )
    keys.add_argument(
        "--api-key-file", metavar="PATH", type=Path, help="read the key from this file (mode 600)"
    )
    parser.add_argument(
        "--cors", metavar="ORIGIN", nargs="+", default=(), help="web origins allowed ('*': any)"
    )
    parser.add_argument("--max-in-flight", type=int, default=16, help="requests at once")
    parser.add_argument("--max-body-mib", type=float, default=8.0, help="largest request body")
    parser.add_argument("--max-connections", type=int, default=64, help="open connections")
    parser.add_argument(
        "--header-timeout",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="seconds to send a request's headers; idle connections close after it too",
    )
    parser.add_argument(
        "--body-timeout", type=_seconds, default=30.0, metavar="S", help="seconds to send a body"
    )
    parser.add_argument(
        "--strict-model",
        action="store_true",
        help="refuse (404) model names that are none of the library's, instead of serving "
        "them with the default model",
    )
    parser.add_argument(
        "--crash-backoff",
        type=_backoff,
        default=EngineClient.BACKOFF_S,
        metavar="S,S,...",
        help="when the engine keeps crashing, wait these seconds before each retry, then exit "
        "with status 1 so a supervisor can restart Stoke (default: 5,20,60)",
    )
    parser.add_argument(
        "--chat-template",
        metavar="FILE",
        type=Path,
        help="a Jinja chat template to use instead of the model's own",
    )
    parser.add_argument(
        "--budget",
        type=_gib,
        metavar="GIB",
        help="memory the library's models may fill at once; a request naming another model "
        "unloads the least recently used to make room (default: 85%% of RAM, plus the GPUs')",
    )
    parser.add_argument(
        "--ttl",
        type=_seconds,
        metavar="S",
        help="unload a model no request has used for this many seconds (default: keep it)",
    )
    parser.add_argument(
        "--pin", metavar="MODEL", help="a library model to load at once and never unload"
    )
    parser.add_argument("--show-key", action="store_true", help="print the API key and exit")
    parser.set_defaults(run=run)


def _backoff(text: str) -> tuple[float, ...]:
    try:
        waits = tuple(_seconds(part) for part in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of seconds above 0, such as 5,20,60"
        ) from None
    return waits


def _positive(text: str, unit: str) -> float:
    """A number above 0 from a flag, or the flag's error in words naming the unit."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit} above 0")
    return value


def _gib(text: str) -> int:
    """A budget in GiB, as bytes."""
    return int(_positive(text, "GiB") * GIB)


def _seconds(text: str) -> float:
    """A timeout in seconds; 0 would mean none to aiohttp, which is what the flags prevent."""
    return _positive(text, "seconds")


def run(args: argparse.Namespace) -> int:
    if args.api_key_file is not None:
        try:
            key = auth.resolve(_read_key_file(args.api_key_file), given_by="--api-key-file")
        except ValueError as exc:
            print(f"stoke: {exc}", file=sys.stderr)
            return 1
    else:
        if args.api_key:
            print(
                "Warning: a key given with --api-key is visible to every user of this machine "
                f"(`ps`); use --api-key-file PATH or {auth.ENV_VAR} instead.",
                file=sys.stderr,
            )
        key = auth.resolve(args.api_key)
    if args.show_key:
        if key.source == "memory":
            print(
                "stoke: there is no system keychain, so each `stoke serve` makes a new key; "
                f"choose one with --api-key or {auth.ENV_VAR}.",
                file=sys.stderr,
            )
            return 1
        print(key.value)
        return 0
    try:
        template = _read_template(args.chat_template) if args.chat_template else None
    except ValueError as exc:
        print(f"stoke: {exc}", file=sys.stderr)
        return 1
    config = ServerConfig(
        api_key=key.value,
        host=args.host,
        port=Settings.load().serve_port if args.port is None else args.port,
        cors_origins=tuple(args.cors),
        max_body_bytes=int(args.max_body_mib * (1 << 20)),
        max_in_flight=max(1, args.max_in_flight),
        max_connections=max(1, args.max_connections),
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        strict_model=args.strict_model,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_serve(args, config, key, template))
    return 0


def _pool(args: argparse.Namespace, options: LoadOptions) -> EnginePool:
    """The models this server answers with: every library model, each loaded when a request
    names it (a remote engine: that one alone). Raises ValueError or LibraryError in words."""

    def make_engine(model_options: LoadOptions) -> EngineClient:
        engine = EngineClient(
            model_options, log_path=paths.cache_dir() / "engine.log", backoff_s=args.crash_backoff
        )
        engine.add_notice_listener(
            lambda text: print(f"stoke: {text}", file=sys.stderr, flush=True)
        )
        return engine

    entries = [] if options.remote is not None else Library().listed()
    settings, flags = Settings.load(), LoadFlags.of(args)

    def options_for(entry: ModelEntry) -> LoadOptions:
        return resolve_load_options(str(entry.path), settings, flags)

    budget = args.budget if args.budget is not None else default_budget
    return EnginePool.of_library(
        entries, options, options_for, make_engine, budget=budget, ttl_s=args.ttl, pin=args.pin
    )


def _on_demand(pool: EnginePool) -> str:
    """One line on the models a request may name, and the rules they load by."""
    others = ", ".join(m.name for m in pool.models if m is not pool.default)
    line = f"Also on demand: {others}"
    if pool.budget is not None:  # else the machine's, asked at the first swap
        line += f"; within {gib(pool.budget)}, the least recently used unloaded to make room"
    if pool.ttl_s is not None:
        line += f"; unloaded after {pool.ttl_s:g} s idle"
    if pool.pin is not None:
        line += f"; {pool.pin} stays loaded"
    return line + "."


def _read_template(path: Path) -> str:
    """The template file's text; ValueError in words when it cannot be one."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"--chat-template: there is no file {path}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--chat-template: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"--chat-template: {path} cannot be read ({exc.strerror})") from None
    if not text.strip():
        raise ValueError(f"--chat-template: {path} is empty")
    return text


def _read_key_file(path: Path) -> str:
    """The key in `path` (surrounding whitespace dropped). Raises ValueError in words when it
    cannot be read or is empty; warns when other users may read it."""
    try:
        text = path.read_text("utf-8").strip()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise ValueError(f"cannot read the API key file {path}: {reason}.") from exc
    if not text:
        raise ValueError(f"the API key file {path} is empty.")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(
            f"Warning: other users of this machine may read the API key file {path}; "
            f"`chmod 600 {path}`.",
            file=sys.stderr,
        )
    return text


async def _serve(
    args: argparse.Namespace, config: ServerConfig, key: auth.ApiKey, template: str | None
) -> int:
    if args.model and not Path(args.model).expanduser().exists():
        with contextlib.suppress(LibraryError):  # else the load says the file is not there
            args.model = str(Library().get(args.model).path)  # a library model by name
    options = load_options_of(args)
    if template is not None:
        options = dataclasses.replace(options, chat_template=template)
    try:
        pool = _pool(args, options)
    except (ValueError, LibraryError) as exc:
        print(f"stoke: {exc}", file=sys.stderr)
        return 1
    server = ApiServer(pool, config)
    loading = asyncio.ensure_future(pool.start())
    await asyncio.sleep(0)  # the engine is starting: a request now waits for the model
    try:
        url = await server.start()  # the port first: a taken one fails before a long load
    except OSError as exc:
        loading.cancel()
        await pool.close()
        print(
            f"stoke: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}. "
            "Choose another port with --port.",
            file=sys.stderr,
        )
        return 1
    engine = pool.default.engine
    print(f"Loading {engine.options.model_path} ...", file=sys.stderr, flush=True)
    try:
        await loading
    except BaseException:
        await server.stop()
        await pool.close()
        raise
    # Ctrl+C from here on stops the server as a request would; before, asyncio.run's own
    # handler cancels the load. Set before "Serving": a script may send it on that line.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"Serving {server.model_id} at {url}", flush=True)
    if key.source == "keychain":
        print(f"{key.where} `stoke serve --show-key` prints it.", flush=True)
    else:
        print(key.where, flush=True)
    if key.source == "memory":  # nowhere else to read it from
        print(f"API key: {key.value}", flush=True)
    if config.host not in LOOPBACK:
        print(
            f"Warning: listening on {config.host}, beyond this machine; anyone with the key "
            "can use the model.",
            flush=True,
        )
    if len(pool.models) > 1:
        print(_on_demand(pool), flush=True)
    gave_up: list[str] = []

    def on_state(state: EngineState, detail: str) -> None:
        if state == EngineState.FAILED:  # the crash loop outlasted every back-off
            gave_up.append(detail)
            stop.set()

    engine.add_state_listener(on_state)
    try:
        await stop.wait()
    finally:
        print("Stopping ...", file=sys.stderr)
        await server.stop()
        await pool.close()
    if gave_up:
        print(f"stoke: {gave_up[0]} Exiting so a supervisor can restart it.", file=sys.stderr)
        return 1
    return 0
