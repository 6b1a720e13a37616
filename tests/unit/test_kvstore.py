"""KV snapshot store: both tiers, restart from the disk index, every rejection path, budgets,
and a full disk that must not stop the chat."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app import paths
from app.engine.kvstore import KVStore, Match, Snapshot, common_prefix

FP = "fp-a"
ENGINE = "llama.cpp"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def kv_dir(tmp_path: Path) -> Path:
    return tmp_path / "kv"


@pytest.fixture
def caplog_kv(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.WARNING, logger="stoke.kvstore"):
        yield caplog


def open_store(
    directory: Path,
    *,
    fingerprint: str = FP,
    engine: str = ENGINE,
    ram_budget: int = 1 << 20,
    disk_budget: int = 1 << 20,
) -> KVStore:
    return KVStore(
        fingerprint, engine, ram_budget=ram_budget, disk_budget=disk_budget, directory=directory
    )


def written(
    directory: Path,
    key: str,
    tokens: list[int],
    payload: bytes,
    *,
    fingerprint: str = FP,
    engine: str = ENGINE,
) -> Path:
    """Write one snapshot through a store, close it, and return its file."""
    store = open_store(directory, fingerprint=fingerprint, engine=engine)
    store.put(key, tokens, payload)
    store.close()
    (path,) = kv_files(directory)
    return path


def kv_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.kv"))


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_round_trip_through_ram(kv_dir: Path) -> None:
    store = open_store(kv_dir)
    store.put("chat-1", [1, 2, 3], b"state", to_disk=False)
    match = store.best([1, 2, 3, 4])
    assert match == Match("chat-1", "ram", 3, 3)
    assert store.load(match) == Snapshot("chat-1", (1, 2, 3), b"state")
    store.close()
    assert kv_files(kv_dir) == []


def test_round_trip_through_disk_survives_restart(kv_dir: Path) -> None:
    tokens = [5, 2**32 - 1, 0, 70000]
    payload = os.urandom(4096)
    written(kv_dir, "chat-1", tokens, payload)

    store = open_store(kv_dir)
    assert store.keys() == ["chat-1"]
    assert store.disk_bytes == kv_files(kv_dir)[0].stat().st_size
    match = store.best([*tokens, 9])
    assert match == Match("chat-1", "disk", 4, 4)
    assert store.load(match) == Snapshot("chat-1", tuple(tokens), payload)
    # A disk load also fills the RAM tier.
    assert store.best(tokens) == Match("chat-1", "ram", 4, 4)
    store.close()


def test_default_directory_is_the_models_kv_dir() -> None:
    store = KVStore(FP, ENGINE)
    assert store.directory == paths.kv_dir(FP)
    store.close()


def test_best_picks_longest_prefix_across_tiers(kv_dir: Path) -> None:
    written(kv_dir, "disk-long", [1, 2, 3, 4, 5], b"d")
    store = open_store(kv_dir)
    store.put("ram-short", [1, 2, 9], b"r", to_disk=False)
    store.put("ram-other", [7, 8], b"o", to_disk=False)

    assert store.best([1, 2, 3, 4, 5, 6]) == Match("disk-long", "disk", 5, 5)
    assert store.best([1, 2, 9, 9]) == Match("ram-short", "ram", 3, 3)
    assert store.best([7, 1]) == Match("ram-other", "ram", 1, 2)
    assert store.best([42, 1, 2]) is None
    assert store.best([]) is None
    store.close()


def test_best_prefers_ram_on_ties(kv_dir: Path) -> None:
    written(kv_dir, "on-disk", [1, 2, 3], b"d")
    store = open_store(kv_dir)
    store.put("in-ram", [1, 2, 3], b"r", to_disk=False)
    assert store.best([1, 2, 3, 4]) == Match("in-ram", "ram", 3, 3)
    store.close()


def test_put_same_key_replaces_snapshot(kv_dir: Path) -> None:
    store = open_store(kv_dir)
    store.put("chat", [1, 2], b"old")
    store.put("chat", [1, 2, 3, 4], b"new")
    store.close()
    assert len(kv_files(kv_dir)) == 1

    store = open_store(kv_dir)
    match = store.best([1, 2, 3, 4])
    assert match == Match("chat", "disk", 4, 4)
    assert store.load(match) == Snapshot("chat", (1, 2, 3, 4), b"new")
    store.close()


def test_put_without_disk_removes_old_file(kv_dir: Path) -> None:
    written(kv_dir, "chat", [1, 2], b"old")
    store = open_store(kv_dir)
    store.put("chat", [1, 2, 3], b"new", to_disk=False)
    store.flush()
    assert kv_files(kv_dir) == []
    assert store.best([1, 2]) == Match("chat", "ram", 2, 3)
    store.close()


def test_discard_forgets_both_tiers(kv_dir: Path) -> None:
    store = open_store(kv_dir)
    store.put("chat", [1, 2], b"x")
    store.discard("chat")
    store.flush()
    assert store.keys() == []
    assert store.best([1, 2]) is None
    assert kv_files(kv_dir) == []
    store.close()


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [(truncate, "truncated"), (flip_last_byte, "payload checksum mismatch")],
)
def test_load_rejects_damaged_file(
    kv_dir: Path,
    caplog_kv: pytest.LogCaptureFixture,
    damage: Callable[[Path], None],
    reason: str,
) -> None:
    path = written(kv_dir, "chat", [1, 2, 3], os.urandom(1000))
    store = open_store(kv_dir)
    match = store.best([1, 2, 3])
    assert match is not None and match.tier == "disk"
    damage(path)

    assert store.load(match) is None
    assert not path.exists()
    assert store.keys() == []
    assert store.best([1, 2, 3]) is None
    assert any(reason in message for message in warnings(caplog_kv))
    store.close()


def patch_version(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[4:6] = struct.pack("<H", KVStore.FORMAT_VERSION + 1)
    path.write_bytes(bytes(data))


def test_scan_rejects_truncated_file(kv_dir: Path, caplog_kv: pytest.LogCaptureFixture) -> None:
    path = written(kv_dir, "chat", [1, 2, 3], os.urandom(1000))
    truncate(path)
    assert_rejected_at_scan(open_store(kv_dir), path, caplog_kv, "truncated")


def test_scan_rejects_wrong_format_version(
    kv_dir: Path, caplog_kv: pytest.LogCaptureFixture
) -> None:
    path = written(kv_dir, "chat", [1, 2, 3], b"payload")
    patch_version(path)
    assert_rejected_at_scan(open_store(kv_dir), path, caplog_kv, "format version 2")


def test_scan_rejects_wrong_fingerprint(
    tmp_path: Path, kv_dir: Path, caplog_kv: pytest.LogCaptureFixture
) -> None:
    other = written(tmp_path / "other", "chat", [1, 2, 3], b"payload", fingerprint="fp-b")
    kv_dir.mkdir()
    copied = Path(shutil.copy(other, kv_dir))
    assert_rejected_at_scan(open_store(kv_dir), copied, caplog_kv, "'fp-b'")


def test_scan_rejects_wrong_engine(kv_dir: Path, caplog_kv: pytest.LogCaptureFixture) -> None:
    path = written(kv_dir, "chat", [1, 2, 3], b"payload", engine="mlx")
    assert_rejected_at_scan(open_store(kv_dir), path, caplog_kv, "engine 'mlx'")


def assert_rejected_at_scan(
    store: KVStore, path: Path, caplog: pytest.LogCaptureFixture, reason: str
) -> None:
    assert store.keys() == []
    assert store.best([1, 2, 3]) is None
    assert not path.exists()
    assert any(reason in message for message in warnings(caplog))
    store.close()


def test_scan_removes_stray_temp_files(kv_dir: Path) -> None:
    kv_dir.mkdir()
    stray = kv_dir / "0123abcd.tmp"
    stray.write_bytes(b"half a snapshot")
    open_store(kv_dir).close()
    assert not stray.exists()


def test_disk_budget_evicts_least_recently_used(kv_dir: Path) -> None:
    payload = bytes(1000)
    size = written(kv_dir / "probe", "k0", [0], payload).stat().st_size
    budget = size * 5 // 2
    store = open_store(kv_dir, disk_budget=budget, ram_budget=0)

    for i in range(5):
        store.put(f"k{i}", [i], payload)
        store.flush()
        assert sum(p.stat().st_size for p in kv_files(kv_dir)) <= budget
    assert store.keys() == ["k3", "k4"]
    assert store.disk_bytes <= budget

    # Loading k3 makes it more recent than k4, so the next write evicts k4 instead.
    assert store.load(Match("k3", "disk", 1, 1)) == Snapshot("k3", (3,), payload)
    store.put("k5", [5], payload)
    store.flush()
    assert store.keys() == ["k3", "k5"]
    store.close()

    # Recency lives in the files' mtimes, so a restart evicts in the same order.
    store = open_store(kv_dir, disk_budget=size * 3 // 2)
    assert store.keys() == ["k5"]
    store.close()


def test_snapshot_larger_than_disk_budget_is_not_kept(
    kv_dir: Path, caplog_kv: pytest.LogCaptureFixture
) -> None:
    store = open_store(kv_dir, disk_budget=500)
    store.put("big", [1], bytes(1000))
    store.flush()
    assert kv_files(kv_dir) == []
    assert store.best([1]) == Match("big", "ram", 1, 1)
    assert any("exceeds the disk budget" in message for message in warnings(caplog_kv))
    store.close()


def test_ram_budget_is_lru(kv_dir: Path) -> None:
    entry = 100 + 4  # payload plus one packed token
    store = open_store(kv_dir, ram_budget=entry * 5 // 2)
    for i in range(4):
        store.put(f"k{i}", [i], bytes(100), to_disk=False)
        assert store.ram_bytes <= store.ram_budget
        if i == 2:
            # k1 becomes most recent, so k2 is evicted rather than k1 when k3 arrives.
            assert store.load(Match("k1", "ram", 1, 1)) is not None
    assert store.keys() == ["k1", "k3"]
    assert store.ram_bytes == 2 * entry

    store.put("huge", [9], bytes(1000), to_disk=False)
    assert store.best([9]) is None
    assert store.keys() == ["k1", "k3"]
    store.close()


FULL_DISK_SCRIPT = textwrap.dedent(
    """
    import json, logging, resource, signal, sys
    from pathlib import Path
    from app.engine.kvstore import KVStore

    logging.basicConfig(level=logging.WARNING)
    store = KVStore("fp", "llama.cpp", directory=Path(sys.argv[1]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    store.put("chat", [1, 2, 3], bytes(65536))
    store.flush()
    match = store.best([1, 2, 3])
    snapshot = store.load(match)
    store.close()
    print(json.dumps({"tier": match.tier, "payload": len(snapshot.payload)}))
    """
)


def test_full_disk_skips_snapshot_and_keeps_ram(kv_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK_SCRIPT, str(kv_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"tier": "ram", "payload": 65536}
    assert f"The disk holding {kv_dir} is full" in result.stderr
    assert list(kv_dir.iterdir()) == []


# --- a folder where a snapshot file belongs (issue 14, item 11) -------------------------------


def _folder_in_place_of(file: Path) -> None:
    file.unlink()
    file.mkdir()
    (file / "inside").write_bytes(b"x")


def test_a_folder_where_a_snapshot_belongs_is_dropped_at_start(
    kv_dir: Path, caplog_kv: pytest.LogCaptureFixture
) -> None:
    file = written(kv_dir, "chat", [1, 2, 3], b"old")
    _folder_in_place_of(file)
    store = open_store(kv_dir)  # raised IsADirectoryError
    assert store.best([1, 2, 3]) is None
    assert not file.exists()
    assert any("discarding snapshot file" in m for m in warnings(caplog_kv))
    store.put("chat", [1, 2, 3, 4], b"new")
    store.close()
    store = open_store(kv_dir)
    assert store.load(store.best([1, 2, 3, 4])) == Snapshot("chat", (1, 2, 3, 4), b"new")
    store.close()


def test_a_folder_that_replaces_a_snapshot_after_start_fails_no_load(kv_dir: Path) -> None:
    file = written(kv_dir, "chat", [1, 2, 3], b"old")
    store = open_store(kv_dir)
    match = store.best([1, 2, 3])
    assert match is not None and match.tier == "disk"
    _folder_in_place_of(file)
    assert store.load(match) is None  # a bad snapshot: the turn prefills instead
    assert not file.exists() and store.best([1, 2, 3]) is None
    store.close()


def test_a_snapshot_is_written_over_a_folder_in_its_place(kv_dir: Path) -> None:
    store = open_store(kv_dir)
    store.put("chat", [1], b"first")
    store.flush()
    (file,) = kv_files(kv_dir)
    _folder_in_place_of(file)
    store.put("chat", [1, 2], b"second")
    store.close()
    assert file.is_file()
    store = open_store(kv_dir)
    assert store.load(store.best([1, 2])) == Snapshot("chat", (1, 2), b"second")
    store.close()


# --- a replacement that does not fit keeps the previous snapshot (issue 14, item 7) -------------

REPLACE_SCRIPT = textwrap.dedent(
    """
    import json, logging, resource, signal, sys
    from pathlib import Path
    from app.engine.kvstore import KVStore

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    directory = Path(sys.argv[1])
    store = KVStore("fp", "llama.cpp", directory=directory)
    store.put("chat", [1, 2, 3], bytes(1000))
    store.flush()
    if sys.argv[2] == "rlimit":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
    store.put("chat", [1, 2, 3, 4, 5], bytes(4 << 20))  # more than the disk takes
    store.flush()
    on_disk = store.best([1, 2, 3, 4, 5])
    store.close()
    restarted = KVStore("fp", "llama.cpp", directory=directory)
    match = restarted.best([1, 2, 3, 4, 5])
    snapshot = restarted.load(match)
    restarted.close()
    print(json.dumps({"tier": on_disk.tier, "restored": list(snapshot.tokens)}))
    """
)


def _tmpfs_runner(folder: Path) -> list[str]:
    """A 1 MiB tmpfs mounted at `folder` in a private mount namespace, or a skip."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private tmpfs")
    user = [] if os.geteuid() == 0 else ["-r"]
    mount = 'mount -t tmpfs -o size=1m tmpfs "$0" && exec "$@"'
    probe = subprocess.run(
        ["unshare", *user, "-m", "sh", "-c", mount, str(folder), "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.strip()}")
    return ["unshare", *user, "-m", "sh", "-c", mount, str(folder)]


@pytest.mark.parametrize("full", ["tmpfs", "rlimit"])
def test_a_snapshot_that_does_not_fit_keeps_the_previous_one(kv_dir: Path, full: str) -> None:
    kv_dir.mkdir()
    runner = _tmpfs_runner(kv_dir) if full == "tmpfs" else []
    result = subprocess.run(
        [*runner, sys.executable, "-c", REPLACE_SCRIPT, str(kv_dir), full],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # The new state stays in RAM; the disk still has the previous, valid one after a restart.
    assert json.loads(result.stdout) == {"tier": "ram", "restored": [1, 2, 3]}
    assert f"The disk holding {kv_dir} is full" in result.stderr, result.stderr
    assert "the previous one is kept" in result.stderr and "Free " in result.stderr
    assert "Traceback" not in result.stderr


def test_a_snapshot_over_the_disk_budget_keeps_the_previous_one(kv_dir: Path) -> None:
    store = open_store(kv_dir, disk_budget=2000)
    store.put("chat", [1, 2], bytes(100))
    store.flush()
    store.put("chat", [1, 2, 3], bytes(5000))
    store.flush()
    assert store.best([1, 2, 3]) == Match("chat", "ram", 3, 3)
    store.close()
    store = open_store(kv_dir, disk_budget=2000)
    assert store.load(store.best([1, 2, 3])) == Snapshot("chat", (1, 2), bytes(100))
    store.close()


def test_snapshot_files_are_private(kv_dir: Path) -> None:
    file = written(kv_dir, "chat", [1], b"state")
    assert file.stat().st_mode & 0o777 == 0o600


def test_common_prefix_on_lists_and_packed_tokens() -> None:
    """The one common-prefix helper agrees with a plain scan, on token lists and on packed
    bytes, across every split point the gallop and the bisection can land on."""

    def scan(a: list[int], b: list[int]) -> int:
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i

    rng = random.Random(7)
    for _ in range(500):
        a = [rng.randrange(3) for _ in range(rng.randrange(400))]
        b = a[: rng.randrange(len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(200))]
        want = scan(a, b)
        assert common_prefix(a, b) == want
        packed = [struct.pack(f"<{len(x)}I", *x) for x in (a, b)]
        assert common_prefix(*packed) // 4 == want
