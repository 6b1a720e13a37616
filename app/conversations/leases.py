"""Per-process leases on a conversation database: who is writing, and whether it still lives.

A streaming reply and a turn in progress carry the id of the lease of the process writing
them. Each open store holds one lease: a file in `<database>.leases/`, flock'd for as long as
the store is open. The kernel drops the lock when the process ends however it ends (kill -9
included), so a lease whose file is missing or can be locked belongs to a writer that is gone.
A pid alone would not do: pids are reused, a held lock is not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import uuid
from pathlib import Path

_LEASE_ID = re.compile(r"(\d+)-[0-9a-f]{12}")


def folder_of(database: Path) -> Path:
    return database.with_name(database.name + ".leases")


class Lease:
    """This process's hold on one database, for as long as the store is open."""

    def __init__(self, folder: Path, lease_id: str, fd: int) -> None:
        self.folder = folder
        self.id = lease_id
        self._fd = fd

    @classmethod
    def take(cls, database: Path) -> Lease | None:
        """A new lease, or None where the folder cannot be written (a read-only data folder
        can still be read; such a store marks nothing as its own)."""
        folder = folder_of(database)
        lease_id = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(folder / lease_id, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_EX)  # a fresh file nobody else knows of: never blocks
        return cls(folder, lease_id, fd)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.folder / self.id)
        os.close(self._fd)


def is_alive(folder: Path, lease_id: str) -> bool:
    """Whether the process holding `lease_id` still runs. A checker takes only a shared lock,
    so two checkers never see each other as the living owner."""
    if not _LEASE_ID.fullmatch(lease_id):
        return False
    path = folder / lease_id
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: never treat a writer as gone on a guess
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        path.unlink()  # its owner is gone; nobody will take this id again
    return False


def others_alive(folder: Path, own: Lease | None) -> bool:
    """Whether any other process has this database open (through a Stoke store)."""
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return False
    return any(is_alive(folder, name) for name in names if own is None or name != own.id)


def pid_of(lease_id: str) -> int | None:
    match = _LEASE_ID.fullmatch(lease_id)
    return int(match.group(1)) if match else None
