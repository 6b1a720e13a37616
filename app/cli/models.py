"""`stoke models ...`: the library, downloads, the catalog and the hub token from a terminal."""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.models import secrets
from app.models.library import Library, LibraryError, ModelEntry
from app.units import decimal_bytes, gib

if TYPE_CHECKING:  # downloads import huggingface_hub: only the commands that use it pay
    from app.models.downloads import Downloads, Progress

Command = Callable[[argparse.Namespace], int]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser("models", help="the model library, downloads and catalog")
    commands = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    def command(name: str, help: str, run: Command) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help)
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
        parser.set_defaults(run=lambda args: _guarded(run, args))
        return parser

    command("list", "models in the library, with total disk use", _list)
    info = command("info", "one model's metadata and load settings", _info)
    info.add_argument("model", help="id, name or path")
    imp = command("import", "bring a GGUF (any part of a split set) or MLX folder in", _import)
    imp.add_argument("path", type=Path)
    how = imp.add_mutually_exclusive_group()
    how.add_argument("--move", action="store_true", help="move instead of copying")
    how.add_argument("--link", action="store_true", help="link to it where it is")
    delete = command("delete", "delete a model's files and its KV snapshots", _delete)
    delete.add_argument("model", help="id, name or path")
    delete.add_argument("--yes", "-y", action="store_true", help="do not ask")
    rename = command("rename", "rename a model's file(s)", _rename)
    rename.add_argument("model", help="id, name or path")
    rename.add_argument("name", help="the new name")
    folders = command("folders", "library folders (models dir plus your own)", _folders)
    change = folders.add_mutually_exclusive_group()
    change.add_argument("--add", type=Path, metavar="DIR", help="also list models in DIR")
    change.add_argument("--remove", type=Path, metavar="DIR", help="stop listing DIR")
    download = command("download", "download from Hugging Face (or a catalog id)", _download)
    download.add_argument(
        "repo", nargs="?", help="owner/name, or an id from `stoke models catalog`"
    )
    download.add_argument("files", nargs="*", help="files to fetch (default: --quant's group)")
    download.add_argument("--quant", help="a quantization group, e.g. Q4_K_M")
    download.add_argument("--revision", help="branch, tag or commit (default: main)")
    download.add_argument("--list", action="store_true", help="list the repo's files, fetch none")
    download.add_argument("--resume", action="store_true", help="go on with interrupted downloads")
    command("catalog", "recommended models and whether they fit this machine", _catalog)
    command("login", "store a Hugging Face token (for gated models) in the keychain", _login)
    command("logout", "forget the stored Hugging Face token", _logout)


def _guarded(run: Command, args: argparse.Namespace) -> int:
    """Every library or hub failure ends as one line on stderr, not a traceback."""
    try:
        return run(args)
    except LibraryError as exc:
        print(f"stoke: {exc}", file=sys.stderr)
        return 1


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text)


