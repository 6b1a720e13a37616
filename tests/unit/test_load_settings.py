"""Per-model load settings: a round trip, several models in one file, atomic writes, and a
damaged file set aside instead of trusted or overwritten."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from app.engine.gguf_info import inspect_gguf
from app.hardware.planner import load_options, plan
from app.models import load_settings
from app.models.default import default_model_path

OPTIONS = {
    "engine": "llama.cpp",
    "n_ctx": 65_536,
    "n_batch": 2048,
    "n_ubatch": 1024,
    "n_seq_max": 1,
    "flash_attn": True,
    "n_gpu_layers": 44,
    "overrides": ((r"blk\.(0|1)\.ffn_(up|down)_exps\.", "CUDA1"), (r"_exps\.", "CPU")),
    "tensor_split": (11.0, 11.0, 11.0, 11.0),
    "kv_type": "q8_0",
    "swa_full": False,
    "kv_offload": True,
}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A real GGUF (the bundled default) at a path of the test's own."""
    path = tmp_path / "models" / "smol.gguf"
    path.parent.mkdir()
    shutil.copyfile(default_model_path(), path)
    return path


def test_round_trip(model: Path) -> None:
    assert load_settings.load(model) is None

    load_settings.save(model, OPTIONS)

    assert load_settings.load(model) == OPTIONS
    stored = json.loads(load_settings.settings_path().read_text("utf-8"))
    (entry,) = stored["models"].values()
    assert entry["model_path"] == str(model.resolve())


def test_a_plans_options_load_back_equal(model: Path) -> None:
    options = {**load_options(plan(inspect_gguf(model), [], ram_bytes=8 << 30, n_ctx=8192))}
    options["engine"] = "llama.cpp"

    load_settings.save(model, options)

    assert load_settings.load(model) == options


def test_models_are_keyed_by_fingerprint_not_path(model: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF  # different weights, same header
    other.write_bytes(bytes(data))
    load_settings.save(model, OPTIONS)
    load_settings.save(other, {**OPTIONS, "n_ctx": 4096})

    moved = tmp_path / "moved.gguf"
    model.rename(moved)

    assert load_settings.load(moved) == OPTIONS
    assert load_settings.load(other)["n_ctx"] == 4096
    assert load_settings.load(model) is None  # nothing there any more


def test_saving_again_replaces_the_models_entry(model: Path) -> None:
    load_settings.save(model, OPTIONS)
    load_settings.save(model, {**OPTIONS, "kv_type": "f16"})

    assert load_settings.load(model)["kv_type"] == "f16"
    stored = json.loads(load_settings.settings_path().read_text("utf-8"))
    assert len(stored["models"]) == 1


@pytest.mark.parametrize(
    "content",
    ["{not json", '["a list"]', '{"version": 99, "models": {}}', '{"version": 1}', "\x00\x01"],
)
def test_a_damaged_file_is_kept_aside_and_ignored(model: Path, content: str) -> None:
    path = load_settings.settings_path()
    path.write_text(content, "utf-8")

    assert load_settings.load(model) is None

    damaged = path.with_name("load_settings.json.damaged")
    assert damaged.read_text("utf-8") == content
    assert not path.exists()
    load_settings.save(model, OPTIONS)
    assert load_settings.load(model) == OPTIONS
    assert damaged.read_text("utf-8") == content


def test_a_malformed_entry_reads_as_none(model: Path) -> None:
    load_settings.save(model, OPTIONS)
    path = load_settings.settings_path()
    stored = json.loads(path.read_text("utf-8"))
    for entry in stored["models"].values():
        entry["options"] = "not a dict"
    path.write_text(json.dumps(stored), "utf-8")

    assert load_settings.load(model) is None


def test_writes_are_atomic(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails halfway leaves the previous file whole and no temp file behind."""
    load_settings.save(model, OPTIONS)
    path = load_settings.settings_path()
    before = path.read_bytes()

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched, pytest.raises(OSError):
        patched.setattr(os, "replace", broken_replace)
        load_settings.save(model, {**OPTIONS, "n_ctx": 8192})

    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert load_settings.load(model) == OPTIONS


def test_options_json_cannot_hold_are_refused_before_writing(model: Path) -> None:
    load_settings.save(model, OPTIONS)
    before = load_settings.settings_path().read_bytes()

    with pytest.raises(TypeError):
        load_settings.save(model, {**OPTIONS, "n_ctx": object()})

    assert load_settings.settings_path().read_bytes() == before


def test_a_missing_model_has_no_settings(tmp_path: Path) -> None:
    assert load_settings.load(tmp_path / "gone.gguf") is None
