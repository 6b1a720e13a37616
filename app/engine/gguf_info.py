"""What a GGUF holds, read from its header alone: the facts an offload planner places by.

A 150 GB model must be sized before anything loads it, so this reads metadata and tensor
infos from the memory-mapped header (gguf_header.py: the vocabulary is stepped over, not
decoded) and never touches tensor data. Split models
(`name-00001-of-00004.gguf`) are read as one model across all their parts.
"""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from app.engine.gguf_header import GGUFHeader, HeaderError, open_header
from app.engine.model_file import check_gguf
from app.engine.protocol import ModelLoadError

TensorKind = Literal[
    "expert", "shared_expert", "attention", "ffn_dense", "norm", "embedding", "output", "other"
]

_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_MAX_ARRAY = 1024  # per-layer arrays are kept in `metadata`; vocabularies are not


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the file lays it out. `shape` is in ggml order (ne0 first), as
    llama.cpp prints it; `offset` is absolute within `GGUFInfo.files[part]`."""

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    n_bytes: int
    offset: int
    layer: int | None
    kind: TensorKind
    part: int


@dataclass(frozen=True)
class GGUFInfo:
    """A model's architecture, sizes and tensors, from every part of the file."""

    path: Path
    files: tuple[Path, ...]
    architecture: str
    name: str | None
    block_count: int | None
    context_length: int | None
    embedding_length: int | None
    expert_count: int | None
    expert_used_count: int | None
    file_type: str | None
    vocab_size: int | None
    metadata: Mapping[str, object]
    tensors: tuple[TensorInfo, ...]

    @property
    def total_bytes(self) -> int:
        """The weights' bytes (what memory must hold)."""
        return sum(t.n_bytes for t in self.tensors)

    @property
    def file_bytes(self) -> int:
        """The files' bytes on disk, as every other place that names a model's size counts
        it (the weights plus the header and vocabulary); the weights' bytes for a layout
        whose files are not here."""
        try:
            return sum(f.stat().st_size for f in self.files)
        except OSError:
            return self.total_bytes

    def bytes_by_kind(self) -> dict[TensorKind, int]:
        totals: dict[TensorKind, int] = defaultdict(int)
        for t in self.tensors:
            totals[t.kind] += t.n_bytes
        return dict(totals)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (file names only, a tensor per row), so a layout ships as data and
        loads without pickle."""
        return {
            "format": LAYOUT_FORMAT,
            **{f: getattr(self, f) for f in _SCALARS},
            "files": [p.name for p in self.files],
            "metadata": dict(sorted(self.metadata.items())),
            "tensor_fields": list(_TENSOR_FIELDS),
            "tensors": [[getattr(t, f) for f in _TENSOR_FIELDS] for t in self.tensors],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GGUFInfo:
        """The inverse of `to_dict`; raises ValueError for data of another format."""
        if (data.get("format"), data.get("tensor_fields")) != (LAYOUT_FORMAT, [*_TENSOR_FIELDS]):
            raise ValueError(f"not a GGUF layout of format {LAYOUT_FORMAT}")
        files = tuple(Path(name) for name in data["files"])
        tensors = tuple(
            TensorInfo(**dict(zip(_TENSOR_FIELDS, _tuples(row), strict=True)))
            for row in data["tensors"]
        )
        scalars = {f: data[f] for f in _SCALARS}
        metadata = {k: _tuples(v) for k, v in data["metadata"].items()}
        return cls(path=files[0], files=files, metadata=metadata, tensors=tensors, **scalars)

    def bytes_by_layer(self, kind: TensorKind | None = None) -> dict[int, int]:
        """Bytes of each block (optionally of one kind); tensors outside blocks are left out."""
        totals: dict[int, int] = defaultdict(int)
        for t in self.tensors:
            if t.layer is not None and (kind is None or t.kind == kind):
                totals[t.layer] += t.n_bytes
        return dict(sorted(totals.items()))


LAYOUT_FORMAT = 1  # of GGUFInfo.to_dict
_SCALARS = (
    "architecture",
    "name",
    "block_count",
    "context_length",
    "embedding_length",
    "expert_count",
    "expert_used_count",
    "file_type",
    "vocab_size",
)
_TENSOR_FIELDS = tuple(f.name for f in fields(TensorInfo))


def _tuples(value: Any) -> Any:
    """JSON arrays back to the tuples the header reader gives."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def classify(name: str) -> TensorKind:
    """The role of a tensor, from llama.cpp's naming conventions (`blk.N.ffn_up_exps.weight`).

    "expert" is exactly what an `_exps.` override moves; routers (`ffn_gate_inp`, `exp_probs_b`,
    `ffn_gate_tid2eid`) and hyper-connection mixers (`hc_*`) stay with their block as "other".
    """
    base = _BLOCK.sub("", name).removesuffix(".weight").removesuffix(".bias")
    leaf = base.rsplit(".", 1)[-1]
    if "_exps" in base:
        return "expert"
    if "_shexp" in base:
        return "shared_expert"
    if "norm" in leaf:
        return "norm"
    if "token_embd" in base or leaf == "embed_tokens":
        return "embedding"
    if base == "output" or base.startswith("output_") or leaf == "shared_head_head":
        return "output"
    if base.startswith(("attn_", "indexer")):
        return "attention"
    if base in ("ffn_gate", "ffn_up", "ffn_down", "ffn_gate_up"):
        return "ffn_dense"
    return "other"


