"""Every JSON file Stoke writes for itself and reads back, damaged every way a disk or a hand
can damage it: each read still works (the defaults, or what survived), says so in words naming
the file, and repairs it so the warning comes once (app/stored.py). Plus the defects that made
this one mechanism: files of valid JSON with wrong types that stopped turns and commands."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app import paths, presets
from app.engine import model_file
from app.engine.protocol import LoadOptions
from app.engine.safe_mode import SafeModeRecords
from app.models import load_settings
from app.models.library import Library
from app.settings import Settings


def a_file(tmp_path: Path) -> Path:
    """A model file as the fingerprint sees it (any bytes: the header hash falls back), written
    once, so its fingerprint stays put."""
    path = tmp_path / "model.gguf"
    if not path.exists():
        path.write_bytes(b"not really a model" * 64)
    return path


def probe_not_run(monkeypatch: pytest.MonkeyPatch) -> Any:
    """cpu_buffers with its probe replaced by a fixed verdict (the probe has tests of its own:
    tests/e2e/test_cpu_buffers.py); skipped where llama.cpp is not installed."""
    pytest.importorskip("llama_cpp")
    from app.engine.llamacpp import cpu_buffers

    probed = cpu_buffers.Verdict("none", "probed again", ("CPU_REPACK",), {}, "probe")
    monkeypatch.setattr(cpu_buffers, "_decide", lambda: probed)
    return cpu_buffers


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "stoke.stored"]


# --- the defects ------------------------------------------------------------------------------


def test_model_hashes_with_wrong_types_do_not_stop_the_fingerprint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = paths.cache_dir() / "model-hashes.json"
    cache.write_text(json.dumps({"version": 1, "files": [], "owners": []}))
    model = a_file(tmp_path)
    assert model_file.fingerprint(model, hash_content=False) == model_file._quick(model)
    (said,) = warnings(caplog)
    assert str(cache) in said and "files is an array, not an object" in said
    assert model_file.content_hash(model) == model_file._hash_file(model)  # written afresh
    assert json.loads(cache.read_text())["files"][str(model.resolve())]["sha256"]


def test_a_cpu_verdict_without_its_buffer_types_is_probed_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cpu_buffers = probe_not_run(monkeypatch)
    cache = paths.cache_dir() / cpu_buffers.CACHE_FILE
    key = cpu_buffers._key_hash(cpu_buffers.machine_key())
    entry = {"policy": "all", "reason": "old", "exact_v": "f16", "source": "probe", "key": key}
    cache.write_text(json.dumps({"format": 2, "verdicts": {key: entry}}))
    verdict = cpu_buffers.machine_verdict(cache=cache)
    assert verdict.reason == "probed again" and verdict.extra_types == ("CPU_REPACK",)
    assert "needs extra_types, so it is left out" in warnings(caplog)[0]
    assert json.loads(cache.read_text())["verdicts"][key]["extra_types"] == ["CPU_REPACK"]


def test_library_folders_of_wrong_types_are_left_out(caplog: pytest.LogCaptureFixture) -> None:
    config = paths.config_dir() / "library.json"
    config.write_text(json.dumps({"version": 1, "folders": [5, None, {"a": 1}]}))
    library = Library()
    assert library.folders() == [paths.models_dir(create=False)]
    assert [m.name for m in library.listed()] == ["SmolLM2-135M-Instruct.Q4_1"]  # the bundled
    (said,) = warnings(caplog)
    assert "folders[0] = 5 is not a full path" in said and "folders[2]" in said
    assert json.loads(config.read_text())["folders"] == []  # repaired
    assert json.loads(config.with_name("library.json.damaged").read_text())["folders"][0] == 5


def test_a_library_file_that_names_no_folders_lists_stokes_own() -> None:
    (paths.config_dir() / "library.json").write_text("{}")
    assert Library().folders() == [paths.models_dir(create=False)]


def test_settings_nested_past_the_parser_give_the_defaults(
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = paths.config_dir() / "settings.json"
    path.write_text("[" * 200_000)
    settings, problem = Settings.load_checked()
    assert settings == Settings()
    assert problem is not None and str(path) in problem and "nested too deeply" in problem
    assert path.with_name("settings.json.damaged").stat().st_size == 200_000
    assert Settings.load_checked() == (Settings(), None)  # said once


def test_models_list_runs_on_a_damaged_library_and_hash_cache(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from app.__main__ import main

    (paths.config_dir() / "library.json").write_text('{"folders": [5, null, {"a": 1}]}')
    (paths.cache_dir() / "model-hashes.json").write_text('{"version": 1, "files": []}')
    umask = os.umask(0o077)  # what main() sets for Stoke's process; the test's put back below
    try:
        assert main(["models", "list"]) == 0
    finally:
        os.umask(umask)
    out, err = capsys.readouterr()
    assert "SmolLM2-135M-Instruct.Q4_1" in out and "1 model(s)" in out
    assert "Traceback" not in err


# --- every file, every damage -----------------------------------------------------------------


@dataclass(frozen=True)
class Owned:
    """One file Stoke reads back: where it lives, its top-level keys (None: it is keyed by
    ids), whether a damaged copy is the user's to keep, and a read through the code that uses
    it, which must give what an absent file gives."""

    root: str
    name: str
    keys: tuple[str, ...] | None
    keep: bool
    read: Callable[[Path, pytest.MonkeyPatch], Any]

    def path(self) -> Path:
        root = {"config": paths.config_dir, "data": paths.data_dir, "cache": paths.cache_dir}
        return root[self.root]() / self.name


def _downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from app.models.downloads import Downloads

    manager = Downloads()
    try:
        return {job: state.to_dict() for job, state in manager._jobs.items()}
    finally:
        manager.shutdown()


def _verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    cpu_buffers = probe_not_run(monkeypatch)
    return cpu_buffers.machine_verdict(cache=paths.cache_dir() / cpu_buffers.CACHE_FILE).reason


OWNED = {
    "settings": Owned(
        "config", "settings.json", ("n_ctx", "engine"), True, lambda *_: Settings.load()
    ),
    "presets": Owned(
        "config", "presets.json", ("presets",), True, lambda *_: presets.load_presets()
    ),
    "load settings": Owned(
        "config",
        "load_settings.json",
        ("version", "models"),
        True,
        lambda tmp_path, _: load_settings.load(a_file(tmp_path)),
    ),
    "library folders": Owned(
        "config", "library.json", ("version", "folders"), True, lambda *_: Library().folders()
    ),
    "library scan": Owned(
        "cache", "library-scan.json", ("version", "models"), False, lambda *_: Library().models()
    ),
    "downloads": Owned("data", "downloads.json", ("version", "downloads"), True, _downloads),
    "model hashes": Owned(
        "cache",
        "model-hashes.json",
        ("version", "files", "owners"),
        False,
        lambda tmp_path, _: model_file.fingerprint(a_file(tmp_path), hash_content=False),
    ),
    "cpu verdicts": Owned("cache", "cpu-buffers.json", ("format", "verdicts"), False, _verdict),
    "safe mode": Owned(
        "cache",
        "engine-safe-mode.json",
        None,
        False,
        lambda tmp_path, _: SafeModeRecords().lookup(
            "llama.cpp", LoadOptions(str(a_file(tmp_path)))
        ),
    ),
}


def _wrong_types(file: Owned) -> str:
    """A JSON document of the file's shape with every part of a wrong type."""
    wrong = [5, None, {"a": 1}]
    return json.dumps({key: wrong for key in file.keys or ("some id",)})


