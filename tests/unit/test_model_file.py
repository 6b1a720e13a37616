"""Model file checks and fingerprints against real files."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from app.engine.model_file import _HEAD_BYTES, check_gguf, fingerprint
from app.engine.protocol import ModelLoadError
from app.models.default import default_model_path


def gguf_header(version: int = 3) -> bytes:
    # magic, version, tensor count, metadata count
    return b"GGUF" + struct.pack("<IQQ", version, 0, 0)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- check_gguf ------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        check_gguf(tmp_path / "nope.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="folder"):
        check_gguf(tmp_path)


def test_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"empty or truncated \(0 bytes\)"):
        check_gguf(write(tmp_path / "empty.gguf", b""))


def test_three_byte_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"truncated \(3 bytes\)"):
        check_gguf(write(tmp_path / "short.gguf", b"GGU"))


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = write(tmp_path / "model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        check_gguf(path)


def test_unsupported_gguf_version(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="version 99"):
        check_gguf(write(tmp_path / "future.gguf", gguf_header(99)))


@pytest.mark.parametrize("version", [2, 3])
def test_valid_header_passes(tmp_path: Path, version: int) -> None:
    path = write(tmp_path / "ok.gguf", gguf_header(version))
    assert check_gguf(str(path)) == path


def test_default_model_passes() -> None:
    path = default_model_path()
    assert check_gguf(path) == path


# --- fingerprint -----------------------------------------------------------------------------


def sparse(path: Path, size: int, head: bytes = b"GGUF") -> Path:
    with path.open("wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def poke(path: Path, offset: int, byte: bytes = b"\x01") -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(byte)


def test_fingerprint_is_stable(tmp_path: Path) -> None:
    path = write(tmp_path / "small.gguf", gguf_header() + b"weights")
    first = fingerprint(path)
    assert fingerprint(path) == first
    assert fingerprint(str(path)) == first
    assert re.fullmatch(r"[0-9a-f]{16}", first)


def test_fingerprint_changes_with_content(tmp_path: Path) -> None:
    a = write(tmp_path / "a.gguf", gguf_header() + b"weights")
    b = write(tmp_path / "b.gguf", gguf_header() + b"weighty")
    assert fingerprint(a) != fingerprint(b)


def test_fingerprint_of_big_sparse_file_sees_the_middle(tmp_path: Path) -> None:
    size = _HEAD_BYTES + (32 << 20)  # 48 MiB, sparse
    path = sparse(tmp_path / "big.gguf", size)
    before = fingerprint(path)
    assert fingerprint(path) == before
    middle = size // 2 + 123  # past the 16 MiB head, inside the middle sample
    assert middle > _HEAD_BYTES
    poke(path, middle)
    assert path.stat().st_size == size
    changed = fingerprint(path)
    assert changed != before
    poke(path, middle, b"\x00")
    assert fingerprint(path) == before


def test_fingerprint_of_big_sparse_file_sees_the_head_and_tail(tmp_path: Path) -> None:
    size = _HEAD_BYTES + (8 << 20) + 17
    path = sparse(tmp_path / "big.gguf", size)
    before = fingerprint(path)
    poke(path, _HEAD_BYTES - 1)
    head = fingerprint(path)
    assert head != before
    poke(path, size - 1)
    assert fingerprint(path) not in (before, head)


def test_fingerprint_changes_with_size(tmp_path: Path) -> None:
    small = fingerprint(sparse(tmp_path / "a.gguf", 1000))
    assert fingerprint(sparse(tmp_path / "b.gguf", 1001)) != small
    big = fingerprint(sparse(tmp_path / "c.gguf", _HEAD_BYTES + (4 << 20)))
    # same bytes everywhere it samples (zeros), only the length differs
    assert fingerprint(sparse(tmp_path / "d.gguf", _HEAD_BYTES + (4 << 20) + 1)) != big


def test_default_model_fingerprint() -> None:
    path = default_model_path()
    value = fingerprint(path)
    assert re.fullmatch(r"[0-9a-f]{16}", value)
    assert fingerprint(path) == value
