"""One download's records and bytes: its progress, the state of each file and job (the
state file's rows), the SHA-256 taken while bytes stream, the writer that resumes a partial
file, and the progress hook huggingface_hub reports through."""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from huggingface_hub.utils import tqdm as hf_tqdm

_HASH_BLOCK = 8 << 20
SAMPLES = 512  # (time, bytes) points a job keeps for its speed


# --- progress and state -----------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """One download as the Downloads view shows it."""

    id: str
    repo: str
    state: str  # running | paused | done | failed | cancelled
    done_bytes: int
    total_bytes: int
    speed: float  # bytes per second over the last few seconds
    eta_s: float | None
    files_done: int
    files_total: int
    current: tuple[str, ...]
    destination: Path
    error: str | None
    quarantined: tuple[Path, ...]

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.total_bytes if self.total_bytes else 0.0


@dataclass
class FileState:
    name: str
    size: int | None
    sha256: str | None
    blob_id: str | None
    status: str = "pending"  # pending | done | failed | quarantined
    error: str | None = None
    quarantine: str | None = None
    have: int = 0  # bytes on disk, counted live

    def to_dict(self) -> dict[str, Any]:
        keys = ("name", "size", "sha256", "blob_id", "status", "error", "quarantine")
        return {k: getattr(self, k) for k in keys}


@dataclass
class JobState:
    id: str
    repo: str
    revision: str
    endpoint: str
    files: list[FileState]
    state: str = "running"
    error: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    idle: threading.Event = field(default_factory=threading.Event)
    active: int = 0
    cancelled: bool = False
    restart: bool = False  # resumed while paused transfers were still letting go
    lock_fd: int | None = None
    current: set[str] = field(default_factory=set)
    received: int = 0
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    reported: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "repo": self.repo,
            "revision": self.revision,
            "endpoint": self.endpoint,
            "state": self.state,
            "error": self.error,
            "files": [f.to_dict() for f in self.files],
        }


class Stopped(Exception):
    """Raised inside a transfer to stop it where it is (pause, cancel, quit)."""


class Digest:
    """The hash a file must match: LFS SHA-256, or the git blob id of a small file."""

    def __init__(self, file: FileState) -> None:
        self.file = file
        self.expected = file.sha256 or file.blob_id
        self.valid = True
        self.reset()

    def reset(self) -> None:
        if self.file.sha256:
            self._hash = hashlib.sha256()
        else:
            self._hash = hashlib.sha1(usedforsecurity=False)
            self._hash.update(f"blob {self.file.size}\0".encode())

    def update(self, data: bytes) -> None:
        self._hash.update(data)

    def feed_file(self, path: Path, limit: int | None = None) -> None:
        remaining = limit
        with path.open("rb") as fh:
            while remaining is None or remaining > 0:
                block = fh.read(_HASH_BLOCK if remaining is None else min(_HASH_BLOCK, remaining))
                if not block:
                    break
                self._hash.update(block)
                if remaining is not None:
                    remaining -= len(block)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


class PartWriter:
    """The file `http_get` writes into: counts and hashes what reaches the disk, and stops
    the transfer when asked, after the chunk is written so the next resume keeps it."""

    def __init__(
        self,
        fh: IO[bytes],
        digest: Digest,
        stop: threading.Event,
        on_bytes: Callable[[int], None],
    ) -> None:
        self._fh = fh
        self._digest = digest
        self._stop = stop
        self._on_bytes = on_bytes

    def write(self, data: bytes) -> int:
        written = self._fh.write(data)
        self._fh.flush()
        self._digest.update(data)
        self._on_bytes(len(data))
        if self._stop.is_set():
            raise Stopped
        return written

    def tell(self) -> int:
        return self._fh.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._fh.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        """The server ignored our Range and sent the whole file: start the hash over too."""
        before = os.fstat(self._fh.fileno()).st_size
        end = self._fh.truncate(size)
        self._on_bytes(end - before)
        if end == 0:
            self._digest.reset()
        else:
            self._digest.valid = False
        return end


def progress_meter(sink: Callable[[int], None]) -> type[hf_tqdm]:
    """A silent progress bar class for huggingface_hub that hands each update to `sink`
    (Xet downloads report through it; plain HTTP ones through `PartWriter`).

    It defines `update_transfer` so Xet reports bytes once (on the file), not twice."""

    class Meter(hf_tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            sink(int(n or 0))
            return super().update(n)

        def update_transfer(self, n: float | None = 1) -> None:
            """Network bytes; the file's own count is what Stoke shows."""

        def set_transfer_postfix_str(self, s: str = "", refresh: bool = True) -> None:
            """Nothing to show: the bar is disabled."""

    return Meter
