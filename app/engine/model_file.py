"""Checks a model file before a runtime sees it, and names its weights with a fingerprint.

A runtime handed a missing, truncated or foreign file fails with a log line at best; these
checks turn that into a sentence the user can act on.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

from app.engine.protocol import ModelLoadError

GGUF_MAGIC = b"GGUF"
_HEAD_BYTES = 16 << 20  # metadata, tokenizer included, lives at the front of a GGUF
_SAMPLES = 16
_SAMPLE_BYTES = 64 << 10


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
            f"{file} is not a GGUF model file (it starts with {head[:4]!r}). "
            "Stoke's llama.cpp engine loads .gguf files."
        )
    (version,) = struct.unpack("<I", head[4:8])
    if version not in (2, 3):
        raise ModelLoadError(f"{file} is GGUF version {version}, which this engine cannot read.")
    return file


def fingerprint(path: str | os.PathLike[str]) -> str:
    """A stable id of the weights and tokenizer, cheap even for a 150 GB file.

    Hashes the size, the front of the file (header, metadata, tokenizer) and evenly spread
    samples of the tensor data, so a different model or a re-quantization changes it.
    An MLX folder is named by its config and the name, size and head of each shard.
    """
    file = Path(path)
    if file.is_dir():
        return _folder_fingerprint(file)
    size = file.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with file.open("rb") as fh:
        digest.update(fh.read(_HEAD_BYTES))
        if size > _HEAD_BYTES:
            step = (size - _HEAD_BYTES) // _SAMPLES
            for i in range(_SAMPLES):
                fh.seek(_HEAD_BYTES + i * step)
                digest.update(fh.read(_SAMPLE_BYTES))
            fh.seek(max(size - _SAMPLE_BYTES, 0))
            digest.update(fh.read(_SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def _folder_fingerprint(folder: Path) -> str:
    digest = hashlib.sha256((folder / "config.json").read_bytes())
    for shard in sorted(folder.glob("*.safetensors")):
        digest.update(f"{shard.name}:{shard.stat().st_size}".encode())
        with shard.open("rb") as fh:
            digest.update(fh.read(_SAMPLE_BYTES))
    return digest.hexdigest()[:16]


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def gguf_architecture(path: str | os.PathLike[str]) -> str | None:
    """`general.architecture` of a GGUF, read from the first metadata entries only (it is
    written first), so choosing an engine never parses a whole vocabulary."""
    with Path(path).open("rb") as fh:
        if fh.read(4) != GGUF_MAGIC or struct.unpack("<I", fh.read(4))[0] not in (2, 3):
            return None
        _tensors, n_kv = struct.unpack("<QQ", fh.read(16))
        for _ in range(min(n_kv, 64)):
            key = fh.read(struct.unpack("<Q", fh.read(8))[0]).decode("utf-8", "replace")
            (kind,) = struct.unpack("<I", fh.read(4))
            if kind == _STRING:
                value = fh.read(struct.unpack("<Q", fh.read(8))[0])
                if key == "general.architecture":
                    return value.decode("utf-8", "replace")
            elif kind == _ARRAY:
                item, count = struct.unpack("<IQ", fh.read(12))
                if item not in _SCALAR_SIZES:
                    return None  # arrays of strings come after the architecture
                fh.seek(count * _SCALAR_SIZES[item], os.SEEK_CUR)
            elif kind in _SCALAR_SIZES:
                fh.seek(_SCALAR_SIZES[kind], os.SEEK_CUR)
            else:
                return None
    return None
