"""Checks a model file before a runtime sees it, and names its weights with a fingerprint.

A runtime handed a missing, truncated or foreign file fails with a log line at best; these
checks turn that into a sentence the user can act on.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import struct
import threading
from pathlib import Path
from typing import Any

from app import paths
from app.engine.gguf_header import HeaderError, open_header
from app.engine.protocol import ModelLoadError
from app.stored import Entries, Fields, Stored, Value, matching, of_type, one_of, text

logger = logging.getLogger("stoke.model_file")

GGUF_MAGIC = b"GGUF"
_FORMAT = b"stoke-fingerprint-2"  # bumped when what is hashed changes
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_SAFETENSORS_HEADER_MAX = 100 << 20
_HASH_CHUNK = 8 << 20
# `weights_id` reads this many blocks of this size per file, evenly spread (a file no larger
# is read whole): 16 MiB, 20 ms on the default model and 22-42 ms on a sparse 148 GiB file
# here, where a full hash would take minutes (docs/reliability.md).
_SAMPLE_BLOCKS = 256
_SAMPLE_BLOCK = 64 << 10
_CACHE_NAME = "model-hashes.json"
_ARCH_WITHIN = 64  # metadata entries searched for the architecture, which writers put first


def check_gguf(path: str | os.PathLike[str]) -> Path:
    """Raise ModelLoadError with a plain reason unless `path` looks like a GGUF model."""
    file = Path(path).expanduser()
    if not file.exists():
        raise ModelLoadError(f"Model file not found: {file}. Check the path, or omit --model.")
    if file.is_dir():
        raise ModelLoadError(f"{file} is a folder, not a GGUF model file.")
    try:
        with file.open("rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise ModelLoadError(f"Cannot read the model file {file}: {exc.strerror}.") from exc
    if len(head) < 8:
        raise ModelLoadError(
            f"{file} is empty or truncated ({len(head)} bytes). Download it again."
        )
    if head[:4] != GGUF_MAGIC:
        raise ModelLoadError(
            f"{file} is not a GGUF model file: it looks like {_looks_like(head)}, and a model "
            "file starts with the GGUF signature. Stoke's llama.cpp engine loads .gguf files."
        )
    (version,) = struct.unpack("<I", head[4:8])
    if version not in (2, 3):
        raise ModelLoadError(f"{file} is GGUF version {version}, which this engine cannot read.")
    try:
        architecture = gguf_architecture(file)
    except (OSError, struct.error, UnicodeDecodeError):
        architecture = None  # a damaged header: the engine's reader says what is wrong
    head_only = DRAFTING_HEADS.get(architecture or "")
    if head_only:
        raise ModelLoadError(f"{file.name} is {head_only}")
    return file


# Files published beside a model that hold only a drafting head (their own architectures),
# and what to do instead. The llama.cpp Stoke runs reads DeepSeek V4's MTP block only from
# the model's own GGUF (blk.N.nextn.*, as llama.cpp's converter writes it with the model).
DRAFTING_HEADS = {
    "deepseek4_mtp_support": (
        "DeepSeek V4's MTP head as ds4 writes it (architecture deepseek4_mtp_support), not a "
        "model. Neither engine here reads this layout: load the model's own GGUF (speculation "
        "then uses prompt lookup, or the MTP block of a GGUF that carries one)."
    ),
    "deepseek4-dspark": (
        "the DSpark drafter of DeepSeek V4 Flash 0731 as ds4 writes it (architecture "
        "deepseek4-dspark), not a model. Neither engine here runs DSpark: load the model's own "
        "GGUF (speculation then uses prompt lookup)."
    ),
}


def _looks_like(head: bytes) -> str:
    """What a file that is not a GGUF seems to be, from its first bytes, in words."""
    if head.startswith(b"PK"):
        return "a zip archive"
    if head.lstrip().startswith((b"<", b"{")):
        return "a web page or a JSON file (a download link saved as a page?)"
    if all(32 <= b < 127 or b in b"\t\n\r" for b in head):
        return "a text file"
    return "another kind of file"


def fingerprint(path: str | os.PathLike[str], *, hash_content: bool = True) -> str:
    """A stable id of a model's weights, cheap even for a 150 GB file. It keys KV snapshots
    and load settings, so it must change whenever the weights may have.

    A GGUF (every part of a split set) is named by each part's size, mtime and a hash of its
    whole header: metadata, tokenizer and every tensor's name, shape, type and offset. Weights
    rewritten in place change the mtime; a different layout changes the header. The hash of
    the full content is computed once per (path, size, mtime, ctime) in the background
    (`hash_content`; never on the load path) and cached: it tells apart two files whose size,
    mtime and header all agree but whose weights do not (a copy that kept the mtime), which
    from then on get their own fingerprint. Until then KV snapshots are kept apart by
    `weights_id`. An MLX folder is named by its config and each shard's name, size, mtime and
    safetensors header.
    """
    file = Path(path)
    if file.is_dir():
        return _folder_fingerprint(file)
    return _content_hashes.resolve(file, _quick(file), hash_content)


def content_hash(path: str | os.PathLike[str]) -> str:
    """The sha256 of a whole file, from the cache when its path, size, mtime and ctime are
    unchanged; otherwise read in full (what the background hash of `fingerprint` runs)."""
    return _content_hashes.compute(Path(path))


def weights_id(path: str | os.PathLike[str], fingerprint: str) -> str:
    """What KV snapshots of a model are made from: its fingerprint and a sample of its bytes.

    The fingerprint trusts size, mtime and header until the content hash, made in the
    background and perhaps never in this home (a one-shot turn exits first), says otherwise:
    weights rewritten in place with the mtime put back (`touch -r`, a copy that kept it) keep
    all three. So every store of snapshots is opened under this id, on every load: each file
    of the model (every part of a split GGUF, every shard of an MLX folder) read in
    `_SAMPLE_BLOCKS` blocks evenly spread from its first byte to its last, whole when it is
    no larger, hashed with its size. Snapshots made from other weights then fail the store's
    check and are dropped; a change that misses every block is left to the content hash,
    which names the file apart once done (`fingerprint`)."""
    model = Path(path)
    files = sorted(model.glob("*.safetensors")) if model.is_dir() else _parts(model)
    digest = hashlib.sha256(b"stoke-weights-1")
    for file in files:
        with file.open("rb", buffering=0) as fh:
            size = os.fstat(fh.fileno()).st_size
            digest.update(f"{size}:".encode())
            if size <= _SAMPLE_BLOCKS * _SAMPLE_BLOCK:
                while chunk := fh.read(_HASH_CHUNK):
                    digest.update(chunk)
                continue
            last = size - _SAMPLE_BLOCK
            for n in range(_SAMPLE_BLOCKS):
                at = last * n // (_SAMPLE_BLOCKS - 1)
                digest.update(os.pread(fh.fileno(), _SAMPLE_BLOCK, at))
    return f"{fingerprint}-{digest.hexdigest()[:16]}"


def _quick(file: Path) -> str:
    """The fingerprint from sizes, mtimes and headers alone (names left out: a rename keeps it)."""
    digest = hashlib.sha256(_FORMAT)
    for n, part in enumerate(_parts(file)):
        st = part.stat()
        digest.update(f"{n}:{st.st_size}:{st.st_mtime_ns}:".encode())
        digest.update(_header_digest(part))
    return digest.hexdigest()[:16]


def _parts(file: Path) -> list[Path]:
    """Every part of a split GGUF (`name-00001-of-00003.gguf`) that exists, else the file."""
    match = _SPLIT.match(file.name)
    if match is None:
        return [file]
    count = int(match["count"])
    parts = (
        file.with_name(f"{match['stem']}-{n:05d}-of-{count:05d}.gguf") for n in range(1, count + 1)
    )
    return [file, *(p for p in parts if p != file and p.exists())]


def _header_digest(file: Path) -> bytes:
    """sha256 of a GGUF's header (everything before the tensor data); of the first MiB for a
    file that is not a readable GGUF, whose checks fail later with their own words."""
    try:
        with open_header(file) as header:
            return hashlib.sha256(header.view[: header.end]).digest()
    except (ValueError, OSError):
        with file.open("rb") as fh:
            return hashlib.sha256(fh.read(1 << 20)).digest()


def _folder_fingerprint(folder: Path) -> str:
    digest = hashlib.sha256(_FORMAT + (folder / "config.json").read_bytes())
    for shard in sorted(folder.glob("*.safetensors")):
        st = shard.stat()
        digest.update(f"{shard.name}:{st.st_size}:{st.st_mtime_ns}:".encode())
        with shard.open("rb") as fh:
            raw = fh.read(8)
            (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (0,)
            digest.update(fh.read(min(length, _SAFETENSORS_HEADER_MAX)))
    return digest.hexdigest()[:16]


class _ContentHashes:
    """Full-content hashes of model files, cached in the cache dir by (path, size, mtime,
    ctime): weights rewritten in place keep size and (put back) mtime, but not the ctime.

    `owners` remembers, for each cheap fingerprint, the content of the first file hashed under
    it; a later file with the same cheap fingerprint but other content is a different model
    that only looks the same, and is named by its content from then on. Until its hash is done
    it shares the first one's KV folder, which is then emptied (a cache: it costs a prefill).
    A hash in the background keeps to the cache dir of the call that started it, even if
    STOKE_HOME names another home by the time it is done.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[Path] = set()

    @staticmethod
    def _read(cache: Path) -> dict[str, Any]:
        return HASHES_FILE.read(cache / _CACHE_NAME).value

    def resolve(self, file: Path, quick: str, hash_content: bool) -> str:
        """The fingerprint of `file` whose cheap part is `quick`; starts its hash if unknown."""
        real = file.resolve()
        cache = paths.cache_dir(create=False)
        data = self._read(cache)
        entry = data["files"].get(str(real))
        stamp = _stamp(real)
        if entry is not None and entry.get("stamp") == stamp and entry.get("quick") == quick:
            owner = data["owners"].get(quick)
            if owner is None or owner == entry["sha256"]:
                return quick
            return hashlib.sha256(f"{quick}:{entry['sha256']}".encode()).hexdigest()[:16]
        if hash_content:
            self._start(real, cache)
        return quick

    def _start(self, real: Path, cache: Path) -> None:
        with self._lock:
            if real in self._running:
                return
            self._running.add(real)
        threading.Thread(
            target=self._background, args=(real, cache), name="model-content-hash", daemon=True
        ).start()

    def _background(self, real: Path, cache: Path) -> None:
        """Hash at the lowest CPU priority, so a turn on the CPU never waits for it."""
        with contextlib.suppress(OSError, AttributeError):  # Linux names threads by id
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            self.compute(real, cache)
        except (OSError, paths.ReadOnlyError) as exc:
            logger.info("content hash of %s not kept: %s", real, exc)
        finally:
            with self._lock:
                self._running.discard(real)

    def compute(self, file: Path, cache: Path | None = None) -> str:
        """The file's sha256, kept in `cache` (this home's cache dir when None)."""
        cache = cache or paths.cache_dir(create=False)
        real = file.resolve()
        stamp = _stamp(real)
        entry = self._read(cache)["files"].get(str(real))
        if entry is not None and entry.get("stamp") == stamp:
            return entry["sha256"]
        digest = _hash_file(real)
        if _stamp(real) != stamp:  # changed while read: its next fingerprint starts again
            return digest
        quick = _quick(real)
        with self._lock:
            data = self._read(cache)
            data["files"][str(real)] = {"stamp": stamp, "quick": quick, "sha256": digest}
            owner = data["owners"].setdefault(quick, digest)
            paths.write_private(
                paths.ensure_dir(cache, "cache") / _CACHE_NAME, json.dumps(data, indent=1)
            )
        if owner != digest:
            logger.warning(
                "%s looks like another model (same size, date and tensor layout) but its "
                "weights differ: its KV snapshots are kept apart from the next load",
                real,
            )
            shutil.rmtree(cache / "kv" / quick, ignore_errors=True)
        return digest


