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
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    HfHubHTTPError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers

from app import paths
from app.engine.images import is_projector
from app.models import library, secrets
from app.models.hub import (
    DownloadError,
    RepoFile,
    RepoListing,
    explain,
    hub_endpoint,
    list_repo,
    projector_file,
)
from app.models.transfer import (
    SAMPLES,
    Digest,
    FileState,
    JobState,
    PartWriter,
    Progress,
    Stopped,
    progress_meter,
)
from app.stored import Fields, Items, Stored, Value, matching, of_type, one_of, text, text_or_none
from app.units import decimal_bytes

logger = logging.getLogger("stoke.downloads")

_STATE_VERSION = 1
JOB_STATES = ("running", "paused", "done", "failed")
FILE_STATES = ("pending", "done", "failed", "quarantined")
_REPORT_EVERY_S = 0.25
_SPEED_WINDOW_S = 10.0


def _relative(name: Any) -> bool:
    """A path inside the folder it is joined to: relative, no `..`, no empty part."""
    parts = name.split("/") if isinstance(name, str) else [""]
    return all(part not in ("", ".", "..") and "\\" not in part for part in parts)


_repo = matching(r"[\w.-]+/[\w.-]+")
# The unfinished downloads (downloads.json). Ids, repos and file names become paths that are
# written and deleted, so each must stay inside its folder; a damaged job is left out alone.
STATE_FILE = Stored(
    Fields(
        {
            "version": Value(one_of(_STATE_VERSION), f"{_STATE_VERSION} (this Stoke's format)"),
            "downloads": Items(
                Fields(
                    {
                        "id": Value(matching(r"[0-9a-f]{12}"), "a download id"),
                        "repo": Value(lambda v: _repo(v) and _relative(v), "owner/name"),
                        "revision": Value(text, "a revision"),
                        "endpoint": Value(text_or_none, "a URL or null"),
                        "state": Value(one_of(*JOB_STATES), "one of " + ", ".join(JOB_STATES)),
                        "error": Value(text_or_none, "a sentence or null"),
                        "files": Items(
                            Fields(
                                {
                                    "name": Value(_relative, "a file name in the repo"),
                                    "size": Value(of_type(int | None), "a size or null"),
                                    "sha256": Value(text_or_none, "a hash or null"),
                                    "blob_id": Value(text_or_none, "an id or null"),
                                    "status": Value(one_of(*FILE_STATES), "a file's state"),
                                    "error": Value(text_or_none, "a sentence or null"),
                                    "quarantine": Value(text_or_none, "a path or null"),
                                },
                                required=("name", "size", "sha256", "blob_id"),
                            )
                        ),
                    },
                    required=("id", "repo", "revision", "state", "files"),
                )
            ),
        },
        required=("version", "downloads"),
    ),
    keep=True,
    empty=lambda: {"version": _STATE_VERSION, "downloads": []},
)


