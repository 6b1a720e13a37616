"""Model downloads from the Hugging Face Hub: resumable across restarts, verified before use.

huggingface_hub talks to the hub (its endpoint from HF_ENDPOINT, its headers, its errors, its
Range resume in `http_get`), but the installed version deletes a partial file whenever a
download fails, and a 150 GB model on a home connection fails or gets paused many times. So
Stoke keeps its own partial files under `data_dir()/downloads/<id>/` and a state file listing
every unfinished download; `resume_pending()` after a restart asks the hub only for the bytes
that are missing. Each finished file is hashed (incrementally, while it streams) and compared
with the hub's LFS SHA-256 before it is moved into the models folder; a mismatch goes to
`quarantine/` and is never loaded.

Files over huggingface_hub's plain-HTTP limit (50 GB) go through `hf_hub_download` and Xet:
those are verified the same way, but pause takes effect when the file completes and a restart
starts that file over (Xet keeps no partial file).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx2
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers
from huggingface_hub.utils import tqdm as hf_tqdm

from app import paths
from app.models import library, secrets
from app.models.library import LibraryError, format_bytes

logger = logging.getLogger("stoke.downloads")

DEFAULT_ENDPOINT = "https://huggingface.co"
_STATE_VERSION = 1
_REPORT_EVERY_S = 0.25
_SPEED_WINDOW_S = 10.0
_SAMPLES = 512
_HASH_BLOCK = 8 << 20
_SPLIT = re.compile(r"^(?P<stem>.+)-\d{5}-of-\d{5}\.gguf$")
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:IQ[1-4](?:XXS|XS|S|M|NL)|I?Q[1-8](?:_[0-9A-Z]+)*|MXFP4(?:_MOE)?"
    r"|TQ[12]_0|BF16|F16|F32|FP16|FP8))(?![A-Za-z0-9])",
    re.IGNORECASE,
)


class DownloadError(LibraryError):
    """A download cannot start or go on; the message says why and what to do."""


class _Busy(DownloadError):
    """Another thread or Stoke process is running this download."""


def hub_endpoint() -> str:
    """The hub to talk to, read when asked so HF_ENDPOINT set after import still counts."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


# --- browsing a repo ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RepoFile:
    name: str  # path inside the repo
    size: int | None
    sha256: str | None  # LFS files: what the finished file must hash to
    blob_id: str | None  # small files: their git blob id, checked the same way


@dataclass(frozen=True)
class FileGroup:
    """Files downloaded together: one quantization (all parts of a split set) or an MLX model."""

    key: str
    files: tuple[RepoFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size or 0 for f in self.files)


@dataclass(frozen=True)
class RepoListing:
    repo: str
    revision: str  # the commit: every file of a download comes from the same one
    gated: bool
    files: tuple[RepoFile, ...]
    groups: tuple[FileGroup, ...]

    def group(self, key: str) -> FileGroup:
        for group in self.groups:
            if group.key.lower() == key.lower():
                return group
        raise DownloadError(f"{self.repo} has no {key}. It has: {self.describe_groups()}.")

    def describe_groups(self) -> str:
        return ", ".join(f"{g.key} ({format_bytes(g.size)})" for g in self.groups) or "no models"


def group_key(filename: str) -> str | None:
    """Which quantization a GGUF belongs to, from its name (Q4_K_M, MXFP4, UD-Q2_K_XL...);
    a split set without one is keyed by its stem. None for files that are not GGUF."""
    if not filename.endswith(".gguf"):
        return None
    base = filename.rsplit("/", 1)[-1]
    match = _QUANT.search(base) or _QUANT.search(filename)
    key = match[1].upper() if match else None
    if "mmproj" in base.lower():
        return f"mmproj-{key}" if key else base.removesuffix(".gguf")
    if key:
        return key
    split = _SPLIT.match(base)
    return split["stem"] if split else base.removesuffix(".gguf")