def _stamp(file: Path) -> list[int]:
    """What a cached hash is kept by: size, mtime and ctime (a write or `touch -r` moves it;
    entries without it, from before, are hashed again once)."""
    st = file.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _hash_file(file: Path) -> str:
    """sha256 of the whole file, dropping what it read from the page cache as it goes (pages
    the engine has mapped stay), so hashing 150 GB does not push the model out of RAM."""
    digest = hashlib.sha256()
    with file.open("rb", buffering=0) as fh:
        fd, done = fh.fileno(), 0
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, done, len(chunk), os.POSIX_FADV_DONTNEED)
            done += len(chunk)
    return digest.hexdigest()


_SHA256 = Value(matching("[0-9a-f]{64}"), "a sha256")
# The content hashes (model-hashes.json, a cache): a damaged entry is dropped and hashed again.
HASHES_FILE = Stored(
    Fields(
        {
            "version": Value(one_of(1), "1 (this Stoke's format)"),
            "files": Entries(
                Fields(
                    {
                        "stamp": Value(of_type(tuple[int, ...]), "a size and its times"),
                        "quick": Value(text, "a fingerprint"),
                        "sha256": _SHA256,
                    },
                    required=("stamp", "quick", "sha256"),
                )
            ),
            "owners": Entries(_SHA256),
        },
        required=("version", "files", "owners"),
    ),
    keep=False,
    empty=lambda: {"version": 1, "files": {}, "owners": {}},
)
_content_hashes = _ContentHashes()