class _Busy(DownloadError):
    """Another thread or Stoke process is running this download."""


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
        self._jobs: dict[str, JobState] = {}
        self._removed: set[str] = set()
        for raw in self._read_state().values():
            job = JobState(
                id=raw["id"],
                repo=raw["repo"],
                revision=raw["revision"],
                endpoint=raw.get("endpoint") or hub_endpoint(),
                files=[FileState(**f) for f in raw["files"]],
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

    def _staging(self, job: JobState) -> Path:
        return self._staging_root / job.id

    def _partial(self, job: JobState, file: FileState) -> Path:
        return self._staging(job) / f"{file.name}.incomplete"

    # state file

    def _read_state(self) -> dict[str, dict[str, Any]]:
        return {d["id"]: d for d in STATE_FILE.read(self._state_path).value["downloads"]}

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
        job = JobState(
            id=uuid.uuid4().hex[:12],
            repo=repo,
            revision=listing.revision,
            endpoint=endpoint,
            files=[FileState(f.name, f.size, f.sha256, f.blob_id) for f in chosen],
        )
        self._check_space(job)
        with self._lock:
            self._jobs[job.id] = job
        self._launch(job)
        self._report(job, force=True)
        return job.id

    @classmethod
    def _choose(
        cls, listing: RepoListing, files: Sequence[str] | None, quant: str | None
    ) -> list[RepoFile]:
        """The files asked for, with the repo's vision projector when they are a GGUF model
        without one: a vision model reads images only with its `mmproj` beside it."""
        chosen = cls._asked(listing, files, quant)
        names = [Path(f.name) for f in chosen]
        model = any(n.suffix == ".gguf" and not is_projector(n) for n in names)
        projector = projector_file(listing)
        if model and projector is not None and not any(is_projector(n) for n in names):
            chosen.append(projector)
        return chosen

    @staticmethod
    def _asked(
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

    def _check_space(self, job: JobState) -> None:
        self._count_present(job)
        needed = sum(max((f.size or 0) - f.have, 0) for f in job.files if f.status != "done")
        where = self._staging_root
        free = library.disk_free(where)
        if needed > free:
            raise DownloadError(
                f"Not enough disk space for {job.repo}: it needs {decimal_bytes(needed)}, "
                f"{decimal_bytes(free)} free on {where}."
            )

    def _count_present(self, job: JobState) -> None:
        for file in job.files:
            partial = self._partial(job, file)
            if file.status == "done":
                file.have = file.size or 0
            else:
                file.have = partial.stat().st_size if partial.exists() else 0

    def _lock_job(self, job: JobState) -> bool:
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

    def _launch(self, job: JobState) -> None:
        with self._lock:
            if job.active or not self._lock_job(job):
                raise _Busy(f"The download of {job.repo} is already running.")
            job.stop = threading.Event()
            job.idle.clear()
            job.state, job.error, job.cancelled, job.restart = "running", None, False, False
            job.received = 0
            job.samples = deque([(time.monotonic(), 0)], maxlen=SAMPLES)
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

    def _job(self, job_id: str) -> JobState:
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

    def _snapshot(self, job: JobState) -> Progress:
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

    def _advance(self, job: JobState, file: FileState, n: int) -> None:
        with self._lock:
            file.have += n
            job.received += n
            job.samples.append((time.monotonic(), job.received))
        self._report(job)

    def _report(self, job: JobState, force: bool = False) -> None:
        if self.on_progress is None:
            return
        now = time.monotonic()
        if not force and now - job.reported < _REPORT_EVERY_S:
            return
        job.reported = now
        self.on_progress(self._snapshot(job))

    # the work

    def _work(self, job: JobState, file: FileState) -> None:
        try:
            if job.stop.is_set():
                return
            with self._lock:
                job.current.add(file.name)
            fetched = self._fetch(job, file)
            self._verify_and_place(job, file, *fetched)
        except Stopped:
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
                    f"{decimal_bytes(needed)} more, {decimal_bytes(free)} free on "
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

    def _fetch(self, job: JobState, file: FileState) -> tuple[Path, Digest]:
        """Bring the file's bytes into the staging folder; return them with their hash."""
        partial = self._partial(job, file)
        partial.parent.mkdir(parents=True, exist_ok=True)
        digest = Digest(file)
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
                tqdm_class=progress_meter(advance),
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
                PartWriter(fh, digest, job.stop, advance),  # type: ignore[arg-type]
                resume_size=offset,
                headers=build_hf_headers(token=token, library_name="stoke"),
                expected_size=file.size,
                displayed_filename=file.name,
                tqdm_class=progress_meter(
                    lambda n: None
                ),  # the writer counts what reaches the disk
            )
        return partial, digest

    def _verify_and_place(
        self, job: JobState, file: FileState, fetched: Path, digest: Digest
    ) -> None:
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

    def _quarantine_path(self, job: JobState, file: FileState) -> Path:
        base = paths.data_dir().joinpath("quarantine", *job.repo.split("/"), file.name)
        target, n = base, 1
        while target.exists():
            target = base.with_name(f"{base.name}.{n}")
            n += 1
        return target

    def _settle(self, job: JobState) -> None:
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

    def _discard(self, job: JobState) -> None:
        shutil.rmtree(self._staging(job), ignore_errors=True)
        self._jobs.pop(job.id, None)
        self._removed.add(job.id)
        self._persist()
        job.idle.set()
