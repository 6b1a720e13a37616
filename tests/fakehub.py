"""A Hugging Face Hub on loopback: the endpoints the real huggingface_hub client calls.

- `GET /api/models/{repo}` (and `/revision/{rev}`): model info; with `blobs=True` the real hub
  adds sizes, blob ids and LFS sha256, so this always does.
- `GET /api/models?search=&filter=&sort=downloads&limit=`: the model search, as the real hub
  answers it: a JSON list of repo summaries (`id`, `modelId`, `downloads`, `likes`, `tags`,
  `library_name`, `private`, `createdAt`), every `filter` a tag the repo must have, the
  search a case-insensitive substring of the id, most downloaded first.
- `HEAD`/`GET /{repo}/resolve/{rev}/{file}`: small files are served here with the git blob id
  as ETag; LFS files answer 302 to a second server standing in for the CDN (another origin,
  so the client drops the Authorization header, as with the real CDN), with `X-Linked-Etag`,
  `X-Linked-Size` and `X-Repo-Commit`. Bytes support `Range` (206).
- A gated repo answers 401 (`X-Error-Code: GatedRepo`) without a token, 403 with a token that
  was not granted; unknown repos, revisions and files answer 404 with the hub's error codes.

Faults for tests: `drop_after[file] = n` ends the first GET of that file after n bytes (the
connection is cut); `stall_after[file] = n` sends n bytes, waits until `release()`, then goes on;
`corrupt` serves altered bytes under the true checksum; `ignore_range` answers Range requests
with 200. `served[file]` counts body bytes sent and `gets` records (file, first byte) of every
GET.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

_CHUNK = 64 << 10
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
_LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    gated: bool = False
    commit: str = field(default_factory=lambda: os.urandom(20).hex())
    downloads: int = 0
    likes: int = 0
    library: str | None = None  # "mlx" for an MLX repo; GGUF repos are tagged by their files

    @property
    def tags(self) -> list[str]:
        tags = ["gguf"] if any(n.endswith(".gguf") for n in self.files) else []
        if self.library:
            tags.append(self.library)
        return [*tags, "text-generation"]

    def summary(self, repo_id: str) -> dict[str, object]:
        """What the search lists for the repo (the real hub's default fields)."""
        return {
            "_id": self.commit[:24],
            "id": repo_id,
            "modelId": repo_id,
            "likes": self.likes,
            "downloads": self.downloads,
            "private": False,
            "tags": self.tags,
            "pipeline_tag": "text-generation",
            "library_name": self.library or ("gguf" if "gguf" in self.tags else None),
            "createdAt": "2026-01-01T00:00:00.000Z",
        }

    @staticmethod
    def is_lfs(name: str) -> bool:
        return name.endswith(_LFS_SUFFIXES)

    @staticmethod
    def git_oid(data: bytes) -> str:
        return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()

    def info(self, repo_id: str) -> dict[str, object]:
        siblings = []
        for name, data in sorted(self.files.items()):
            sibling: dict[str, object] = {
                "rfilename": name,
                "size": len(data),
                "blobId": self.git_oid(data),
            }
            if self.is_lfs(name):
                sha = hashlib.sha256(data).hexdigest()
                sibling["lfs"] = {"size": len(data), "sha256": sha, "pointerSize": 134}
            siblings.append(sibling)
        return {
            "id": repo_id,
            "modelId": repo_id,
            "sha": self.commit,
            "private": False,
            "gated": "manual" if self.gated else False,
            "siblings": siblings,
        }


class FakeHub:
    """Two threaded HTTP servers on 127.0.0.1 (hub and CDN) sharing these repos and counters."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.granted_tokens: set[str] = set()
        self.drop_after: dict[str, int] = {}
        self.stall_after: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.ignore_range = False  # like a proxy that answers a Range request with 200
        self.served: Counter[str] = Counter()
        self.gets: list[tuple[str, int]] = []
        self.searches: list[dict[str, list[str]]] = []  # the query of every model search
        self.lock = threading.Lock()
        self.sending = 0  # response bodies in flight
        self._released = threading.Event()
        self._servers = [self._serve(), self._serve()]
        self.endpoint = self._url(self._servers[0])
        self.cdn = self._url(self._servers[1])

    def _serve(self) -> ThreadingHTTPServer:
        handler = type("Handler", (_Handler,), {"hub": self})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        return server

    @staticmethod
    def _url(server: ThreadingHTTPServer) -> str:
        return f"http://127.0.0.1:{server.server_address[1]}"

    def add_repo(
        self, repo_id: str, files: dict[str, bytes], *, gated: bool = False, **listing: object
    ) -> FakeRepo:
        """A repo with these files; `listing` sets `downloads`, `likes` or `library`."""
        repo = FakeRepo(dict(files), gated=gated, **listing)
        self.repos[repo_id] = repo
        return repo

    def release(self) -> None:
        """Let stalled responses go on."""
        self._released.set()

    def wait_idle(self, timeout: float = 10) -> None:
        """Until no response body is being sent, so the counters are final."""
        deadline = time.monotonic() + timeout
        while self.sending and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.release()
        for server in self._servers:
            server.shutdown()
            server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: pytest shows failures, not access logs."""

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # routing

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        if path.rstrip("/") == "/api/models":
            self._search(parse_qs(url.query))
        elif path.startswith("/api/models/"):
            self._model_info(path.removeprefix("/api/models/"))
        elif path.startswith("/cdn/"):
            repo_id, _, name = path.removeprefix("/cdn/").partition("/-/")
            repo = self.hub.repos[repo_id]
            sha = hashlib.sha256(repo.files[name]).hexdigest()
            self._send_file(name, repo.files[name], {"ETag": f'"{sha}"'}, head)
        elif "/resolve/" in path:
            repo_id, _, rest = path.lstrip("/").partition("/resolve/")
            revision, _, name = rest.partition("/")
            self._resolve(repo_id, revision, name, head)
        else:
            self._error(404, "NotFound", "Not found")

    def _search(self, query: dict[str, list[str]]) -> None:
        with self.hub.lock:
            self.hub.searches.append(query)
        words = query.get("search", [""])[0].lower()
        tags = query.get("filter", [])
        found = [
            (repo_id, repo)
            for repo_id, repo in self.hub.repos.items()
            if words in repo_id.lower() and all(t in repo.tags for t in tags)
        ]
        if query.get("sort", [""])[0] == "downloads":
            found.sort(key=lambda item: -item[1].downloads)
        limit = int(query.get("limit", ["1000"])[0])
        body = json.dumps([repo.summary(repo_id) for repo_id, repo in found[:limit]]).encode()
        self._send(200, {"Content-Type": "application/json"}, body, head=False)

    def _model_info(self, rest: str) -> None:
        repo_id, _, revision = rest.partition("/revision/")
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        elif revision and revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", "Invalid rev id")
        else:
            body = json.dumps(repo.info(repo_id)).encode()
            self._send(200, {"Content-Type": "application/json"}, body, head=False)

    def _resolve(self, repo_id: str, revision: str, name: str, head: bool) -> None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", head=head)
            return
        if revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", "Invalid rev id", head=head)
            return
        if repo.gated:
            auth = self.headers.get("Authorization", "")
            token = auth.removeprefix("Bearer ").strip()
            if not token:
                message = f"Access to model {repo_id} is restricted. You must be authenticated."
                self._error(401, "GatedRepo", message, head=head)
                return
            if token not in self.hub.granted_tokens:
                message = f"Access to model {repo_id} is restricted and you are not in the list."
                self._error(403, "GatedRepo", message, head=head)
                return
        commit = {"X-Repo-Commit": repo.commit}
        data = repo.files.get(name)
        if data is None:
            self._error(404, "EntryNotFound", "Entry not found", extra=commit, head=head)
            return
        if not repo.is_lfs(name):
            self._send_file(name, data, {**commit, "ETag": f'"{repo.git_oid(data)}"'}, head)
            return
        sha = hashlib.sha256(data).hexdigest()
        headers = {
            **commit,
            "ETag": f'"{sha}"',
            "X-Linked-Etag": f'"{sha}"',
            "X-Linked-Size": str(len(data)),
            "Location": f"{self.hub.cdn}/cdn/{repo_id}/-/{name}?commit={repo.commit}",
        }
        self._send(302, headers, b"", head=True)

    # responses

    def _error(
        self,
        status: int,
        code: str,
        message: str,
        *,
        extra: dict[str, str] | None = None,
        head: bool = False,
    ) -> None:
        headers = {
            "Content-Type": "application/json",
            "X-Error-Code": code,
            "X-Error-Message": message,
            **(extra or {}),
        }
        self._send(status, headers, json.dumps({"error": message}).encode(), head=head)

    def _send(self, status: int, headers: dict[str, str], body: bytes, head: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _send_file(self, name: str, data: bytes, headers: dict[str, str], head: bool) -> None:
        start, end = 0, len(data) - 1
        match = None if self.hub.ignore_range else _RANGE.match(self.headers.get("Range", ""))
        status = 200
        if match:
            start = int(match[1])
            end = int(match[2]) if match[2] else end
            if start >= len(data):
                self._send(416, {"Content-Range": f"bytes */{len(data)}"}, b"", head=head)
                return
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
        self.send_response(status)
        for key, value in {**headers, "Accept-Ranges": "bytes"}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if head:
            return
        hub = self.hub
        with hub.lock:
            hub.gets.append((name, start))
            drop = hub.drop_after.pop(name, None)
            stall = hub.stall_after.pop(name, None)
            hub.sending += 1
        try:
            self._send_body(name, data[start : end + 1], drop, stall)
        finally:
            with hub.lock:
                hub.sending -= 1

    def _send_body(self, name: str, body: bytes, drop: int | None, stall: int | None) -> None:
        hub = self.hub
        if name in hub.corrupt:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        limit = drop if drop is not None else stall
        sent = 0
        while sent < len(body):
            if sent == limit:
                self.wfile.flush()
                if drop is not None:
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                hub._released.wait(60)
            end = sent + _CHUNK if limit is None or sent >= limit else min(sent + _CHUNK, limit)
            piece = body[sent:end]
            try:
                self.wfile.write(piece)
            except OSError:
                self.close_connection = True
                return
            sent += len(piece)
            with hub.lock:
                hub.served[name] += len(piece)