def gguf_architecture(path: str | os.PathLike[str]) -> str | None:
    """`general.architecture` of a GGUF, read from the first metadata entries only (it is
    written first), so choosing an engine never walks a whole vocabulary."""
    try:
        with open_header(path) as header:
            for entry in itertools.islice(header.entries(), _ARCH_WITHIN):
                if entry.key == "general.architecture":
                    value = header.value(entry)
                    return value if isinstance(value, str) else None
    except HeaderError:
        return None
    return None


def tokenizer_fingerprint(path: str | os.PathLike[str]) -> str:
    """What a model's token ids mean, named by a hash: a GGUF's `tokenizer.ggml.*` metadata
    (vocabulary, types, merges, special ids) as stored, an MLX folder's tokenizer.json. Two
    models with the same one can check each other's tokens (a draft model and its target)."""
    file = Path(path).expanduser()
    digest = hashlib.sha256(b"stoke-tokenizer-1")
    if file.is_dir():
        digest.update((file / "tokenizer.json").read_bytes())
        return digest.hexdigest()[:16]
    file = _parts(check_gguf(file))[0]
    try:
        with open_header(file) as header:
            for entry in header.entries():
                if entry.key.startswith("tokenizer.ggml."):  # its key, type and value
                    digest.update(header.view[entry.start + 8 : entry.end])
    except HeaderError as exc:
        raise ModelLoadError(
            f"{file.name} is truncated or damaged: its GGUF header cannot be read. "
            "Download it again."
        ) from exc
    return digest.hexdigest()[:16]
