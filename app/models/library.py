"""The local model library: Stoke's models folder plus folders the user adds.

Models are 80-160 GB in one or many files, so the library never moves bytes it does not have
to and never re-reads what it has seen: a scan inspects only headers (GGUF metadata, MLX
config and safetensors headers) and remembers each result keyed by the files' paths, sizes
and mtimes, so rescanning a large library costs a few `stat` calls. A model's id is its
fingerprint, the same one the engine names its KV snapshots by, so deleting a model can
delete its snapshots too.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import struct
import typing
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from app import paths
from app.engine.choice import platform_choice
from app.engine.gguf_info import inspect_gguf
from app.engine.images import find_projector, is_projector
from app.engine.model_file import fingerprint
from app.engine.protocol import ModelLoadError
from app.models import load_settings
from app.models.default import default_model_path
from app.models.names import model_name
from app.stored import Entries, Fields, Items, Stored, Value, of_type, one_of, text
from app.units import decimal_bytes

ModelFormat = Literal["gguf", "mlx"]
ImportMode = Literal["copy", "move", "link"]

_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_LIBRARY_VERSION = 1
_CACHE_VERSION = 2  # 2: fingerprints from sizes, mtimes and whole headers
_SAFETENSORS_HEADER_MAX = 100 << 20  # safetensors' own limit on a header


class LibraryError(Exception):
    """A library operation failed; the message is written for the user."""


@dataclass(frozen=True)
class ModelEntry:
    """One model on disk, as the Models page and `stoke models list` show it."""

    id: str  # the fingerprint: stable across renames and moves
    name: str
    path: Path  # the first GGUF part, or the MLX folder
    files: tuple[Path, ...]
    format: ModelFormat
    architecture: str | None
    parameters: int | None
    quantization: str | None
    context_length: int | None
    size_bytes: int
    chat_template: bool
    expert_count: int | None
    linked: bool  # a symlink into the library: deleting it leaves the target alone
    bundled: bool = False  # the default model shipped with Stoke: listed, never moved or deleted
    # a GGUF's vision projector (the `*mmproj*.gguf` beside it): it reads images
    projector: Path | None = None

    @property
    def fingerprint(self) -> str:
        return self.id

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["path"] = str(self.path)
        data["files"] = [str(f) for f in self.files]
        data["projector"] = str(self.projector) if self.projector else None
        data["fingerprint"] = self.id
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelEntry:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["path"] = Path(known["path"])
        known["files"] = tuple(Path(f) for f in known["files"])
        if known.get("projector"):
            known["projector"] = Path(known["projector"])
        return cls(**known)


@dataclass(frozen=True)
class Problem:
    """A file or folder the scan found but could not list as a model, and why."""

    path: Path
    message: str


@dataclass(frozen=True)
class Deletion:
    """What deleting a model would remove, measured on disk, for a confirmation in words."""

    files: tuple[tuple[Path, int], ...]  # each file with its size (0 when it is already gone)
    link_target: Path | None  # a linked model's target, which deleting leaves alone
    kv_folder: Path  # where the model's KV snapshots are filed
    kv_files: int
    kv_bytes: int


def disk_free(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _stamp(files: tuple[Path, ...]) -> list[list[Any]]:
    stamps = []
    for file in files:
        st = file.stat()
        stamps.append([str(file), st.st_size, st.st_mtime_ns])
    return stamps


# --- inspection ---------------------------------------------------------------------------------


def _gguf_entry(first: Path) -> ModelEntry:
    info = inspect_gguf(first)
    files = info.files
    return ModelEntry(
        id=fingerprint(first, hash_content=False),
        name=model_name(first),
        path=first,
        files=info.files,
        format="gguf",
        architecture=info.architecture,
        parameters=sum(math.prod(t.shape) for t in info.tensors) or None,
        quantization=info.file_type,
        context_length=info.context_length,
        size_bytes=sum(f.stat().st_size for f in files),
        chat_template=isinstance(info.metadata.get("tokenizer.chat_template"), str),
        expert_count=info.expert_count,
        linked=any(f.is_symlink() for f in files),
    )


def _safetensors_header(file: Path) -> dict[str, Any]:
    with file.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise LibraryError(f"{file.name} is truncated: it has no safetensors header.")
        (length,) = struct.unpack("<Q", raw)
        if length > _SAFETENSORS_HEADER_MAX:
            raise LibraryError(f"{file.name} is not a safetensors file (header of {length} bytes).")
        try:
            header = json.loads(fh.read(length))
        except ValueError as exc:
            raise LibraryError(f"{file.name} has a damaged safetensors header.") from exc
    if not isinstance(header, dict):
        raise LibraryError(f"{file.name} has a damaged safetensors header.")
    return header


def _mlx_parameters(headers: list[dict[str, Any]], bits: int | None) -> int | None:
    """Parameters from tensor shapes; a quantized weight packs 32/bits values per uint32, and
    its scales and biases are bookkeeping, not parameters."""
    tensors = {k: v for h in headers for k, v in h.items() if k != "__metadata__"}
    total = 0
    for name, spec in tensors.items():
        base, _, leaf = name.rpartition(".")
        if leaf in ("scales", "biases") and f"{base}.weight" in tensors and bits:
            continue
        count = math.prod(spec.get("shape", []))
        if bits and spec.get("dtype") == "U32":
            count = count * 32 // bits
        total += count
    return total or None


def _mlx_entry(folder: Path) -> ModelEntry:
    config_path = folder / "config.json"
    try:
        config_bytes = config_path.read_bytes()
        config = json.loads(config_bytes)
    except (OSError, ValueError) as exc:
        raise LibraryError(f"{folder.name}: config.json cannot be read ({exc}).") from exc
    if not isinstance(config, dict):
        raise LibraryError(f"{folder.name}: config.json is not a model configuration.")
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise LibraryError(f"{folder.name} has a config.json but no .safetensors weights.")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    quant = config.get("quantization") or config.get("quantization_config") or {}
    bits = quant.get("bits") if isinstance(quant, dict) else None
    headers = [_safetensors_header(s) for s in shards]
    dtypes = [
        spec.get("dtype")
        for h in headers
        for k, spec in h.items()
        if k != "__metadata__" and k.endswith(".weight")
    ]
    if isinstance(bits, int):
        quantization = f"{bits}bit"
    else:
        quantization = max(set(dtypes), key=dtypes.count) if dtypes else None
    architectures = config.get("architectures") or [None]
    tokenizer = folder / "tokenizer_config.json"
    try:
        has_template = "chat_template" in json.loads(tokenizer.read_text("utf-8"))
    except (OSError, ValueError, TypeError):
        has_template = False
    has_template = has_template or any(
        (folder / n).exists() for n in ("chat_template.jinja", "chat_template.json")
    )
    files = _mlx_files(folder)
    experts = config.get("n_routed_experts") or config.get("num_experts")
    return ModelEntry(
        id=fingerprint(folder, hash_content=False),
        name=model_name(folder),
        path=folder,
        files=files,
        format="mlx",
        architecture=config.get("model_type") or architectures[0],
        parameters=_mlx_parameters(headers, bits if isinstance(bits, int) else None),
        quantization=quantization,
        context_length=config.get("max_position_embeddings") or text.get("max_position_embeddings"),
        size_bytes=sum(f.stat().st_size for f in files),
        chat_template=has_template,
        expert_count=experts if isinstance(experts, int) else None,
        linked=folder.is_symlink(),
    )


def _is_mlx_dir(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _inspect(kind: ModelFormat, first: Path) -> ModelEntry:
    """One model from its files; every failure becomes a LibraryError with the reason."""
    try:
        if kind == "mlx":
            return _mlx_entry(first)
        match = _SPLIT.match(first.name)
        if match and int(match["no"]) != 1:
            raise LibraryError(
                f"{first.name} is not the first part of its model; "
                f"{match['stem']}-00001-of-{match['count']}.gguf is missing."
            )
        return _gguf_entry(first)
    except ModelLoadError as exc:
        raise LibraryError(str(exc)) from exc
    except OSError as exc:
        raise LibraryError(f"Cannot read {first}: {exc.strerror or exc}.") from exc


def _with_projector(entry: ModelEntry) -> ModelEntry:
    """The entry with the projector beside it now (looked for on every scan: one may be
    added or removed without the model's files changing)."""
    if entry.format != "gguf":
        return entry
    return replace(entry, projector=find_projector(entry.path))


def _candidates(root: Path) -> Iterator[tuple[ModelFormat, Path, tuple[Path, ...]]]:
    """(kind, first path, every file) of each model-like thing under `root`.

    Hidden files and folders are skipped: imports and downloads in progress live there.
    Symlinked folders are followed once (linked imports), never in a loop.
    """
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        here = Path(dirpath)
        real = os.path.realpath(here)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        if _is_mlx_dir(here):
            dirnames[:] = []
            files = tuple(sorted(here / f for f in filenames if not f.startswith(".")))
            yield "mlx", here, files
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        splits: dict[tuple[str, str], list[Path]] = {}
        for name in sorted(filenames):
            if name.startswith(".") or not name.endswith(".gguf") or is_projector(here / name):
                continue  # a projector is part of the model beside it (`ModelEntry.projector`)
            match = _SPLIT.match(name)
            if match is None:
                yield "gguf", here / name, (here / name,)
            else:
                splits.setdefault((match["stem"], match["count"]), []).append(here / name)
        for parts in splits.values():
            yield "gguf", parts[0], tuple(parts)


# --- the library ------------------------------------------------------------------------------


class Library:
    """The models Stoke knows, their per-model load settings, and the operations on them."""

    def __init__(self) -> None:
        # not created here: listing a read-only library must not need to write
        self._config_path = paths.config_dir(create=False) / "library.json"
        self._cache_path = paths.cache_dir(create=False) / "library-scan.json"
        self.problems: list[Problem] = []

    # settings file

    def _load(self) -> dict[str, Any]:
        return {**LIBRARY_FILE.empty(), **LIBRARY_FILE.read(self._config_path).value}

    def _save(self, data: dict[str, Any]) -> None:
        paths.config_dir()
        paths.write_private(self._config_path, json.dumps(data, indent=2))

    def _load_cache(self) -> dict[str, Any]:
        return SCAN_FILE.read(self._cache_path).value["models"]

    def _save_cache(self, models: dict[str, Any]) -> None:
        """Best effort: a scan that cannot be remembered (a read-only folder) is redone."""
        text = json.dumps({"version": _CACHE_VERSION, "models": models}, indent=2)
        with contextlib.suppress(OSError, paths.ReadOnlyError):
            paths.cache_dir()
            paths.write_private(self._cache_path, text)

    # folders

    def folders(self) -> list[Path]:
        """Stoke's models folder first, then the user's folders in the order they were added."""
        return [paths.models_dir(create=False), *(Path(f) for f in self._load()["folders"])]

    def add_folder(self, folder: str | os.PathLike[str]) -> Path:
        path = Path(folder).expanduser().resolve()
        if not path.is_dir():
            raise LibraryError(f"{path} is not a folder.")
        data = self._load()
        if path in self.folders():
            raise LibraryError(f"{path} is already a library folder.")
        data["folders"].append(str(path))
        self._save(data)
        return path

    def remove_folder(self, folder: str | os.PathLike[str]) -> None:
        """Stop listing a folder's models; its files stay where they are."""
        path = Path(folder).expanduser().resolve()
        data = self._load()
        if str(path) not in data["folders"]:
            raise LibraryError(f"{path} is not one of the folders you added.")
        data["folders"].remove(str(path))
        self._save(data)

    # scanning

    def models(self) -> list[ModelEntry]:
        """Every model in every library folder; what could not be read goes to `problems`."""
        cache = self._load_cache()
        fresh: dict[str, Any] = {}
        entries: list[ModelEntry] = []
        problems: list[Problem] = []
        for root in self.folders():
            if not root.is_dir():
                if root != paths.models_dir(create=False):  # Stoke's own: no models yet
                    problems.append(Problem(root, f"The library folder {root} is not available."))
                continue
            for kind, first, files in _candidates(root):
                key = str(first)
                try:
                    stamp = _stamp(files)
                except OSError as exc:
                    problems.append(Problem(first, f"Cannot read {first}: {exc.strerror}."))
                    continue
                record = cache.get(key)
                if record is None or record.get("stamp") != stamp:
                    try:
                        record = {"stamp": stamp, "entry": _inspect(kind, first).to_dict()}
                    except LibraryError as exc:
                        record = {"stamp": stamp, "error": str(exc)}
                fresh[key] = record
                if "error" in record:
                    problems.append(Problem(first, record["error"]))
                else:
                    entries.append(_with_projector(ModelEntry.from_dict(record["entry"])))
        if fresh != cache:
            self._save_cache(fresh)
        self.problems = problems
        return entries

    def bundled(self) -> ModelEntry | None:
        """The default model shipped with Stoke (None when its package is missing)."""
        try:
            path = default_model_path()
            stamp = _stamp((path,))
        except (ImportError, OSError):  # the package is not installed, or lost its file
            return None
        if _bundled_memo.get("stamp") != stamp:
            try:
                entry = replace(_inspect("gguf", path), bundled=True)
            except LibraryError:
                return None
            _bundled_memo.update(stamp=stamp, entry=entry)
        return _bundled_memo["entry"]

    def listed(self) -> list[ModelEntry]:
        """What the Models page, the model picker and `stoke models list` show: the library's
        models and the bundled one (read-only), unless a library copy of that name shadows it."""
        bundled = self.bundled()
        models = self.models()
        if bundled is None or any(m.name == bundled.name for m in models):
            return models
        return [*models, bundled]

    def get(self, ref: str) -> ModelEntry:
        """A model by id (or a unique id prefix), name, or path; the bundled model when no
        library model matches."""
        try:
            return self._find(self.models(), ref)
        except LibraryError:
            bundled = self.bundled()
            if bundled is None:
                raise
            return self._find([bundled], ref)

    @staticmethod
    def _find(models: list[ModelEntry], ref: str) -> ModelEntry:
        path = Path(ref).expanduser()
        resolved = path.resolve() if path.exists() else None
        for test in (
            lambda m: m.id == ref,
            lambda m: m.name == ref,
            lambda m: (
                resolved is not None and any(f.resolve() == resolved for f in (m.path, *m.files))
            ),
            lambda m: len(ref) >= 4 and m.id.startswith(ref),
        ):
            found = [m for m in models if test(m)]
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                where = ", ".join(str(m.path) for m in found)
                raise LibraryError(f"{ref!r} matches {len(found)} models ({where}); use a path.")
        raise LibraryError(
            f"No model {ref!r} in the library. `stoke models list` shows what is there."
        )

    def total_size(self) -> int:
        """Bytes the library's own files take; linked models live elsewhere and count 0."""
        seen: set[Path] = set()
        total = 0
        for model in self.models():
            if model.linked or model.path in seen:
                continue
            seen.add(model.path)
            total += model.size_bytes
        return total

    def _remember(self, model: ModelEntry) -> ModelEntry:
        cache = self._load_cache()
        cache[str(model.path)] = {
            "stamp": _stamp(model.files if model.format == "gguf" else _mlx_files(model.path)),
            "entry": model.to_dict(),
        }
        self._save_cache(cache)
        return model

    def _forget(self, model: ModelEntry) -> None:
        cache = self._load_cache()
        if cache.pop(str(model.path), None) is not None:
            self._save_cache(cache)

    # operations

    def import_model(self, source: str | os.PathLike[str], mode: ImportMode = "copy") -> ModelEntry:
        """Bring a GGUF (every part of a split set) or an MLX folder into the models folder.

        The source is inspected first, so a truncated or foreign file is refused with the
        inspector's reason before a byte is copied; a copy lands under a hidden name and is
        renamed only once complete, so an interrupted import never looks like a model.
        """
        src = Path(source).expanduser()
        if not src.exists():
            raise LibraryError(f"{src} does not exist.")
        kind: ModelFormat = "mlx" if src.is_dir() else "gguf"
        if kind == "mlx" and not _is_mlx_dir(src):
            raise LibraryError(
                f"{src} is a folder but not an MLX model (config.json plus .safetensors)."
            )
        if kind == "gguf" and _SPLIT.match(src.name):
            match = _SPLIT.match(src.name)
            assert match is not None
            src = src.with_name(f"{match['stem']}-00001-of-{match['count']}.gguf")
        model = _inspect(kind, src)
        sources = (src,) if kind == "mlx" else model.files
        target_dir = paths.models_dir()
        for root in self.folders():
            if any(p.resolve().is_relative_to(root.resolve()) for p in sources):
                raise LibraryError(f"{src.name} is already in the library (in {root}).")
        targets = tuple(target_dir / p.name for p in sources)
        taken = [t.name for t in targets if t.exists() or t.is_symlink()]
        if taken:
            raise LibraryError(
                f"The library already has {', '.join(taken)}. Rename or delete that model first."
            )
        same_disk = os.stat(src).st_dev == os.stat(target_dir).st_dev
        if mode == "copy" or (mode == "move" and not same_disk):
            needed, free = model.size_bytes, disk_free(target_dir)
            if needed > free:
                raise LibraryError(
                    f"Not enough disk space to import {model.name}: it needs "
                    f"{decimal_bytes(needed)}, {decimal_bytes(free)} free on {target_dir}."
                )
        rename = mode == "move" and same_disk
        placed: list[tuple[Path, Path]] = []
        try:
            for path, target in zip(sources, targets, strict=True):
                _place(path, target, "link" if mode == "link" else "move" if rename else "copy")
                placed.append((path, target))
        except OSError as exc:
            for path, target in reversed(placed):  # undo, so nothing is half-imported or lost
                if rename:
                    os.replace(target, path)
                else:
                    _remove(target)
            raise LibraryError(f"Importing {model.name} failed: {exc.strerror or exc}.") from exc
        if mode == "move" and not rename:
            for path in sources:
                _remove(path)
        files = (
            [str(t) for t in targets]
            if kind == "gguf"
            else [str(f) for f in _mlx_files(targets[0])]
        )
        placed = {
            **model.to_dict(),
            "path": str(targets[0]),
            "files": files,
            "linked": mode == "link",
        }
        return self._remember(ModelEntry.from_dict(placed))

    def rename(self, ref: str, new_name: str) -> ModelEntry:
        """Rename a model's file(s) or folder in place; its id and settings stay."""
        model = _not_bundled(self.get(ref), "renamed")
        new_name = new_name.strip().removesuffix(".gguf")
        if (
            not new_name
            or new_name.startswith(".")
            or any(c in new_name for c in "/\\\0")
            or _SPLIT.match(f"{new_name}.gguf")
        ):
            raise LibraryError(f"{new_name!r} cannot be a model name.")
        if model.format == "mlx":
            moves = [(model.path, model.path.with_name(new_name))]
        elif len(model.files) == 1:
            moves = [(model.path, model.path.with_name(f"{new_name}.gguf"))]
        else:
            count = len(model.files)
            moves = [
                (f, f.with_name(f"{new_name}-{no:05d}-of-{count:05d}.gguf"))
                for no, f in enumerate(model.files, start=1)
            ]
        taken = [new.name for _, new in moves if new.exists() or new.is_symlink()]
        if taken:
            raise LibraryError(f"{', '.join(taken)} already exists next to {model.name}.")
        done: list[tuple[Path, Path]] = []
        try:
            for old, new in moves:
                os.rename(old, new)
                done.append((old, new))
        except OSError as exc:
            for old, new in reversed(done):
                os.rename(new, old)
            raise LibraryError(f"Renaming {model.name} failed: {exc.strerror or exc}.") from exc
        self._forget(model)
        kind: ModelFormat = model.format
        first = moves[0][1]
        renamed = ModelEntry.from_dict(
            {
                **model.to_dict(),
                "name": new_name,
                "path": str(first),
                "files": [str(new) for _, new in moves]
                if kind == "gguf"
                else [str(first / f.name) for f in model.files],
            }
        )
        return self._remember(renamed)

    def delete(self, ref: str) -> ModelEntry:
        """Delete a model's files and its KV snapshots (unless another copy still uses them).

        A linked model loses only its link: the file it points to is the user's.
        """
        model = _not_bundled(self.get(ref), "deleted")
        try:
            if model.format == "mlx" and not model.path.is_symlink():
                shutil.rmtree(model.path)
            else:
                for file in (model.path,) if model.format == "mlx" else model.files:
                    file.unlink(missing_ok=True)
        except OSError as exc:
            raise LibraryError(f"Deleting {model.name} failed: {exc.strerror or exc}.") from exc
        self._forget(model)
        if not any(m.id == model.id for m in self.models()):
            shutil.rmtree(paths.kv_dir(model.id), ignore_errors=True)
        return model

    def deletion(self, model: ModelEntry) -> Deletion:
        """What `delete` would remove: the files with their sizes and the KV snapshots (read
        here, so the Models page asks before it deletes without touching the disk itself)."""
        files = tuple((f, f.stat().st_size if f.exists() else 0) for f in model.files)
        folder = paths.cache_dir() / "kv" / model.id  # looked at, not created
        snapshots = [f for f in folder.rglob("*") if f.is_file()] if folder.is_dir() else []
        return Deletion(
            files=files,
            link_target=model.path.resolve() if model.linked else None,
            kv_folder=folder,
            kv_files=len(snapshots),
            kv_bytes=sum(f.stat().st_size for f in snapshots),
        )

    # per-model load settings, kept by `app.models.load_settings` under the same fingerprint

    def load_settings(self, ref: str) -> dict[str, Any]:
        """What the wizard or planner chose for this model (n_ctx, n_gpu_layers, overrides...)."""
        model = self.get(ref)
        if model.format != "gguf":
            return {}
        return dict(load_settings.load(model.path) or {})

    def set_load_settings(self, ref: str, settings: Mapping[str, Any]) -> None:
        model = self.get(ref)
        if model.format != "gguf":
            raise LibraryError(
                f"{model.name} is an MLX folder; per-model load settings cover GGUF models."
            )
        try:
            load_settings.save(model.path, dict(settings))
        except (TypeError, ValueError) as exc:
            raise LibraryError(f"Load settings must be plain values: {exc}.") from exc


# The folders the user added (library.json): a wrong one is left out alone.
LIBRARY_FILE = Stored(
    Fields(
        {
            "version": Value(one_of(_LIBRARY_VERSION), f"{_LIBRARY_VERSION} (this Stoke's format)"),
            "folders": Items(Value(lambda v: text(v) and Path(v).is_absolute(), "a full path")),
        }
    ),
    keep=True,
    empty=lambda: {"version": _LIBRARY_VERSION, "folders": []},
)
_ENTRY_HINTS = typing.get_type_hints(ModelEntry)
# What each scan found (library-scan.json, a cache): an entry, or why the file is no model.
SCAN_FILE = Stored(
    Fields(
        {
            "version": Value(one_of(_CACHE_VERSION), f"{_CACHE_VERSION} (this Stoke's format)"),
            "models": Entries(
                Fields(
                    {
                        "stamp": Value(of_type(tuple[tuple[str, int, int], ...]), "file stamps"),
                        "error": Value(text, "a sentence"),
                        "entry": Fields(
                            {
                                **{
                                    f.name: Value(of_type(_ENTRY_HINTS[f.name]), f.type)
                                    for f in fields(ModelEntry)
                                },
                                "fingerprint": Value(text, "an id"),
                            },
                            required=tuple(
                                f.name for f in fields(ModelEntry) if f.default is MISSING
                            ),
                        ),
                    },
                    required=("stamp", ("entry", "error")),
                )
            ),
        },
        required=("version", "models"),
    ),
    keep=False,
    empty=lambda: {"version": _CACHE_VERSION, "models": {}},
)
_bundled_memo: dict[str, Any] = {}  # the bundled model's entry by its file's stamp


def _not_bundled(model: ModelEntry, verb: str) -> ModelEntry:
    if model.bundled:
        raise LibraryError(f"{model.name} comes with Stoke; it cannot be {verb}.")
    return model


def _mlx_files(folder: Path) -> tuple[Path, ...]:
    return tuple(sorted(f for f in folder.iterdir() if f.is_file() and not f.name.startswith(".")))


def _place(src: Path, target: Path, how: ImportMode) -> None:
    """Link, rename (same disk) or copy one file or folder to `target`."""
    if how == "link":
        os.symlink(src.resolve(), target, target_is_directory=src.is_dir())
    elif how == "move":
        os.replace(src, target)
    else:
        hidden = target.with_name(f".{target.name}.importing")
        _remove(hidden)
        try:
            # copy2 keeps the mtime, so the copy keeps the fingerprint: same weights, same KV
            # snapshots and load settings
            if src.is_dir():
                shutil.copytree(src, hidden)
            else:
                shutil.copy2(src, hidden)
            paths.secure_tree(hidden)
            os.replace(hidden, target)
        finally:
            _remove(hidden)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Placement:
    """Which engine runs a library model on this machine (when nobody chose), why, and about
    how much memory its weights take there."""

    engine: str
    reason: str
    memory_bytes: int


def placement(model: ModelEntry) -> Placement:
    """`model`'s `Placement`. Its weights take their size on disk on either engine: the engine
    choice sends a GGUF that MLX would expand (K-quants, IQ types) to llama.cpp, so whatever
    MLX runs it holds compact."""
    choice = platform_choice(model.path)
    return Placement(choice.engine, choice.reason, model.size_bytes)
