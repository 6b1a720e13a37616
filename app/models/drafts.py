"""Which models of the library can draft for another (speculative decoding's draft model):
smaller ones whose tokenizer is the target's, byte for byte (`tokenizer_fingerprint`), so
that their token ids mean the same. The fingerprint is read from each header once per
(path, size, mtime)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path

from app.engine.model_file import tokenizer_fingerprint
from app.engine.protocol import ModelLoadError
from app.models.library import ModelEntry


def compatible_drafts(target: ModelEntry, models: Iterable[ModelEntry]) -> list[ModelEntry]:
    """The models that can draft for `target`, smallest first."""
    wanted = _tokenizer_of(target.path)
    if wanted is None:
        return []
    found = [
        m
        for m in models
        if m.id != target.id
        and m.size_bytes < target.size_bytes
        and _tokenizer_of(m.path) == wanted
    ]
    return sorted(found, key=lambda m: m.size_bytes)


def _tokenizer_of(path: Path) -> str | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return _fingerprint(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _fingerprint(path: str, size: int, mtime_ns: int) -> str | None:
    try:
        return tokenizer_fingerprint(path)
    except (OSError, ModelLoadError):
        return None