def _group(files: Sequence[RepoFile]) -> tuple[FileGroup, ...]:
    by_key: dict[str, list[RepoFile]] = {}
    for file in files:
        key = group_key(file.name)
        if key is not None:
            by_key.setdefault(key, []).append(file)
    groups = [FileGroup(k, tuple(sorted(v, key=lambda f: f.name))) for k, v in by_key.items()]
    names = {f.name.rsplit("/", 1)[-1] for f in files}
    if "config.json" in names and any(n.endswith(".safetensors") for n in names):
        mlx = tuple(f for f in files if not f.name.endswith(".gguf") and f.name != ".gitattributes")
        groups.append(FileGroup("mlx", mlx))
    return tuple(sorted(groups, key=lambda g: g.size))


def _safe_name(name: str) -> bool:
    """A repo path that stays inside the folder it is written to (no `..`, not absolute)."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and ".." not in parts and "" not in parts


def list_repo(repo: str, *, revision: str | None = None) -> RepoListing:
    """A repo's files with sizes and checksums, grouped by quantization."""
    endpoint = hub_endpoint()
    api = HfApi(endpoint=endpoint, library_name="stoke")
    try:
        info = api.model_info(
            repo, revision=revision, files_metadata=True, token=secrets.get_token()
        )
    except Exception as exc:
        raise DownloadError(explain(exc, repo, endpoint)) from exc
    files = tuple(
        RepoFile(
            name=s.rfilename,
            size=s.lfs.size if s.lfs else s.size,
            sha256=s.lfs.sha256 if s.lfs else None,
            blob_id=None if s.lfs else s.blob_id,
        )
        for s in info.siblings or ()
        if _safe_name(s.rfilename)
    )
    return RepoListing(
        repo=repo,
        revision=info.sha or revision or "main",
        gated=bool(info.gated),
        files=files,
        groups=_group(files),
    )


def explain(exc: BaseException, repo: str, endpoint: str, filename: str | None = None) -> str:
    """A hub failure as one sentence that says what happened and what to do."""
    page = f"{endpoint}/{repo}"
    what = f"{filename} from {repo}" if filename else repo
    if isinstance(exc, GatedRepoError):
        if exc.response.status_code == 403:
            return (
                f"{repo} is gated and your account has not been granted access yet (403): "
                f"open {page}, accept the license, wait for approval, then try again."
            )
        return (
            f"{repo} is gated (401): open {page}, log in and accept its license, then run "
            f"`stoke models login` with an access token from {endpoint}/settings/tokens."
        )
    if isinstance(exc, RevisionNotFoundError):
        return f"That revision of {repo} was not found on {endpoint} (404)."
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"Repository {repo} was not found on {endpoint} (404). Check the name; a private "
            "repo needs `stoke models login`."
        )
    if isinstance(exc, RemoteEntryNotFoundError):
        return f"{filename or 'A file'} was not found in {repo} (404)."
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code
        if status == 401:
            return "The hub refused the token (401): run `stoke models login` with a valid one."
        if status >= 500:
            return f"The hub at {endpoint} answered {status} for {what}; try again later."
        return f"The hub answered {status} for {what}: {exc.server_message or exc}."
    if isinstance(exc, httpx2.TransportError | LocalEntryNotFoundError | OfflineModeIsEnabled):
        return (
            f"Cannot reach the hub at {endpoint} ({type(exc).__name__}: {exc}). Check the "
            "network connection; the download resumes where it stopped."
        )
    return f"Downloading {what} failed: {type(exc).__name__}: {exc}"


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
class _File:
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
class _Job:
    id: str
    repo: str
    revision: str
    endpoint: str
    files: list[_File]
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
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=_SAMPLES))
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


class _Stopped(Exception):
    """Raised inside a transfer to stop it where it is (pause, cancel, quit)."""


class _Digest:
    """The hash a file must match: LFS SHA-256, or the git blob id of a small file."""

    def __init__(self, file: _File) -> None:
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