def _count(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


def _describe(model: ModelEntry) -> str:
    lines = [
        f"{model.name}  ({model.format}{', linked' if model.linked else ''})",
        f"  id            {model.id}",
        f"  path          {model.path}",
        f"  architecture  {model.architecture or '-'}",
        f"  parameters    {_count(model.parameters)}",
        f"  quantization  {model.quantization or '-'}",
        f"  context       {model.context_length or '-'}",
        f"  size          {decimal_bytes(model.size_bytes)} in {len(model.files)} file(s)",
        f"  chat template {'yes' if model.chat_template else 'no'}",
    ]
    if model.expert_count:
        lines.append(f"  experts       {model.expert_count}")
    if model.projector is not None:
        lines.append(f"  reads images  with {model.projector}")
    return "\n".join(lines)


# --- the library ------------------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    library = Library()
    models = library.listed()
    total = library.total_size()
    for problem in library.problems:
        print(f"stoke: skipped: {problem.message}", file=sys.stderr)
    rows = [["NAME", "FORMAT", "ARCH", "PARAMS", "QUANT", "CTX", "SIZE", "ID"]]
    rows += [
        [
            m.name,
            m.format,
            m.architecture or "-",
            _count(m.parameters),
            m.quantization or "-",
            str(m.context_length or "-"),
            decimal_bytes(m.size_bytes),
            m.id,
        ]
        for m in models
    ]
    summary = f"{len(models)} model(s), {decimal_bytes(total)} on disk"
    data = {
        "models": [m.to_dict() for m in models],
        "total_bytes": total,
        "problems": [{"path": str(p.path), "message": p.message} for p in library.problems],
    }
    _emit(args, data, f"{_table(rows)}\n{summary}" if models else f"No models yet. {summary}")
    return 0


def _info(args: argparse.Namespace) -> int:
    library = Library()
    model = library.get(args.model)
    settings = library.load_settings(model.id)
    text = _describe(model)
    if settings:
        text += "\n  load settings " + json.dumps(settings)
    _emit(args, {**model.to_dict(), "load_settings": settings}, text)
    return 0


def _import(args: argparse.Namespace) -> int:
    mode = "move" if args.move else "link" if args.link else "copy"
    model = Library().import_model(args.path, mode)
    _emit(args, model.to_dict(), f"Imported.\n{_describe(model)}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    library = Library()
    model = library.get(args.model)
    if not args.yes:
        if not sys.stdin.isatty():
            raise LibraryError(f"Deleting {model.name} needs --yes when not run interactively.")
        what = "its link" if model.linked else f"{decimal_bytes(model.size_bytes)} of files"
        answer = input(f"Delete {model.name} ({what} and its KV snapshots)? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing deleted.")
            return 1
    library.delete(model.id)
    _emit(args, model.to_dict(), f"Deleted {model.name}.")
    return 0


def _rename(args: argparse.Namespace) -> int:
    model = Library().rename(args.model, args.name)
    _emit(args, model.to_dict(), f"Renamed to {model.name} ({model.path}).")
    return 0


def _folders(args: argparse.Namespace) -> int:
    library = Library()
    if args.add:
        library.add_folder(args.add)
    elif args.remove:
        library.remove_folder(args.remove)
    folders = library.folders()
    _emit(args, [str(f) for f in folders], "\n".join(str(f) for f in folders))
    return 0


# --- downloads and the catalog -------------------------------------------------------------------


def _progress_line(p: Progress) -> str:
    speed = f"{decimal_bytes(int(p.speed))}/s" if p.speed else "-"
    eta = f"{int(p.eta_s) // 60}m{int(p.eta_s) % 60:02d}s" if p.eta_s is not None else "-"
    return (
        f"{p.repo}: {decimal_bytes(p.done_bytes)} / {decimal_bytes(p.total_bytes)} "
        f"({p.fraction:.0%})  {speed}  ETA {eta}  files {p.files_done}/{p.files_total}"
    )


def _follow(manager: Downloads, job_ids: list[str], quiet: bool) -> list[Progress]:
    """Wait for downloads, printing progress; Ctrl-C pauses them for a later --resume."""
    try:
        while True:
            states = [manager.progress(j) for j in job_ids]
            if not quiet and sys.stderr.isatty():
                line = " | ".join(_progress_line(p) for p in states)
                print(f"\r{line[:200]}\033[K", end="", file=sys.stderr, flush=True)
            if all(p.state != "running" for p in states):
                break
            time.sleep(1)
    except KeyboardInterrupt:
        for job in job_ids:
            manager.pause(job)
        for job in job_ids:
            manager.wait(job)
        print("\nPaused; `stoke models download --resume` goes on from here.", file=sys.stderr)
    finally:
        if not quiet and sys.stderr.isatty():
            print(file=sys.stderr)
    return [manager.progress(j) for j in job_ids]


def _download(args: argparse.Namespace) -> int:
    from app.models.catalog import load_catalog
    from app.models.downloads import Downloads, list_repo

    if args.resume:
        manager = Downloads()
        jobs = manager.resume_pending()
        for p in manager.downloads():
            if p.state in ("paused", "failed"):
                manager.resume(p.id)
                jobs.append(p.id)
        if not jobs:
            _emit(args, [], "No interrupted downloads.")
            manager.shutdown()
            return 0
    else:
        if not args.repo:
            raise LibraryError("Name a repo (owner/name) or a catalog id, or use --resume.")
        repo, files, quant = args.repo, list(args.files), args.quant
        entry = next((e for e in load_catalog() if e.id == repo), None)
        if entry is not None:
            repo = entry.repo
            files = files or list(entry.files)
            quant = quant or (None if entry.files else entry.quant)
        if args.list:
            listing = list_repo(repo, revision=args.revision)
            rows = [["GROUP", "SIZE", "FILES"]] + [
                [g.key, decimal_bytes(g.size), ", ".join(f.name for f in g.files)]
                for g in listing.groups
            ]
            data = {
                "repo": listing.repo,
                "revision": listing.revision,
                "gated": listing.gated,
                "groups": [dataclasses.asdict(g) | {"size": g.size} for g in listing.groups],
            }
            _emit(args, data, _table(rows))
            return 0
        manager = Downloads()
        jobs = [manager.start(repo, files or None, quant=quant, revision=args.revision)]
    results = _follow(manager, jobs, args.json)
    manager.shutdown()
    data = [dataclasses.asdict(p) for p in results]
    lines = []
    for p in results:
        if p.state == "done":
            lines.append(f"Downloaded {p.repo} to {p.destination}.")
        else:
            lines.append(f"{p.repo}: {p.state}. {p.error or ''}".rstrip())
    _emit(args, data, "\n".join(lines))
    return 0 if all(p.state == "done" for p in results) else 1


def _catalog(args: argparse.Namespace) -> int:
    from app.hardware.detect import detect
    from app.models.catalog import PLAN_CONTEXT, assess, budget, load_catalog

    hardware = detect()
    room = budget(hardware)
    entries = load_catalog()
    fits = {e.id: assess(e, hardware) for e in entries}
    rows = [["ID", "NAME", "SIZE", "FIT", "SPEED"]] + [
        [
            e.id,
            e.name + ("" if e.checked else " *"),
            decimal_bytes(e.size_bytes),
            fits[e.id].verdict + (" †" if fits[e.id].basis == "planner" else ""),
            fits[e.id].speed or "-",
        ]
        for e in entries
    ]
    text = (
        f"{_table(rows)}\n"
        f"This machine: {gib(room.gpu_bytes)} GPU, {gib(room.ram_bytes)} RAM. "
        "* repo not checked against the hub.\n"
        f"† the offload planner's placement at {PLAN_CONTEXT:,} context (others: by size); "
        "`--json` has the detail.\n"
        "Download one with `stoke models download ID`."
    )
    data = [
        dataclasses.asdict(e)
        | {"verdict": fit.verdict, "speed": fit.speed, "basis": fit.basis, "detail": fit.detail}
        for e in entries
        for fit in (fits[e.id],)
    ]
    _emit(args, data, text)
    return 0


# --- the token ----------------------------------------------------------------------------------


def _login(args: argparse.Namespace) -> int:
    if sys.stdin.isatty():
        token = getpass.getpass("Hugging Face token (https://huggingface.co/settings/tokens): ")
    else:
        token = sys.stdin.readline()
    try:
        where = secrets.set_token(token)
    except ValueError as exc:
        raise LibraryError(str(exc)) from exc
    if not secrets.keychain_available():
        where += " For `stoke models download`, set HF_TOKEN in the environment instead."
    _emit(args, {"stored": secrets.keychain_available(), "message": where}, where)
    return 0


def _logout(args: argparse.Namespace) -> int:
    secrets.delete_token()
    _emit(args, {"stored": False}, "The Hugging Face token is forgotten.")
    return 0
