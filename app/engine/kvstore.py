"""KV-cache snapshots of engine sequences, in RAM and on disk, so a follow-up turn restores
the conversation's prefix instead of prefilling it again.

Engine-agnostic: a snapshot is the token ids it covers plus whatever bytes the engine's state
API produced. The engine process owns one store per loaded model and calls it from one
thread; disk writes run on a writer thread inside the store, so a multi-gigabyte snapshot
never stalls a turn. Files are a cache: one that fails any check is deleted, never trusted.

File layout (little-endian): magic b"STKV", format version (u16), engine tag, model
fingerprint and key (each a u16 length + utf-8), token count (u32), sha256 of the token bytes,
sha256 of the payload, payload length (u64); then the tokens as uint32; then the payload. The
engines open their stores under `model_file.weights_id` as the fingerprint, so a file made
from other weights that share the model's fingerprint fails the check like any other.

A replacement is written in full beside the old file and renamed over it, so a write that fails
(a full disk, the budget) leaves the previous snapshot of the key on disk and in the index.
Anything else found where a snapshot file belongs (a folder, a broken link) is removed like
any other bad snapshot.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import operator
import os
import queue
import shutil
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from app import paths

logger = logging.getLogger("stoke.kvstore")

MAGIC = b"STKV"
SUFFIX = ".kv"
TMP_SUFFIX = ".tmp"
_PREFIX = struct.Struct("<4sH")
_LENGTH = struct.Struct("<H")
_COUNTS = struct.Struct("<I32s32sQ")
_TOKEN_SIZE = 4
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@dataclass(frozen=True)
class Match:
    """Where the longest cached prefix of a query lives; hand it back to `KVStore.load`."""

    key: str
    tier: str
    common: int
    n_tokens: int


@dataclass(frozen=True)
class Snapshot:
    key: str
    tokens: tuple[int, ...]
    payload: bytes


class _Rejected(Exception):
    """A snapshot file failed a check; the message says which."""


@dataclass(frozen=True)
class _Header:
    engine: str
    fingerprint: str
    key: str
    n_tokens: int
    tokens_sha: bytes
    payload_sha: bytes
    payload_len: int

    def pack(self, version: int) -> bytes:
        parts = [_PREFIX.pack(MAGIC, version)]
        for text in (self.engine, self.fingerprint, self.key):
            raw = text.encode()
            parts += [_LENGTH.pack(len(raw)), raw]
        parts.append(
            _COUNTS.pack(self.n_tokens, self.tokens_sha, self.payload_sha, self.payload_len)
        )
        return b"".join(parts)

    @classmethod
    def read(cls, f: BinaryIO, version: int) -> _Header:
        """Parse the header; stop at a foreign magic or version, whose layout is unknown."""
        magic, found = _PREFIX.unpack(_read_exact(f, _PREFIX.size))
        if magic != MAGIC:
            raise _Rejected("bad magic")
        if found != version:
            raise _Rejected(f"format version {found}, expected {version}")
        try:
            engine, fingerprint, key = (_read_text(f) for _ in range(3))
        except UnicodeDecodeError as exc:
            raise _Rejected("header text is not utf-8") from exc
        return cls(engine, fingerprint, key, *_COUNTS.unpack(_read_exact(f, _COUNTS.size)))


@dataclass
class _DiskEntry:
    path: Path
    token_bytes: bytes
    size: int
    stamp: int  # mtime in ns: the recency that disk eviction orders by


@dataclass(frozen=True)
class _RamEntry:
    snapshot: Snapshot
    token_bytes: bytes
    size: int


@dataclass(frozen=True)
class _Write:
    key: str
    seq: int
    token_bytes: bytes
    payload: bytes


@dataclass(frozen=True)
class _Delete:
    key: str
    seq: int


class KVStore:
    """Snapshots of one model: an LRU RAM tier plus one verified file per key on disk.

    One snapshot per key (keys name conversations or slots). `best` matches against an
    in-memory index and never touches the disk; `load` verifies every disk read.
    """

    FORMAT_VERSION = 1

    def __init__(
        self,
        fingerprint: str,
        engine: str,
        *,
        ram_budget: int = 2 << 30,
        disk_budget: int = 20 << 30,
        directory: Path | None = None,
    ) -> None:
        self.fingerprint = fingerprint
        self.engine = engine
        self.ram_budget = ram_budget
        self.disk_budget = disk_budget
        self.directory = directory if directory is not None else paths.kv_dir(fingerprint)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._ram: OrderedDict[str, _RamEntry] = OrderedDict()
        self._ram_bytes = 0
        self._disk: dict[str, _DiskEntry] = {}
        # Each put/discard bumps `_seq`; the writer skips jobs a later call for the key superseded.
        self._seq = 0
        self._latest: dict[str, int] = {}
        self._last_stamp = 0
        self._closed = False
        self._scan()
        self._evict_disk(keep=None)
        self._jobs: queue.Queue[_Write | _Delete | None] = queue.Queue()
        self._writer = threading.Thread(
            target=self._run_writer, name=f"kvstore-writer-{fingerprint[:12]}", daemon=True
        )
        self._writer.start()

    # -- caller's thread ------------------------------------------------------------------

    def put(self, key: str, tokens: Sequence[int], payload: bytes, *, to_disk: bool = True) -> None:
        """Keep `payload` as the snapshot of `key` covering `tokens`, replacing the old one.

        RAM now; the disk write is queued (with `to_disk=False` the old file is deleted).
        """
        token_tuple = tuple(map(operator.index, tokens))
        token_bytes = _pack_tokens(token_tuple)
        payload = bytes(payload)
        with self._lock:
            if self._closed:
                raise RuntimeError("KVStore is closed")
            seq = self._supersede(key)
            self._ram_insert(Snapshot(key, token_tuple, payload), token_bytes)
        self._jobs.put(_Write(key, seq, token_bytes, payload) if to_disk else _Delete(key, seq))

    def best(self, tokens: Sequence[int]) -> Match | None:
        """The snapshot sharing the longest token prefix with `tokens`; RAM wins ties."""
        query = _pack_tokens(tuple(map(operator.index, tokens)))
        found: Match | None = None
        with self._lock:
            candidates = [(k, "ram", e.token_bytes) for k, e in self._ram.items()]
            candidates += [(k, "disk", e.token_bytes) for k, e in self._disk.items()]
        for key, tier, token_bytes in candidates:
            common = common_prefix(query, token_bytes) // _TOKEN_SIZE
            if common >= 1 and (found is None or common > found.common):
                found = Match(key, tier, common, len(token_bytes) // _TOKEN_SIZE)
        return found

    def load(self, match: Match) -> Snapshot | None:
        """The snapshot `match` points at, or None if it is gone or its file failed a check."""
        if match.tier == "ram":
            with self._lock:
                entry = self._ram.get(match.key)
                if entry is None:
                    return None
                self._ram.move_to_end(match.key)
                return entry.snapshot
        with self._lock:
            disk_entry = self._disk.get(match.key)
        if disk_entry is None:
            return None
        try:
            snapshot, token_bytes = self._read_file(disk_entry.path, match.key)
        except (OSError, _Rejected) as exc:
            logger.warning("discarding snapshot of %s (%s): %s", match.key, disk_entry.path, exc)
            with self._lock:
                if self._disk.get(match.key) is disk_entry:
                    del self._disk[match.key]
            _remove(disk_entry.path)
            return None
        with self._lock:
            stamp = self._next_stamp()
            if self._disk.get(match.key) is disk_entry:
                disk_entry.stamp = stamp
            self._ram_insert(snapshot, token_bytes)
        # The writer may have evicted the file since it was read; the snapshot is still good.
        with contextlib.suppress(OSError):
            os.utime(disk_entry.path, ns=(stamp, stamp))
        return snapshot

    def discard(self, key: str) -> None:
        """Forget `key` in both tiers; its file goes once queued writes for it are done."""
        with self._lock:
            if self._closed:
                raise RuntimeError("KVStore is closed")
            seq = self._supersede(key)
        self._jobs.put(_Delete(key, seq))

    def flush(self) -> None:
        """Block until every queued disk write and delete is done."""
        self._jobs.join()

    def close(self) -> None:
        """Finish queued writes and stop the writer thread. Later puts raise."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._jobs.join()
        self._jobs.put(None)
        self._writer.join()

    @property
    def ram_bytes(self) -> int:
        with self._lock:
            return self._ram_bytes

    @property
    def disk_bytes(self) -> int:
        with self._lock:
            return sum(entry.size for entry in self._disk.values())

    def keys(self) -> list[str]:
        """Keys with a loadable snapshot; one only in a queued write appears once it is written."""
        with self._lock:
            return sorted(self._ram.keys() | self._disk.keys())

    # -- shared helpers (call with the lock held) -----------------------------------------

    def _supersede(self, key: str) -> int:
        """Drop `key` from both tiers and return the sequence number of the call replacing it."""
        self._seq += 1
        self._latest[key] = self._seq
        self._disk.pop(key, None)
        old = self._ram.pop(key, None)
        if old is not None:
            self._ram_bytes -= old.size
        return self._seq

    def _ram_insert(self, snapshot: Snapshot, token_bytes: bytes) -> None:
        """Add to the RAM tier, evicting least recently used entries to stay under budget.

        An entry costs its payload plus its packed tokens; one larger than the budget skips RAM.
        """
        size = len(snapshot.payload) + len(token_bytes)
        old = self._ram.pop(snapshot.key, None)
        if old is not None:
            self._ram_bytes -= old.size
        if size > self.ram_budget:
            return
        self._ram[snapshot.key] = _RamEntry(snapshot, token_bytes, size)
        self._ram_bytes += size
        while self._ram_bytes > self.ram_budget:
            _, evicted = self._ram.popitem(last=False)
            self._ram_bytes -= evicted.size

    def _next_stamp(self) -> int:
        """A strictly increasing mtime, so recency order survives coarse clocks and restarts."""
        self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
        return self._last_stamp

    def _path(self, key: str) -> Path:
        return self.directory / (hashlib.sha256(key.encode()).hexdigest()[:32] + SUFFIX)

    # -- disk -------------------------------------------------------------------------------

    def _scan(self) -> None:
        """Index every snapshot file (header and tokens, not payloads); drop broken ones."""
        for path in self.directory.iterdir():
            if path.suffix == TMP_SUFFIX:
                logger.info("removing unfinished snapshot write %s", path)
                _remove(path)
            elif path.suffix == SUFFIX:
                try:
                    with path.open("rb") as f:
                        header, token_bytes = self._read_verified_head(f, path)
                        stat = os.fstat(f.fileno())
                except (OSError, _Rejected) as exc:
                    logger.warning("discarding snapshot file %s: %s", path, exc)
                    _remove(path)
                    continue
                self._disk[header.key] = _DiskEntry(
                    path, token_bytes, stat.st_size, stat.st_mtime_ns
                )
                self._last_stamp = max(self._last_stamp, stat.st_mtime_ns)

    def _read_verified_head(self, f: BinaryIO, path: Path) -> tuple[_Header, bytes]:
        """Header and token bytes of an open snapshot file, checked against this store.

        The size check comes before any big read, so a damaged count can't ask for gigabytes.
        """
        header = _Header.read(f, self.FORMAT_VERSION)
        if header.engine != self.engine:
            raise _Rejected(f"engine {header.engine!r}, expected {self.engine!r}")
        if header.fingerprint != self.fingerprint:
            raise _Rejected(f"model {header.fingerprint!r}, expected {self.fingerprint!r}")
        if self._path(header.key).name != path.name:
            raise _Rejected(f"key {header.key!r} does not belong in this file")
        expected = f.tell() + header.n_tokens * _TOKEN_SIZE + header.payload_len
        size = os.fstat(f.fileno()).st_size
        if size != expected:
            raise _Rejected(f"file is {size} bytes, header says {expected} (truncated?)")
        token_bytes = _read_exact(f, header.n_tokens * _TOKEN_SIZE)
        if hashlib.sha256(token_bytes).digest() != header.tokens_sha:
            raise _Rejected("token hash mismatch")
        return header, token_bytes

    def _read_file(self, path: Path, key: str) -> tuple[Snapshot, bytes]:
        """The verified snapshot in `path`, with its packed tokens."""
        with path.open("rb") as f:
            header, token_bytes = self._read_verified_head(f, path)
            if header.key != key:
                raise _Rejected(f"file holds {header.key!r}")
            payload = _read_exact(f, header.payload_len)
        if hashlib.sha256(payload).digest() != header.payload_sha:
            raise _Rejected("payload checksum mismatch")
        return Snapshot(key, _unpack_tokens(token_bytes), payload), token_bytes

    # -- writer thread --------------------------------------------------------------------

    def _run_writer(self) -> None:
        """Serve the job queue until the stop sentinel. Nothing escapes: `flush` must return."""
        while (job := self._jobs.get()) is not None:
            try:
                if isinstance(job, _Write):
                    self._write(job)
                else:
                    self._delete(job)
            except Exception:
                logger.exception("snapshot job for %s failed", job.key)
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def _is_current(self, key: str, seq: int) -> bool:
        with self._lock:
            return self._latest.get(key) == seq

    def _delete(self, job: _Delete) -> None:
        if self._is_current(job.key, job.seq):
            _remove(self._path(job.key))

    def _keep_previous(self, job: _Write) -> None:
        """A replacement was not written: the file it was to replace, if it passes the checks,
        is still a snapshot of the key (a shorter prefix), unless a later call superseded it."""
        path = self._path(job.key)
        try:
            with path.open("rb") as f:
                header, token_bytes = self._read_verified_head(f, path)
                stat = os.fstat(f.fileno())
        except (OSError, _Rejected):
            return
        with self._lock:
            if header.key == job.key and self._latest.get(job.key) == job.seq:
                self._disk[job.key] = _DiskEntry(path, token_bytes, stat.st_size, stat.st_mtime_ns)

    def _write(self, job: _Write) -> None:
        """Write atomically (temp file, fsync, rename), index it, then evict to budget.

        The old file is replaced only by a complete new one: any failure keeps it."""
        if not self._is_current(job.key, job.seq):
            return
        path = self._path(job.key)
        header = _Header(
            self.engine,
            self.fingerprint,
            job.key,
            len(job.token_bytes) // _TOKEN_SIZE,
            hashlib.sha256(job.token_bytes).digest(),
            hashlib.sha256(job.payload).digest(),
            len(job.payload),
        ).pack(self.FORMAT_VERSION)
        size = len(header) + len(job.token_bytes) + len(job.payload)
        if size > self.disk_budget:
            logger.warning(
                "snapshot of %s (%d bytes) exceeds the disk budget: not kept", job.key, size
            )
            self._keep_previous(job)
            return
        with self._lock:
            stamp = self._next_stamp()
        try:
            if path.is_dir() and not path.is_symlink():
                _remove(path)  # a folder where the file belongs: os.replace cannot go over it
            paths.write_private(path, (header, job.token_bytes, job.payload), mtime_ns=stamp)
        except OSError as exc:
            self._keep_previous(job)
            if exc.errno in _DISK_FULL:
                logger.warning("%s", self._disk_full(job.key, size))
            else:
                logger.warning("snapshot of %s skipped: %s", job.key, exc)
            return
        with self._lock:
            if self._latest.get(job.key) == job.seq:
                self._disk[job.key] = _DiskEntry(path, job.token_bytes, size, stamp)
        self._evict_disk(keep=job.key)

    def _disk_full(self, key: str, size: int) -> str:
        """The words for a snapshot that did not fit: where, and how much to free."""
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError:
            free = 0
        need = max(size - free, 1 << 20)
        return (
            f"The disk holding {self.directory} is full: the KV snapshot of {key} "
            f"({size / 1e6:.1f} MB) was not saved, the previous one is kept. "
            f"Free {need / 1e6:.0f} MB there (or lower the snapshot disk budget)."
        )

    def _evict_disk(self, keep: str | None) -> None:
        """Delete least recently used files until the total fits the budget, sparing `keep`."""
        victims: list[Path] = []
        with self._lock:
            total = sum(entry.size for entry in self._disk.values())
            for key, entry in sorted(self._disk.items(), key=lambda item: item[1].stamp):
                if total <= self.disk_budget:
                    break
                if key != keep:
                    del self._disk[key]
                    total -= entry.size
                    victims.append(entry.path)
        for path in victims:
            _remove(path)


def _remove(path: Path) -> None:
    """Delete what is at `path`, file or folder: a cache keeps nothing it cannot trust."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _pack_tokens(tokens: tuple[int, ...]) -> bytes:
    return struct.pack(f"<{len(tokens)}I", *tokens)


def _unpack_tokens(token_bytes: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(token_bytes) // _TOKEN_SIZE}I", token_bytes)


def common_prefix(a: Sequence[int] | bytes, b: Sequence[int] | bytes) -> int:
    """How many items two sequences share from the start: tokens of two lists, or bytes of
    two packed token strings (divide by the token size).

    Gallops then bisects over slice comparisons, which run in C: work grows with the shared
    prefix, not the length, and a Python loop over a long conversation would cost
    milliseconds on every turn.
    """
    n = min(len(a), len(b))
    lo, step = 0, 64
    while lo < n:
        hi = min(lo + step, n)
        if a[lo:hi] != b[lo:hi]:
            break
        lo, step = hi, step * 2
    else:
        return n
    while hi - lo > 1:  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _read_exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise _Rejected("truncated")
    return data


def _read_text(f: BinaryIO) -> str:
    (length,) = _LENGTH.unpack(_read_exact(f, _LENGTH.size))
    return _read_exact(f, length).decode()
