"""Model file checks and fingerprints against real files."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from app import paths
from app.engine import model_file
from app.engine.model_file import check_gguf, content_hash, fingerprint
from app.engine.protocol import ModelLoadError
from app.models.default import default_model_path

REPO = Path(__file__).resolve().parents[2]


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


def gguf_model(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    """A real GGUF holding `tensors`, so the header walk sees names, shapes, types, offsets."""
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(1)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def big_model(path: Path) -> Path:
    """48 MiB of weights: the old fingerprint sampled 17 places past the first 16 MiB."""
    return gguf_model(path, {"blk.0.ffn.weight": np.zeros((12, 1 << 20), np.float32)})


def poke(path: Path, offset: int, byte: bytes = b"\x01") -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(byte)


def same_stamp(path: Path, like: Path) -> None:
    """Give `path` the mtime of `like`, as `cp -p`, `rsync -t` or `tar` do."""
    st = like.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_fingerprint_is_stable(tmp_path: Path) -> None:
    path = write(tmp_path / "small.gguf", gguf_header() + b"weights")
    first = fingerprint(path, hash_content=False)
    assert fingerprint(path, hash_content=False) == first
    assert fingerprint(str(path), hash_content=False) == first
    assert re.fullmatch(r"[0-9a-f]{16}", first)


def test_fingerprint_changes_with_content(tmp_path: Path) -> None:
    a = write(tmp_path / "a.gguf", gguf_header() + b"weights")
    b = write(tmp_path / "b.gguf", gguf_header() + b"weighty")
    assert fingerprint(a, hash_content=False) != fingerprint(b, hash_content=False)


def test_weights_changed_between_the_old_samples_change_the_fingerprint(tmp_path: Path) -> None:
    """Issue 14, item 12: the old fingerprint kept its value, so old KV met new weights."""
    path = big_model(tmp_path / "big.gguf")
    before = fingerprint(path, hash_content=False)
    size = path.stat().st_size
    poke(path, (16 << 20) + (size - (16 << 20)) // 32)  # between two of the old samples
    assert path.stat().st_size == size
    assert fingerprint(path, hash_content=False) != before


def test_the_tensor_layout_is_in_the_fingerprint(tmp_path: Path) -> None:
    """Same size, same mtime, same bytes of weights: only a name, a type or an offset differ."""
    ones = np.ones((4, 8), np.float32)
    base = gguf_model(tmp_path / "base.gguf", {"a.weight": ones, "b.weight": ones})
    others = [
        gguf_model(tmp_path / "name.gguf", {"a.weight": ones, "c.weight": ones}),
        gguf_model(tmp_path / "order.gguf", {"b.weight": ones, "a.weight": ones}),
        gguf_model(tmp_path / "type.gguf", {"a.weight": ones, "b.weight": ones.view(np.int32)}),
    ]
    prints = set()
    for path in (base, *others):
        assert path.stat().st_size == base.stat().st_size
        same_stamp(path, base)
        prints.add(fingerprint(path, hash_content=False))
    assert len(prints) == 4


def test_a_rename_or_move_keeps_the_fingerprint(tmp_path: Path) -> None:
    path = big_model(tmp_path / "a.gguf")
    before = fingerprint(path, hash_content=False)
    moved = path.rename(tmp_path / "b.gguf")
    assert fingerprint(moved, hash_content=False) == before


def test_every_part_of_a_split_model_is_in_the_fingerprint(tmp_path: Path) -> None:
    ones = np.ones((4, 8), np.float32)
    first = gguf_model(tmp_path / "m-00001-of-00002.gguf", {"a.weight": ones})
    second = gguf_model(tmp_path / "m-00002-of-00002.gguf", {"b.weight": ones})
    before = fingerprint(first, hash_content=False)
    poke(second, second.stat().st_size - 1)
    assert fingerprint(first, hash_content=False) != before


def test_restarts_keep_the_fingerprint_before_and_after_the_content_hash(
    tmp_path: Path, stoke_home: Path
) -> None:
    """It names existing KV folders: a new process on the same file must find them."""
    path = big_model(tmp_path / "model.gguf")
    code = (
        "import sys; from app.engine.model_file import fingerprint; print(fingerprint(sys.argv[1]))"
    )

    def in_a_new_process() -> str:
        return subprocess.run(
            [sys.executable, "-c", code, str(path)],
            cwd=REPO,
            env={**os.environ, "STOKE_HOME": str(stoke_home)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    first = in_a_new_process()
    assert content_hash(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert in_a_new_process() == first == fingerprint(path)


def test_the_content_hash_runs_off_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = big_model(tmp_path / "model.gguf")
    hashed_on: list[int] = []
    real = model_file._hash_file

    def spy(file: Path) -> str:
        hashed_on.append(threading.get_ident())
        return real(file)

    monkeypatch.setattr(model_file, "_hash_file", spy)
    fingerprint(path)  # starts the hash and returns
    for thread in threading.enumerate():
        if thread.name == "model-content-hash":
            thread.join()
    assert hashed_on and threading.get_ident() not in hashed_on
    assert (paths.cache_dir() / "model-hashes.json").stat().st_mode & 0o777 == 0o600


def test_a_background_hash_keeps_to_the_home_that_started_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite switches STOKE_HOME per test while an earlier test's hash may still run: it
    wrote into the next test's home (and raced that test's own setup)."""
    path = big_model(tmp_path / "model.gguf")
    first = paths.cache_dir()
    switched = threading.Event()
    real = model_file._hash_file

    def after_the_switch(file: Path) -> str:
        switched.wait(10)
        return real(file)

    monkeypatch.setattr(model_file, "_hash_file", after_the_switch)
    fingerprint(path)
    monkeypatch.setenv("STOKE_HOME", str(tmp_path / "another-home"))
    switched.set()
    for thread in threading.enumerate():
        if thread.name == "model-content-hash":
            thread.join()
    assert (first / "model-hashes.json").is_file()
    assert not (tmp_path / "another-home").exists()