class _Writer:
    """The file `http_get` writes into: counts and hashes what reaches the disk, and stops
    the transfer when asked, after the chunk is written so the next resume keeps it."""

    def __init__(
        self,
        fh: IO[bytes],
        digest: _Digest,
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
            raise _Stopped
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


def _meter(sink: Callable[[int], None]) -> type[hf_tqdm]:
    """A silent progress bar class for huggingface_hub that hands each update to `sink`
    (Xet downloads report through it; plain HTTP ones through `_Writer`).

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


# --- the download manager ---------------------------------------------------------------------


class Downloads:
    """Every download of this Stoke, running on a small thread pool.

    `on_progress` is called from worker threads (throttled); a UI hands it to its own thread.
    """

    def __init__(
        self, *, workers: int = 3, on_progress: Callable[[Progress], None] | None = None
    ) -> None:
        self.on_progress = on_progress
        self.http_limit = constants.MAX_HTTP_DOWNLOAD_SIZE  # larger files need Xet
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stoke-download")
        self._closing = False
        self._state_path = paths.data_dir() / "downloads.json"
        self._staging_root = paths.data_dir() / "downloads"
        self._jobs: dict[str, _Job] = {}
        self._removed: set[str] = set()
        for raw in self._read_state().values():
            job = _Job(
                id=raw["id"],
                repo=raw["repo"],
                revision=raw["revision"],
                endpoint=raw.get("endpoint") or hub_endpoint(),
                files=[_File(**f) for f in raw["files"]],
                state=raw["state"],
                error=raw.get("error"),
            )
            job.idle.set()
            self._count_present(job)
            self._jobs[job.id] = job

    # paths

    def destination(self, repo: str) -> Path:
        """Where a repo's files land: models_dir()/<owner>/<name>/."""
        return paths.models_dir().joinpath(*repo.split("/"))

    def _staging(self, job: _Job) -> Path:
        return self._staging_root / job.id

    def _partial(self, job: _Job, file: _File) -> Path:
        return self._staging(job) / f"{file.name}.incomplete"

    # state file

    def _read_state(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self._state_path.read_text("utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            self._state_path.replace(self._state_path.with_name("downloads.json.damaged"))
            return {}
        if data.get("version") != _STATE_VERSION:
            return {}
        return {d["id"]: d for d in data.get("downloads", []) if isinstance(d, dict)}

    def _persist(self) -> None:
        """Merge this manager's jobs into the state file (another Stoke may own others)."""
        with self._lock:
            merged = self._read_state()
            for job_id in self._removed:
                merged.pop(job_id, None)
            merged.update({job.id: job.to_dict() for job in self._jobs.values()})
            payload = {"version": _STATE_VERSION, "downloads": list(merged.values())}
            paths.write_private(self._state_path, json.dumps(payload, indent=2))

    # starting

    def start(
        self,
        repo: str,
        files: Sequence[str] | None = None,
        *,
        quant: str | None = None,
        revision: str | None = None,
    ) -> str:
        """Check access and disk space, then download `files` (or one quantization group)."""
        listing = list_repo(repo, revision=revision)
        chosen = self._choose(listing, files, quant)
        endpoint = hub_endpoint()
        self._check_access(listing, chosen[0].name, endpoint)
        destination = self.destination(repo)
        present = [f.name for f in chosen if (destination / f.name).exists()]
        if present:
            raise DownloadError(
                f"{', '.join(present)} from {repo} is already in the library at {destination}."
            )
        job = _Job(
            id=uuid.uuid4().hex[:12],
            repo=repo,
            revision=listing.revision,
            endpoint=endpoint,
            files=[_File(f.name, f.size, f.sha256, f.blob_id) for f in chosen],
        )
        self._check_space(job)
        with self._lock:
            self._jobs[job.id] = job
        self._launch(job)
        self._report(job, force=True)
        return job.id

    @staticmethod
    def _choose(
        listing: RepoListing, files: Sequence[str] | None, quant: str | None
    ) -> list[RepoFile]:
        by_name = {f.name: f for f in listing.files}
        if files:
            missing = [n for n in files if n not in by_name]
            if missing:
                raise DownloadError(
                    f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not in "
                    f"{listing.repo} (404). Its models: {listing.describe_groups()}."
                )
            return [by_name[n] for n in files]
        if quant:
            return list(listing.group(quant).files)
        if len(listing.groups) == 1:
            return list(listing.groups[0].files)
        raise DownloadError(
            f"{listing.repo} holds several models; choose one of: {listing.describe_groups()}."
        )

    def _check_access(self, listing: RepoListing, filename: str, endpoint: str) -> None:
        """One HEAD before anything is written: a gated repo fails here, with its message."""
        url = hf_hub_url(listing.repo, filename, revision=listing.revision, endpoint=endpoint)
        try:
            get_hf_file_metadata(url, token=secrets.get_token(), endpoint=endpoint)
        except Exception as exc:
            raise DownloadError(explain(exc, listing.repo, endpoint, filename)) from exc

    def _check_space(self, job: _Job) -> None:
        self._count_present(job)
        needed = sum(max((f.size or 0) - f.have, 0) for f in job.files if f.status != "done")
        where = self._staging_root
        free = library.disk_free(where)
        if needed > free:
            raise DownloadError(
                f"Not enough disk space for {job.repo}: it needs {format_bytes(needed)}, "
                f"{format_bytes(free)} free on {where}."
            )

    def _count_present(self, job: _Job) -> None:
        for file in job.files:
            partial = self._partial(job, file)
            if file.status == "done":
                file.have = file.size or 0
            else:
                file.have = partial.stat().st_size if partial.exists() else 0

    def _lock_job(self, job: _Job) -> bool:
        """Hold the job's lock file while it runs, so two Stoke processes never write one
        partial file; the OS drops it if this process dies."""
        staging = self._staging(job)
        staging.mkdir(parents=True, exist_ok=True)
        fd = os.open(staging / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        job.lock_fd = fd
        return True

    def _launch(self, job: _Job) -> None:
        with self._lock:
            if job.active or not self._lock_job(job):
                raise _Busy(f"The download of {job.repo} is already running.")
            job.stop = threading.Event()
            job.idle.clear()
            job.state, job.error, job.cancelled, job.restart = "running", None, False, False
            job.received = 0
            job.samples = deque([(time.monotonic(), 0)], maxlen=_SAMPLES)
            pending = [f for f in job.files if f.status != "done"]
            for file in pending:
                file.status, file.error, file.quarantine = "pending", None, None
            job.active = len(pending)
            self._persist()
            if not pending:
                self._settle(job)
            for file in pending:
                self._pool.submit(self._work, job, file)

    # control

    def _job(self, job_id: str) -> _Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise DownloadError(f"No download {job_id!r}.") from None

    def pause(self, job_id: str) -> None:
        """Stop the running files where they are; their bytes stay for `resume`."""
        job = self._job(job_id)
        with self._lock:
            if job.state == "running":
                job.stop.set()
                job.state, job.restart = "paused", False
                self._persist()
        self._report(job, force=True)

    def resume(self, job_id: str) -> None:
        """Go on with a paused, failed or interrupted download from the bytes already here."""
        job = self._job(job_id)
        with self._lock:
            if job.active:  # paused transfers still letting go: go on once they have
                if job.stop.is_set() and not job.cancelled:
                    job.restart, job.state = True, "running"
                    self._persist()
                return
        self._check_space(job)
        self._launch(job)
        self._report(job, force=True)

    def cancel(self, job_id: str) -> None:
        """Stop and forget a download, deleting its partial files."""
        job = self._job(job_id)
        with self._lock:
            job.cancelled = True
            job.stop.set()
            if not job.active:
                self._discard(job)
        self._report(job, force=True)

    def resume_pending(self) -> list[str]:
        """After a restart: go on with every download that was running when Stoke stopped."""
        resumed = []
        for job in list(self._jobs.values()):
            if job.state == "running" and not job.active:
                try:
                    self.resume(job.id)
                except _Busy:
                    continue  # another Stoke window has it
                except DownloadError as exc:
                    with self._lock:
                        job.state, job.error = "failed", str(exc)
                        self._persist()
                    self._report(job, force=True)
                else:
                    resumed.append(job.id)
        return resumed

    def wait(self, job_id: str, timeout: float | None = None) -> Progress:
        """Block until the download stops running (done, failed, paused or cancelled)."""
        job = self._job(job_id)
        job.idle.wait(timeout)
        return self._snapshot(job)

    def shutdown(self) -> None:
        """Stoke is quitting: stop every transfer but leave running downloads marked running,
        so the next start resumes them."""
        with self._lock:
            self._closing = True
            for job in self._jobs.values():
                job.stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for job in self._jobs.values():
                if job.active:  # files that never started
                    job.active = 0
                    self._settle(job)

    # progress

    def progress(self, job_id: str) -> Progress:
        return self._snapshot(self._job(job_id))

    def _snapshot(self, job: _Job) -> Progress:
        with self._lock:
            total = sum(f.size or 0 for f in job.files)
            done = sum(min(f.have, f.size or f.have) for f in job.files)
            now = time.monotonic()
            while job.samples and now - job.samples[0][0] > _SPEED_WINDOW_S:
                job.samples.popleft()
            speed = 0.0
            if job.state == "running" and len(job.samples) > 1:
                (t0, b0), (t1, b1) = job.samples[0], job.samples[-1]
                speed = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
            eta = (total - done) / speed if speed > 0 else None
            return Progress(
                id=job.id,
                repo=job.repo,
                state="cancelled" if job.cancelled else job.state,
                done_bytes=done,
                total_bytes=total,
                speed=speed,
                eta_s=eta,
                files_done=sum(f.status == "done" for f in job.files),
                files_total=len(job.files),
                current=tuple(sorted(job.current)),
                destination=self.destination(job.repo),
                error=job.error,
                quarantined=tuple(Path(f.quarantine) for f in job.files if f.quarantine),
            )

    def downloads(self) -> list[Progress]:
        return [self.progress(job_id) for job_id in list(self._jobs)]

    def _advance(self, job: _Job, file: _File, n: int) -> None:
        with self._lock:
            file.have += n
            job.received += n
            job.samples.append((time.monotonic(), job.received))
        self._report(job)

    def _report(self, job: _Job, force: bool = False) -> None:
        if self.on_progress is None:
            return
        now = time.monotonic()
        if not force and now - job.reported < _REPORT_EVERY_S:
            return
        job.reported = now
        self.on_progress(self._snapshot(job))

    # the work

    def _work(self, job: _Job, file: _File) -> None:
        try:
            if job.stop.is_set():
                return
            with self._lock:
                job.current.add(file.name)
            fetched = self._fetch(job, file)
            self._verify_and_place(job, file, *fetched)
        except _Stopped:
            pass
        except Exception as exc:
            if not isinstance(exc, HfHubHTTPError | httpx2.TransportError | OSError):
                logger.exception("download of %s from %s failed", file.name, job.repo)
            message = explain(exc, job.repo, job.endpoint, file.name)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                needed = sum(max((f.size or 0) - f.have, 0) for f in job.files)
                free = library.disk_free(self._staging_root)
                message = (
                    f"The disk filled up while downloading {file.name}: {job.repo} needs "
                    f"{format_bytes(needed)} more, {format_bytes(free)} free on "
                    f"{self._staging_root}. Free some space, then resume."
                )
            with self._lock:
                file.status = "failed"
                file.error = message
        finally:
            with self._lock:
                job.current.discard(file.name)
                job.active -= 1
                if job.active == 0:
                    self._settle(job)
                else:
                    self._persist()
            self._report(job, force=True)

    def _fetch(self, job: _Job, file: _File) -> tuple[Path, _Digest]:
        """Bring the file's bytes into the staging folder; return them with their hash."""
        partial = self._partial(job, file)
        partial.parent.mkdir(parents=True, exist_ok=True)
        digest = _Digest(file)
        token = secrets.get_token()

        def advance(n: int) -> None:
            self._advance(job, file, n)

        if file.size is not None and file.size > self.http_limit:
            with self._lock:
                file.have = 0
            local = hf_hub_download(
                job.repo,
                file.name,
                revision=job.revision,
                local_dir=self._staging(job) / "xet",
                endpoint=job.endpoint,
                token=token,
                tqdm_class=_meter(advance),
            )
            digest.valid = False  # hashed from the file below
            return Path(str(local)), digest
        offset = partial.stat().st_size if partial.exists() else 0
        if file.size is not None and offset > file.size:
            partial.unlink()
            offset = 0
        if offset:
            digest.feed_file(partial, offset)
        with self._lock:
            file.have = offset
        url = hf_hub_url(job.repo, file.name, revision=job.revision, endpoint=job.endpoint)
        with partial.open("ab") as fh:
            http_get(
                url,
                _Writer(fh, digest, job.stop, advance),  # type: ignore[arg-type]
                resume_size=offset,
                headers=build_hf_headers(token=token, library_name="stoke"),
                expected_size=file.size,
                displayed_filename=file.name,
                tqdm_class=_meter(lambda n: None),  # the writer counts what reaches the disk
            )
        return partial, digest

    def _verify_and_place(self, job: _Job, file: _File, fetched: Path, digest: _Digest) -> None:
        """Only a file that matches the hub's checksum enters the library."""
        if digest.expected and not digest.valid:
            digest.reset()
            digest.feed_file(fetched)
        actual = digest.hexdigest() if digest.expected else None
        if actual is not None and actual != digest.expected:
            target = self._quarantine_path(job, file)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(fetched, target)
            with self._lock:
                file.status, file.quarantine = "quarantined", str(target)
                file.have = 0
                file.error = (
                    f"Checksum mismatch: {file.name} from {job.repo} is not the file the hub "
                    f"published (SHA-256 {actual[:12]}…, expected {digest.expected[:12]}…). "
                    f"It was quarantined at {target} and will not be used; resume to download "
                    "it again."
                )
            return
        destination = self.destination(job.repo) / file.name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(fetched, destination)
        with self._lock:
            file.status = "done"
            file.have = file.size or destination.stat().st_size

    def _quarantine_path(self, job: _Job, file: _File) -> Path:
        base = paths.data_dir().joinpath("quarantine", *job.repo.split("/"), file.name)
        target, n = base, 1
        while target.exists():
            target = base.with_name(f"{base.name}.{n}")
            n += 1
        return target

    def _settle(self, job: _Job) -> None:
        """The last worker of a job is done: decide the job's state and let go of it."""
        if job.lock_fd is not None:
            os.close(job.lock_fd)
            job.lock_fd = None
        failed = [f for f in job.files if f.status in ("failed", "quarantined")]
        if job.cancelled:
            self._discard(job)
            return
        if self._closing:
            pass  # quitting: what was running stays running, for the next start
        elif job.restart:
            try:
                self._launch(job)
                return
            except DownloadError as exc:
                job.state, job.error = "failed", str(exc)
        elif failed:
            job.state, job.error = "failed", failed[0].error
        elif all(f.status == "done" for f in job.files):
            job.state = "done"
            shutil.rmtree(self._staging(job), ignore_errors=True)
        elif job.stop.is_set():
            job.state = "paused"
        self._persist()
        job.idle.set()

    def _discard(self, job: _Job) -> None:
        shutil.rmtree(self._staging(job), ignore_errors=True)
        self._jobs.pop(job.id, None)
        self._removed.add(job.id)
        self._persist()
        job.idle.set()
