"""One name per model: the library, the API's model list, the CLI and the window's header
all call a model by its file (or folder), and the bundled model is listed, read-only."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from app.cli import models as cli
from app.engine.gguf_info import inspect_gguf
from app.models.default import default_model_path
from app.models.library import Library, LibraryError
from app.models.names import model_name

SMOL = "SmolLM2-135M-Instruct.Q4_1"


def test_a_model_is_named_by_its_file_not_its_metadata() -> None:
    assert model_name(default_model_path()) == SMOL
    assert inspect_gguf(default_model_path()).metadata["general.name"] != SMOL  # the trap
    assert model_name("/m/DeepSeek-V4-Q4_K_M-00001-of-00004.gguf") == "DeepSeek-V4-Q4_K_M"
    assert model_name("/m/Qwen3-8B-4bit") == "Qwen3-8B-4bit"  # an MLX folder


def test_the_bundled_model_is_listed_and_read_only(stoke_home: Path) -> None:
    library = Library()
    assert library.models() == []
    (bundled,) = library.listed()
    assert (bundled.name, bundled.bundled, bundled.path) == (SMOL, True, default_model_path())
    assert library.get(SMOL) == bundled
    with pytest.raises(LibraryError, match="comes with Stoke; it cannot be deleted"):
        library.delete(SMOL)
    with pytest.raises(LibraryError, match="cannot be renamed"):
        library.rename(SMOL, "mine")
    assert default_model_path().exists()


def test_a_library_copy_shadows_the_bundled_model(stoke_home: Path, tmp_path: Path) -> None:
    copy = Library().import_model(default_model_path(), "copy")
    assert [m.path for m in Library().listed()] == [copy.path]
    assert Library().get(SMOL) == copy
    other = tmp_path / "Other.gguf"
    shutil.copyfile(default_model_path(), other)
    Library().import_model(other, "copy")
    assert sorted(m.name for m in Library().listed()) == ["Other", SMOL]


def test_models_list_shows_the_bundled_model(
    stoke_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli._list(argparse.Namespace(json=True)) == 0
    (listed,) = json.loads(capsys.readouterr().out)["models"]
    assert (listed["name"], listed["bundled"]) == (SMOL, True)


def test_memory_is_written_in_gib_and_files_in_decimal_units() -> None:
    from app.hardware.detect import CpuInfo, GpuInfo, Hardware, MemoryInfo
    from app.ui.models.words import machine_summary
    from app.units import decimal_bytes

    gib = 1 << 30
    gpu = GpuInfo(0, "CUDA0", "RTX 4090", "gpu", "cuda", 24 * gib, 24 * gib)
    hardware = Hardware(
        os="Linux",
        machine="x86_64",
        cpu=CpuInfo("Ryzen", 32, 16),
        memory=MemoryInfo(128 * gib, 120 * gib),
        models_dir="/tmp",
        disk_free=1 << 40,
        gpus=(gpu,),
        gpu_offload=True,
        rebuild_hint=None,
    )
    summary = machine_summary(hardware)
    assert summary.endswith("128.0 GiB RAM") and " GB" not in summary
    assert decimal_bytes(default_model_path().stat().st_size) == "98.4 MB"  # a file
