"""Every on-disk location Stoke uses, from platformdirs, kept private to the user.

`STOKE_HOME` (one folder for data, cache and config) exists for tests and portable installs.
A frozen bundle (packaging/: the .deb's /opt/stoke, the tarball, Stoke.app) uses the same
user folders: only code and the bundled model live in the bundle, which `bundle_dir` names.

What Stoke keeps (token ids of every conversation, the database, logs, settings) is readable
text to anyone who can open it, so `stoke` runs with umask 077 (`start_private`: every file
and folder it or its engine creates is 0600 / 0700, whoever writes it: SQLite, the log), and
the first time a process uses one of its folders, everything under it that is wider is
narrowed to that (symlinks, e.g. linked models, are left alone). A folder that cannot be
created raises `ReadOnlyError`, whose message says so in words.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import platformdirs

APP_NAME = "stoke"
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
DATABASE_NAME = "conversations.db"
_ROOTS = ("data", "cache", "config")
_READ_ONLY = {errno.EROFS, errno.EACCES, errno.EPERM}
_secured: set[Path] = set()


class ReadOnlyError(Exception):
    """One of Stoke's folders cannot be written; the message names it and what to do."""


def _root(kind: str) -> Path:
    home = os.environ.get("STOKE_HOME")
    if home:
        return Path(home) / kind
    if kind == "data":
        return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    if kind == "cache":
        return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def read_only_text(found: list[tuple[str, Path]]) -> str:
    """The sentence start "Stoke's data folder X is read-only", for one or more folders."""
    where = ", ".join(f"{kind} folder {folder}" for kind, folder in found)
    return f"Stoke's {where} {'is' if len(found) == 1 else 'are'} read-only"


def read_only_message(found: list[tuple[str, Path]]) -> str:
    """The words for a command that needs to save in folders Stoke cannot write."""
    return (
        f"{read_only_text(found)}, so nothing can be saved there. Make "
        f"{'it' if len(found) == 1 else 'them'} writable, or set STOKE_HOME to a writable "
        "folder; `stoke chat --list`, `stoke models list` and `stoke doctor` still work."
    )


def ensure_dir(path: Path, kind: str) -> Path:
    """`path` as a private folder, created if missing (parents above Stoke's roots as the
    system makes them); ReadOnlyError names the `kind` folder that cannot be written."""
    if not path.is_dir():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir(mode=PRIVATE_DIR, exist_ok=True)
        except OSError as exc:
            if exc.errno in _READ_ONLY:
                raise ReadOnlyError(read_only_message([(kind, _existing(path))])) from exc
            raise
    return path


def _root_dir(kind: str, create: bool) -> Path:
    root = _root(kind)
    if create:
        ensure_dir(root, kind)
    if root.is_dir() and root not in _secured:
        _secured.add(root)
        secure_tree(root)
    return root


def secure_tree(root: Path) -> None:
    """Narrow `root` and everything under it to 0700 folders and 0600 files.

    Best effort: what cannot be changed (a read-only disk, another user's file) stays as it is,
    and the read-only check reports the disk in words.
    """
    _narrow(root, PRIVATE_DIR)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            _narrow(Path(dirpath, name), PRIVATE_DIR)
        for name in filenames:
            _narrow(Path(dirpath, name), PRIVATE_FILE)


def _narrow(path: Path, mode: int) -> None:
    try:
        st = path.lstat()
        if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & ~mode:
            path.chmod(stat.S_IMODE(st.st_mode) & mode)
    except OSError:
        pass


def _existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists: where a write would land first."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def start_private() -> None:
    """Make what this process (and the engine it starts) creates private, and narrow what an
    older version left wider. Called first thing by `stoke`."""
    os.umask(0o077)
    for kind in _ROOTS:
        _root_dir(kind, create=False)


def read_only_folders() -> list[tuple[str, Path]]:
    """Which of Stoke's folders ("data", "cache", "config") cannot be written, and where: the
    folder, or its nearest existing parent when it is still to be created."""
    found = []
    for kind in _ROOTS:
        folder = _existing(_root(kind))
        if not os.access(folder, os.W_OK | os.X_OK):
            found.append((kind, folder))
    return found


def write_private(
    path: Path, data: str | bytes | Sequence[bytes], *, mtime_ns: int | None = None
) -> None:
    """Replace `path` with `data` (0600) through a temp file and a rename, so a crash or a
    full disk never leaves half a file and the old one stays until the new one is complete;
    the folder is synced too, so the rename itself survives a power cut. `data` may be parts
    (a KV snapshot's header, tokens and payload) written one after another; `mtime_ns` stamps
    the file before it appears."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    chunks = [data] if isinstance(data, bytes) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:  # large parts (a KV snapshot) written as they are, not joined
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        if mtime_ns is not None:
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # folders cannot be opened everywhere (Windows)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def keep_aside(path: Path) -> Path:
    """Move a damaged file to `NAME.damaged` (then `.damaged-2`, `-3`, ...), never over an
    earlier copy, and return where it went. A hard link first, so two processes racing
    cannot both take one name."""
    for n in range(1, 10_000):
        target = path.with_name(f"{path.name}.damaged" + (f"-{n}" if n > 1 else ""))
        try:
            os.link(path, target)
        except FileExistsError:
            continue
        except OSError as exc:  # no hard links here (e.g. FAT): rename onto a free name
            if exc.errno in (errno.EROFS, errno.EACCES) or target.exists():
                raise
            os.replace(path, target)
            return target
        path.unlink()
        return target
    raise FileExistsError(f"too many damaged copies of {path}")


def bundle_dir() -> Path | None:
    """The installed bundle Stoke runs from (the folder holding the `stoke` executable, or
    the enclosing `Stoke.app` on macOS), or None when it runs from a Python installation."""
    if not getattr(sys, "frozen", False):
        return None
    folder = Path(sys.executable).resolve().parent
    app = next((p for p in folder.parents if p.suffix == ".app"), None)
    return app or folder


def data_dir(create: bool = True) -> Path:
    return _root_dir("data", create)


def cache_dir(create: bool = True) -> Path:
    return _root_dir("cache", create)


def config_dir(create: bool = True) -> Path:
    return _root_dir("config", create)


def database_path() -> Path:
    """The conversation store (SQLite, WAL)."""
    return data_dir() / DATABASE_NAME


def kv_dir(fingerprint: str) -> Path:
    """KV snapshots of one model."""
    kv = ensure_dir(cache_dir() / "kv", "cache")
    return ensure_dir(kv / fingerprint, "cache")


def models_dir(create: bool = True) -> Path:
    models = data_dir(create) / "models"
    return ensure_dir(models, "data") if create else models
