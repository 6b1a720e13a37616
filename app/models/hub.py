"""The Hugging Face Hub as Stoke browses it: a search for GGUF and MLX repositories, a repo's
files grouped by quantization and split parts, the endpoint (HF_ENDPOINT), and hub errors in
words a user can act on."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import HfApi
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from app.engine.images import is_projector
from app.models import secrets
from app.models.library import LibraryError
from app.units import decimal_bytes

DEFAULT_ENDPOINT = "https://huggingface.co"
_SPLIT = re.compile(r"^(?P<stem>.+)-\d{5}-of-\d{5}\.gguf$")
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:IQ[1-4](?:XXS|XS|S|M|NL)|I?Q[1-8](?:_[0-9A-Z]+)*|MXFP4(?:_MOE)?"
    r"|TQ[12]_0|BF16|F16|F32|FP16|FP8))(?![A-Za-z0-9])",
    re.IGNORECASE,
)


class DownloadError(LibraryError):
    """A download cannot start or go on; the message says why and what to do."""


def hub_endpoint() -> str:
    """The hub to talk to, read when asked so HF_ENDPOINT set after import still counts."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


# --- searching ------------------------------------------------------------------------------

SEARCH_FORMATS = ("gguf", "mlx")  # the hub's tags for the repositories Stoke can run


@dataclass(frozen=True)
class HubModel:
    """One search result: a repository, how popular it is, and which format it holds."""

    repo: str
    format: str  # "gguf" or "mlx"
    downloads: int
    likes: int


SEARCH_TIMEOUT_S = 10.0  # a hub that does not answer in this long is said to be down


def search_models(query: str, *, limit: int = 30) -> list[HubModel]:
    """GGUF and MLX repositories whose name matches `query`, most downloaded first (the
    hub's own search, one request per format, merged).

    Asked once each through huggingface_hub's own session, headers and error checks, but not
    its list_models: that retries through http_backoff five times with growing pauses, so a
    search offline took 25-30 s to fail and logged a warning for every try (issue 36 item 4).
    A user who searches again is the retry."""
    endpoint = hub_endpoint()
    headers = build_hf_headers(token=secrets.get_token(), library_name="stoke")
    found: dict[str, HubModel] = {}
    try:
        for tag in SEARCH_FORMATS:
            params = {"search": query.strip(), "filter": tag, "sort": "downloads", "limit": limit}
            response = get_session().get(
                f"{endpoint}/api/models", params=params, headers=headers, timeout=SEARCH_TIMEOUT_S
            )
            hf_raise_for_status(response)
            for info in response.json():
                repo = info["id"]
                found.setdefault(
                    repo, HubModel(repo, tag, info.get("downloads") or 0, info.get("likes") or 0)
                )
    except HfHubHTTPError as exc:
        raise DownloadError(explain(exc, f"the search for {query.strip()!r}", endpoint)) from exc
    except (httpx2.TransportError, OfflineModeIsEnabled, ValueError, KeyError) as exc:
        raise DownloadError(
            f"Cannot search the hub at {endpoint}: it did not answer. Check the network "
            "connection, then search again."
        ) from exc
    ranked = sorted(found.values(), key=lambda m: (-m.downloads, m.repo.lower()))
    return ranked[:limit]


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
        return ", ".join(f"{g.key} ({decimal_bytes(g.size)})" for g in self.groups) or "no models"


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


PROJECTOR_PREFERENCE = ("F16", "BF16", "Q8_0", "F32")  # a projector is small: keep it precise


def projector_file(listing: RepoListing) -> RepoFile | None:
    """The vision projector to download with a model of `listing` (its `mmproj` file: F16
    when there are several, as llama.cpp's own repos publish it), or None for a text model."""
    names = {f.name: Path(f.name) for f in listing.files}
    projectors = [
        f for f in listing.files if names[f.name].suffix == ".gguf" and is_projector(names[f.name])
    ]
    if not projectors:
        return None

    def rank(file: RepoFile) -> tuple[int, int]:
        key = (group_key(file.name) or "").removeprefix("mmproj-").upper()
        order = PROJECTOR_PREFERENCE.index(key) if key in PROJECTOR_PREFERENCE else 99
        return order, file.size or 0

    return min(projectors, key=rank)


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
        # Only a download has somewhere to resume from; browsing a repo just tries again.
        resume = " The download resumes where it stopped." if filename else ""
        return f"Cannot reach the hub at {endpoint}: check the network connection.{resume}"
    doing = "Downloading" if filename else "Reading"
    return f"{doing} {what} from {endpoint} failed unexpectedly; try again later."
