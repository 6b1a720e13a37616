"""Downloads with the real huggingface_hub client against a fake hub on loopback."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import keyring
import pytest
from huggingface_hub import constants
from keyring.backend import KeyringBackend
from keyring.backends import fail

from app import paths
from app.models import library, secrets, transfer
from app.models.default import default_model_path
from app.models.downloads import Downloads
from app.models.hub import DownloadError, group_key, list_repo
from app.models.library import Library
from app.models.transfer import Progress
from tests.fakehub import FakeHub
from tests.tiny_vision import write_projector

MiB = 1 << 20
REPO = "acme/SmolLM2-135M-Instruct-GGUF"
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
Q8_PARTS = ("q8/tiny-Q8_0-00001-of-00002.gguf", "q8/tiny-Q8_0-00002-of-00002.gguf")
TOKEN = "hf_stoke_test_0123456789abcdef"


class MemoryKeyring(KeyringBackend):
    """A keychain that lives in this test process only."""

    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.store.pop((service, username), None)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    fake = FakeHub()
    hf_home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # huggingface_hub read HF_HOME at import: keep any real login of this machine out
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(hf_home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(hf_home / "stored_tokens"))
    yield fake
    fake.close()


@pytest.fixture
def keychain() -> Iterator[MemoryKeyring]:
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    secrets.delete_token()
    keyring.set_keyring(previous)


@pytest.fixture
def manager(hub: FakeHub, keychain: MemoryKeyring) -> Iterator[Downloads]:
    downloads = Downloads()
    yield downloads
    downloads.shutdown()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def add_smol_repo(hub: FakeHub) -> dict[str, bytes]:
    files = {
        SMOL: default_model_path().read_bytes(),
        Q8_PARTS[0]: os.urandom(MiB),
        Q8_PARTS[1]: os.urandom(MiB // 2),
        "README.md": b"# SmolLM2 135M\n",
    }
    hub.add_repo(REPO, files)
    return files


def files_under(*roots: Path) -> Iterator[Path]:
    for root in roots:
        if root.exists():
            yield from (p for p in root.rglob("*") if p.is_file())


# --- browsing ---------------------------------------------------------------------------------


def test_group_keys_from_file_names() -> None:
    assert group_key("SmolLM2-135M-Instruct.Q4_K_M.gguf") == "Q4_K_M"
    assert group_key("smollm2-1.7b-instruct-q8_0.gguf") == "Q8_0"
    assert group_key("MXFP4/DeepSeek-V4-Flash-MXFP4-00001-of-00004.gguf") == "MXFP4"
    assert group_key("UD-Q2_K_XL/DeepSeek-V4-Flash-UD-Q2_K_XL-00002-of-00003.gguf") == "UD-Q2_K_XL"
    assert group_key("DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-chat-v2.gguf") == "IQ2XXS"
    assert group_key("mmproj-model-f16.gguf") == "mmproj-F16"
    assert group_key("custom-00001-of-00002.gguf") == "custom"
    assert group_key("config.json") is None


def test_listing_groups_quantizations_and_split_sets(hub: FakeHub, keychain: object) -> None:
    files = add_smol_repo(hub)
    listing = list_repo(REPO)
    assert listing.revision == hub.repos[REPO].commit
    groups = {g.key: g for g in listing.groups}
    assert set(groups) == {"Q4_1", "Q8_0"}
    assert [f.name for f in groups["Q8_0"].files] == list(Q8_PARTS)
    assert groups["Q8_0"].size == MiB + MiB // 2
    smol = groups["Q4_1"].files[0]
    assert (smol.size, smol.sha256) == (len(files[SMOL]), sha(files[SMOL]))
    readme = next(f for f in listing.files if f.name == "README.md")
    assert readme.sha256 is None and readme.blob_id is not None  # small files: git blob id


# --- downloading ------------------------------------------------------------------------------


def test_multi_file_download_is_verified_into_the_library(hub: FakeHub, manager: Downloads) -> None:
    files = add_smol_repo(hub)
    seen: list[Progress] = []
    manager.on_progress = seen.append
    job = manager.start(REPO, [SMOL, *Q8_PARTS, "README.md"])
    done = manager.wait(job, timeout=30)
    assert (done.state, done.error) == ("done", None)
    assert done.files_done == done.files_total == 4
    assert done.done_bytes == done.total_bytes == sum(len(b) for b in files.values())
    assert seen[-1].state == "done"
    destination = paths.models_dir() / "acme" / "SmolLM2-135M-Instruct-GGUF"
    for name, data in files.items():
        assert sha((destination / name).read_bytes()) == sha(data)
        assert hub.served[name] == len(data)  # each byte came once
    assert not (paths.data_dir() / "downloads" / job).exists()  # staging cleaned up
    models = {m.name: m for m in Library().models()}
    smol = models["SmolLM2-135M-Instruct.Q4_1"]
    assert (smol.architecture, smol.quantization, smol.context_length) == ("llama", "Q4_1", 8192)


def test_a_vision_model_comes_with_its_projector_named_in_its_library_entry(
    hub: FakeHub, manager: Downloads, tmp_path: Path
) -> None:
    projector = write_projector(tmp_path / "mmproj.gguf").read_bytes()
    repo = "acme/tiny-vision-GGUF"
    hub.add_repo(
        repo,
        {
            "tiny-vision.Q4_1.gguf": default_model_path().read_bytes(),
            "mmproj-tiny-vision-F32.gguf": os.urandom(4096),
            "mmproj-tiny-vision-F16.gguf": projector,
        },
    )
    done = manager.wait(manager.start(repo, quant="Q4_1"), timeout=30)
    assert (done.state, done.error, done.files_total) == ("done", None, 2)
    folder = manager.destination(repo)
    assert sorted(p.name for p in folder.iterdir()) == [
        "mmproj-tiny-vision-F16.gguf",  # the precise one of two, not the other
        "tiny-vision.Q4_1.gguf",
    ]
    [model] = Library().models()  # the projector is part of the model, not a model
    assert model.projector == folder / "mmproj-tiny-vision-F16.gguf"
    assert model.to_dict()["projector"] == str(model.projector)


def test_pause_then_resume_fetches_only_the_missing_bytes(hub: FakeHub, manager: Downloads) -> None:
    data = os.urandom(30 * MiB)
    hub.add_repo("acme/big-GGUF", {"big-Q4_0.gguf": data})
    hub.stall_after["big-Q4_0.gguf"] = 10 * MiB
    job = manager.start("acme/big-GGUF")
    partial = paths.data_dir() / "downloads" / job / "big-Q4_0.gguf.incomplete"
    deadline = time.monotonic() + 20
    while manager.progress(job).done_bytes < 10 * MiB and time.monotonic() < deadline:
        time.sleep(0.02)
    running = manager.progress(job)
    assert running.state == "running" and running.current == ("big-Q4_0.gguf",)
    assert running.speed > 0 and running.eta_s is not None and running.eta_s > 0
    manager.pause(job)
    hub.release()  # the next chunk arrives, is kept, and the transfer stops
    paused = manager.wait(job, timeout=20)
    kept = partial.stat().st_size
    assert paused.state == "paused" and 10 * MiB <= kept < len(data)
    served_before = hub.served["big-Q4_0.gguf"]
    manager.resume(job)
    done = manager.wait(job, timeout=20)
    assert done.state == "done", done.error
    assert hub.gets == [("big-Q4_0.gguf", 0), ("big-Q4_0.gguf", kept)]  # a Range request
    assert hub.served["big-Q4_0.gguf"] - served_before == len(data) - kept
    assert sha((done.destination / "big-Q4_0.gguf").read_bytes()) == sha(data)


def test_a_server_that_ignores_range_restarts_the_file_cleanly(
    hub: FakeHub, manager: Downloads
) -> None:
    data = os.urandom(25 * MiB)
    hub.add_repo("acme/proxy-GGUF", {"proxy-Q4_0.gguf": data})
    hub.stall_after["proxy-Q4_0.gguf"] = 10 * MiB
    job = manager.start("acme/proxy-GGUF")
    deadline = time.monotonic() + 20
    while manager.progress(job).done_bytes < 10 * MiB and time.monotonic() < deadline:
        time.sleep(0.02)
    manager.pause(job)
    hub.release()
    assert manager.wait(job, timeout=20).state == "paused"
    hub.ignore_range = True
    manager.resume(job)
    done = manager.wait(job, timeout=20)
    assert done.state == "done", done.error
    assert hub.gets == [("proxy-Q4_0.gguf", 0), ("proxy-Q4_0.gguf", 0)]
    assert done.done_bytes == len(data)
    assert sha((done.destination / "proxy-Q4_0.gguf").read_bytes()) == sha(data)


def test_interrupted_download_resumes_after_a_restart(
    hub: FakeHub, keychain: object, stoke_home: Path
) -> None:
    """The app process dies mid-file; the next one resumes from the state file."""
    data = os.urandom(16 * MiB)
    small = os.urandom(MiB)
    hub.add_repo("acme/crash-GGUF", {"crash-Q4_0.gguf": data, "crash-Q8_0.gguf": small})
    hub.stall_after["crash-Q4_0.gguf"] = 10 * MiB  # exactly one 10 MiB chunk reaches disk
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from app.models.downloads import Downloads\n"
            "d = Downloads()\n"
            "job = d.start('acme/crash-GGUF', ['crash-Q4_0.gguf', 'crash-Q8_0.gguf'])\n"
            "print(job, flush=True)\n"
            "d.wait(job)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
        cwd=Path(__file__).parents[2],
    )
    try:
        assert child.stdout is not None
        job = child.stdout.readline().strip()
        partial = stoke_home / "data" / "downloads" / job / "crash-Q4_0.gguf.incomplete"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if partial.exists() and partial.stat().st_size == 10 * MiB:
                break
            time.sleep(0.02)
        assert partial.stat().st_size == 10 * MiB
    finally:
        child.kill()
        child.wait()
    hub.release()  # the server finds the connection gone and drops it
    hub.wait_idle()
    served_before = hub.served["crash-Q4_0.gguf"]

    restarted = Downloads()
    try:
        before = restarted.progress(job)
        assert before.state == "running" and before.done_bytes >= 10 * MiB
        assert restarted.resume_pending() == [job]
        done = restarted.wait(job, timeout=20)
    finally:
        restarted.shutdown()
    assert done.state == "done", done.error
    gets = [start for name, start in hub.gets if name == "crash-Q4_0.gguf"]
    assert gets == [0, 10 * MiB]  # the finished bytes were not fetched again
    assert hub.served["crash-Q4_0.gguf"] - served_before == len(data) - 10 * MiB
    assert sha((done.destination / "crash-Q4_0.gguf").read_bytes()) == sha(data)
    assert sha((done.destination / "crash-Q8_0.gguf").read_bytes()) == sha(small)


def test_a_dropped_connection_is_resumed_by_range(hub: FakeHub, manager: Downloads) -> None:
    data = os.urandom(12 * MiB)
    hub.add_repo("acme/flaky-GGUF", {"flaky-Q4_0.gguf": data})
    hub.drop_after["flaky-Q4_0.gguf"] = 10 * MiB
    done = manager.wait(manager.start("acme/flaky-GGUF"), timeout=20)
    assert done.state == "done", done.error
    assert hub.gets == [("flaky-Q4_0.gguf", 0), ("flaky-Q4_0.gguf", 10 * MiB)]
    assert hub.served["flaky-Q4_0.gguf"] == len(data)


def test_a_corrupted_file_is_quarantined_never_used(hub: FakeHub, manager: Downloads) -> None:
    data = default_model_path().read_bytes()
    hub.add_repo("acme/bad-GGUF", {"bad-Q4_1.gguf": data})
    hub.corrupt.add("bad-Q4_1.gguf")
    done = manager.wait(manager.start("acme/bad-GGUF"), timeout=30)
    assert done.state == "failed"
    assert done.error is not None and "Checksum mismatch" in done.error
    (quarantined,) = done.quarantined
    assert f"quarantined at {quarantined}" in done.error
    assert quarantined.is_relative_to(paths.data_dir() / "quarantine")
    assert quarantined.stat().st_size == len(data)
    assert not (done.destination / "bad-Q4_1.gguf").exists()
    assert not any(p.name == "bad-Q4_1.gguf" for p in paths.models_dir().rglob("*"))
    assert Library().models() == []


def test_files_over_the_http_limit_go_through_hf_hub_download(
    hub: FakeHub, manager: Downloads
) -> None:
    data = os.urandom(3 * MiB)
    hub.add_repo("acme/huge-GGUF", {"huge-Q2_K.gguf": data})
    manager.http_limit = MiB  # stands in for 50 GB: this file takes the Xet-capable path
    done = manager.wait(manager.start("acme/huge-GGUF"), timeout=20)
    assert done.state == "done", done.error
    assert done.done_bytes == len(data)
    assert sha((done.destination / "huge-Q2_K.gguf").read_bytes()) == sha(data)


# --- refusals with clear messages -------------------------------------------------------------


def test_gated_repo_explains_how_to_get_access(
    hub: FakeHub, manager: Downloads, keychain: MemoryKeyring, tmp_path: Path, stoke_home: Path
) -> None:
    data = os.urandom(MiB)
    hub.add_repo("deepseek-ai/gated-GGUF", {"gated-Q4_0.gguf": data}, gated=True)
    with pytest.raises(DownloadError, match=r"gated \(401\)") as error:
        manager.start("deepseek-ai/gated-GGUF")
    assert f"{hub.endpoint}/deepseek-ai/gated-GGUF" in str(error.value)
    assert "accept its license" in str(error.value)
    assert "stoke models login" in str(error.value)

    assert "keychain" in secrets.set_token("hf_not_granted_yet")
    with pytest.raises(DownloadError, match=r"not been granted access yet \(403\)"):
        manager.start("deepseek-ai/gated-GGUF")

    hub.granted_tokens.add(TOKEN)
    secrets.set_token(TOKEN)
    assert keychain.store[("stoke", "huggingface")] == TOKEN
    done = manager.wait(manager.start("deepseek-ai/gated-GGUF"), timeout=20)
    assert done.state == "done", done.error
    for file in files_under(stoke_home, tmp_path / "hf-home"):
        assert TOKEN.encode() not in file.read_bytes(), file


def test_unknown_repo_and_file_say_404(hub: FakeHub, manager: Downloads) -> None:
    add_smol_repo(hub)
    with pytest.raises(DownloadError, match=r"acme/nope was not found on .* \(404\)"):
        manager.start("acme/nope")
    with pytest.raises(DownloadError, match=r"nope\.gguf is not in acme/SmolLM2.* \(404\)"):
        manager.start(REPO, ["nope.gguf"])
    with pytest.raises(DownloadError, match=r"has no Q5_K_M\. It has: Q8_0 \(1\.6 MB\)"):
        manager.start(REPO, quant="Q5_K_M")
    hub.repos[REPO].files["../../escape.gguf"] = b"GGUF"
    with pytest.raises(DownloadError, match=r"escape\.gguf is not in"):
        manager.start(REPO, ["../../escape.gguf"])  # never listed, never written


def test_network_down_names_the_endpoint(
    hub: FakeHub, manager: Downloads, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.close()
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    with pytest.raises(DownloadError, match=f"Cannot reach the hub at {hub.endpoint}"):
        manager.start(REPO)


def test_not_enough_disk_space_is_refused_with_numbers(
    hub: FakeHub, manager: Downloads, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_smol_repo(hub)
    monkeypatch.setattr(library, "disk_free", lambda path: 40_000_000)
    with pytest.raises(
        DownloadError, match=r"Not enough disk space .* needs 98\.4 MB, 40\.0 MB free"
    ):
        manager.start(REPO, quant="Q4_1")
    assert hub.gets == []  # refused before a byte moved
    assert manager.downloads() == []


def test_disk_filling_up_mid_download_says_how_much_is_needed(
    hub: FakeHub, manager: Downloads, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo("acme/full-GGUF", {"full-Q4_0.gguf": os.urandom(2 * MiB)})

    def full(self: object, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(transfer.PartWriter, "write", full)
    done = manager.wait(manager.start("acme/full-GGUF"), timeout=20)
    assert done.state == "failed"
    assert done.error is not None
    assert re.search(r"disk filled up .* needs 2\.1 MB more, [\d.]+ [kMGT]?B free", done.error)


# --- the token --------------------------------------------------------------------------------


def test_without_a_keychain_the_token_stays_in_memory(stoke_home: Path) -> None:
    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        assert not secrets.keychain_available()
        notice = secrets.set_token(TOKEN)
        assert notice == "No system keychain: the token is kept until Stoke quits."
        assert secrets.get_token() == TOKEN
        Library().models()  # writes its settings and caches
        for file in files_under(stoke_home):
            assert TOKEN.encode() not in file.read_bytes(), file
        secrets.delete_token()
        assert secrets.get_token() is None
    finally:
        secrets.delete_token()
        keyring.set_keyring(previous)