DAMAGE: dict[str, Callable[[Path, Owned], None]] = {
    "wrong types": lambda path, file: path.write_text(_wrong_types(file)),
    "truncated": lambda path, file: path.write_text(_wrong_types(file)[:9]),
    "deep nesting": lambda path, _: path.write_text("[" * 200_000),
    "not UTF-8": lambda path, _: path.write_bytes(b'\xff\xfe{"version": 1}'),
    "a folder in its place": lambda path, _: (path / "inside").mkdir(parents=True),
}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("owned", OWNED)
def test_every_file_damaged_every_way_still_reads_and_says_so(
    owned: str,
    damage: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    file = OWNED[owned]
    path = file.path()
    path.unlink(missing_ok=True)  # the verdict every home starts with
    expected = file.read(tmp_path, monkeypatch)  # what no file gives
    assert not warnings(caplog)
    path.unlink(missing_ok=True)

    DAMAGE[damage](path, file)
    assert file.read(tmp_path, monkeypatch) == expected
    said = warnings(caplog)
    assert said and str(path) in said[0], said
    aside = sorted(p.name for p in path.parent.glob(f"{path.name}.damaged*"))
    assert aside == ([f"{path.name}.damaged"] if file.keep or "folder" in damage else [])

    caplog.clear()
    assert file.read(tmp_path, monkeypatch) == expected
    assert not warnings(caplog), "repaired: said once"


def test_an_unreadable_file_is_read_as_absent_and_left_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = paths.config_dir() / "settings.json"
    path.symlink_to(path.name)  # a loop: no process, root included, can open it
    assert Settings.load() == Settings()
    assert "could not be read (Too many levels of symbolic links)" in warnings(caplog)[0]
    assert path.is_symlink() and not list(path.parent.glob("*.damaged*"))


def test_what_survives_is_kept_and_a_cache_is_rebuilt_without_a_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = a_file(tmp_path)
    records = SafeModeRecords()
    options = LoadOptions(str(model))
    records.record("llama.cpp", options, "crashed")
    data = json.loads(records.path.read_text())
    (key,) = data
    data[key]["reason"] = ["not words"]
    data["other"] = "not a record"
    records.path.write_text(json.dumps(data))
    found = records.lookup("llama.cpp", options)
    assert found is not None and found["model"] == "model.gguf" and "reason" not in found
    (said,) = warnings(caplog)
    assert key[:20] in said and '.reason = ["not words"] is not words' in said
    assert "other is a string, not an object" in said and "It is rebuilt." in said
    assert set(json.loads(records.path.read_text())) == {key}
    assert not list(records.path.parent.glob("*.damaged*"))


def test_saving_load_settings_refuses_what_a_read_would_drop(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"options\.n_ctx = \"big\" is not int"):
        load_settings.save(a_file(tmp_path), {"n_ctx": "big"})
    with pytest.raises(ValueError, match=r"options\.colour is not something Stoke keeps"):
        load_settings.save(a_file(tmp_path), {"colour": "red"})
    assert not load_settings.settings_path().exists()


def test_a_damaged_download_cannot_reach_outside_its_folders(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from app.models.downloads import Downloads

    job = {"id": "0123456789ab", "repo": "o/m", "revision": "main", "endpoint": None}
    file = {"name": "m.gguf", "size": 1, "sha256": None, "blob_id": None, "status": "pending"}
    jobs = [
        {**job, "state": "paused", "files": [file]},
        {**job, "id": "../../../etc", "state": "paused", "files": [file]},
        {**job, "id": "aaaaaaaaaaaa", "repo": "../..", "state": "paused", "files": [file]},
        {**job, "id": "bbbbbbbbbbbb", "state": "paused", "files": [{**file, "name": "../x"}]},
    ]
    state = paths.data_dir() / "downloads.json"
    state.write_text(json.dumps({"version": 1, "downloads": jobs}))
    manager = Downloads()
    try:
        assert list(manager._jobs) == ["0123456789ab", "bbbbbbbbbbbb"]
        assert manager._jobs["bbbbbbbbbbbb"].files == []
    finally:
        manager.shutdown()
    (said,) = warnings(caplog)
    assert 'downloads[1].id = "../../../etc" is not a download id' in said
    assert 'downloads[3].files[0].name = "../x"' in said


def test_a_sentence_names_a_few_problems_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = paths.config_dir() / "settings.json"
    path.write_text(json.dumps({f"unknown_{n}": n for n in range(8)}))
    assert Settings.load() == Settings()
    (said,) = warnings(caplog)
    assert "unknown_4 is not something Stoke keeps here; and 3 more" in said
    assert "unknown_5" not in said