def split_parts(path: Path) -> tuple[Path, ...]:
    """All parts of a split model given any one of them; a single-file model is its own part."""
    match = _SPLIT.match(path.name)
    if match is None:
        return (path,)
    count = int(match["count"])
    parts = tuple(
        path.with_name(f"{match['stem']}-{no:05d}-of-{count:05d}.gguf")
        for no in range(1, count + 1)
    )
    missing = [p.name for p in parts if not p.exists()]
    if missing:
        raise ModelLoadError(
            f"{path.name} is one part of a {count}-part model, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing. Download every part into "
            f"{path.parent}."
        )
    return parts


def _damaged(path: Path) -> ModelLoadError:
    return ModelLoadError(
        f"{path.name} is truncated or damaged: its GGUF header cannot be read. Download it again."
    )


def _tensors(header: GGUFHeader, part: int, file_size: int, path: Path) -> list[TensorInfo]:
    tensors = []
    data_offset = header.data_offset
    for entry in header.tensors():
        name = entry.name
        try:
            qtype = GGMLQuantizationType(entry.ggml_type)
        except ValueError as exc:
            raise ModelLoadError(
                f"{path.name}: tensor {name} has ggml type {entry.ggml_type}, which this "
                "version of Stoke does not know. Update Stoke or choose another file."
            ) from exc
        block, type_size = GGML_QUANT_SIZES[qtype]
        shape = entry.dims
        n_bytes = math.prod(shape) * type_size // block
        offset = data_offset + entry.offset
        if offset + n_bytes > file_size:
            raise ModelLoadError(
                f"{path.name} is truncated: tensor {name} ends at byte {offset + n_bytes:,} "
                f"but the file has {file_size:,} bytes. Download it again."
            )
        layer = _BLOCK.match(name)
        tensors.append(
            TensorInfo(
                name=name,
                ggml_type=qtype.name,
                shape=shape,
                n_bytes=n_bytes,
                offset=offset,
                layer=int(layer[1]) if layer else None,
                kind=classify(name),
                part=part,
            )
        )
    return tensors


def _file_type(value: object) -> str | None:
    if not isinstance(value, int):
        return None
    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return str(value)


def inspect_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read a GGUF model's header (every part of a split model); raises ModelLoadError."""
    first = Path(path).expanduser()
    parts = split_parts(first)
    metadata: dict[str, object] = {}
    tensors: list[TensorInfo] = []
    vocab_size = None
    for index, part in enumerate(parts):
        check_gguf(part)
        try:
            with open_header(part) as header:
                for entry in header.entries():
                    if entry.key == "tokenizer.ggml.tokens":
                        vocab_size = entry.count
                    value = header.value(entry, _MAX_ARRAY)
                    if value is not None:
                        metadata.setdefault(entry.key, value)
                tensors.extend(_tensors(header, index, part.stat().st_size, part))
        except HeaderError:
            raise _damaged(part) from None
        except OSError as exc:
            raise ModelLoadError(f"Cannot read the model file {part}: {exc.strerror}.") from exc
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{first.name} has no general.architecture: it is not a model file.")

    def number(key: str) -> int | None:
        value = metadata.get(f"{arch}.{key}")
        return int(value) if isinstance(value, int) else None

    name = metadata.get("general.name")
    return GGUFInfo(
        path=parts[0],
        files=parts,
        architecture=arch,
        name=name if isinstance(name, str) else None,
        block_count=number("block_count"),
        context_length=number("context_length"),
        embedding_length=number("embedding_length"),
        expert_count=number("expert_count"),
        expert_used_count=number("expert_used_count"),
        file_type=_file_type(metadata.get("general.file_type")),
        vocab_size=vocab_size,
        metadata=metadata,
        tensors=tuple(tensors),
    )