def test_the_content_hash_is_cached_by_path_size_and_mtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = big_model(tmp_path / "model.gguf")
    first = content_hash(path)
    calls: list[Path] = []
    monkeypatch.setattr(model_file, "_hash_file", lambda file: calls.append(file) or "new")
    assert content_hash(path) == first and calls == []
    os.utime(path, ns=(0, 10**18))
    assert content_hash(path) == "new" and calls == [path.resolve()]


def test_weights_rewritten_in_place_with_the_mtime_put_back_are_hashed_again(
    tmp_path: Path,
) -> None:
    """Size and mtime are what `touch -r` restores; the ctime it cannot (issue 33)."""
    path = big_model(tmp_path / "model.gguf")
    before = content_hash(path)
    kept = tmp_path / "stamp"
    kept.touch()
    same_stamp(kept, path)
    poke(path, path.stat().st_size // 2)
    same_stamp(path, kept)
    assert content_hash(path) == hashlib.sha256(path.read_bytes()).hexdigest() != before


def test_a_copy_with_the_same_mtime_but_other_weights_is_told_apart(tmp_path: Path) -> None:
    original = big_model(tmp_path / "original.gguf")
    kept = fingerprint(original, hash_content=False)
    content_hash(original)  # the first file hashed under this cheap fingerprint
    copy = tmp_path / "copy.gguf"
    shutil.copy2(original, copy)
    poke(copy, copy.stat().st_size // 2)
    same_stamp(copy, original)
    snapshots = paths.kv_dir(kept)
    (snapshots / "chat.kv").write_bytes(b"STKV")
    # Until its hash is done the copy looks like the original...
    assert fingerprint(copy, hash_content=False) == kept
    content_hash(copy)
    # ...then it is named by its content, the original keeps its name, and the KV folder the
    # copy may have written into is emptied.
    assert fingerprint(copy, hash_content=False) != kept
    assert fingerprint(original, hash_content=False) == kept
    assert not snapshots.exists()
    # An exact copy is the same weights: it keeps the original's fingerprint after its hash.
    twin = tmp_path / "twin.gguf"
    shutil.copy2(original, twin)
    content_hash(twin)
    assert fingerprint(twin, hash_content=False) == kept


def _negate_weights(path: Path, data_offset: int) -> None:
    """Other weights of the same size: every float of the tensor data negated in place."""
    with path.open("r+b") as f:
        f.seek(data_offset)
        weights = np.frombuffer(f.read(), np.float32)
        f.seek(data_offset)
        f.write((-(weights + 1)).tobytes())


def test_the_weights_id_tells_apart_what_the_fingerprint_cannot(tmp_path: Path) -> None:
    """Other weights of the same size, header and mtime, and no content hash made yet: the
    fingerprint is the same, the id KV snapshots are kept under is not (issue 33)."""
    from app.engine.gguf_header import open_header

    path = big_model(tmp_path / "model.gguf")  # 48 MiB: read in sampled blocks
    quick = fingerprint(path, hash_content=False)
    before = model_file.weights_id(path, quick)
    assert model_file.weights_id(path, quick) == before
    kept = tmp_path / "stamp"
    kept.touch()
    same_stamp(kept, path)
    with open_header(path) as header:
        data_offset = header.data_offset
    _negate_weights(path, data_offset)
    same_stamp(path, kept)

    assert fingerprint(path, hash_content=False) == quick
    after = model_file.weights_id(path, quick)
    assert after != before and after.startswith(f"{quick}-")


def test_a_small_model_is_read_whole_for_its_weights_id(tmp_path: Path) -> None:
    path = gguf_model(tmp_path / "small.gguf", {"w.weight": np.ones((64, 64), np.float32)})
    before = model_file.weights_id(path, "fp")
    size = path.stat().st_size
    flipped = bytes([path.read_bytes()[size - 5] ^ 0xFF])
    poke(path, size - 5, flipped)  # one byte: a model no larger than the sample is read whole
    assert path.stat().st_size == size
    assert model_file.weights_id(path, "fp") != before


def test_fingerprint_of_an_mlx_folder_sees_each_shard(tmp_path: Path) -> None:
    folder = tmp_path / "mlx"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    shard = write(folder / "model.safetensors", struct.pack("<Q", len(header)) + header + bytes(8))
    before = fingerprint(folder)
    poke(shard, shard.stat().st_size - 1)
    assert fingerprint(folder) != before


def test_default_model_fingerprint() -> None:
    path = default_model_path()
    value = fingerprint(path, hash_content=False)
    assert re.fullmatch(r"[0-9a-f]{16}", value)
    assert fingerprint(path, hash_content=False) == value
