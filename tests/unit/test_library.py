"""The model library against the real default model, small written GGUFs and an MLX folder."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from app import paths
from app.cli import models as cli
from app.engine.model_file import fingerprint
from app.hardware.detect import AppleInfo, CpuInfo, GpuInfo, Hardware, MemoryInfo
from app.hardware.planner import DeviceBudget, plan
from app.models import catalog, library
from app.models.default import default_model_path
from app.models.library import Library, LibraryError, ModelEntry


def write_gguf(path: Path, *, split: bool = False, template: bool = True) -> list[Path]:
    """A tiny llama GGUF (two parts when `split`), quick to write and to inspect."""
    writer = GGUFWriter(path, "llama", split_max_tensors=2 if split else 0)
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(32)
    writer.add_file_type(1)  # MOSTLY_F16
    if template:
        writer.add_chat_template("{{ messages }}")
    for name in (
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.1.attn_q.weight",
        "output.weight",
    ):
        writer.add_tensor(name, np.ones((8, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    stem = path.name.removesuffix(".gguf")
    return sorted(path.parent.glob(f"{stem}-*-of-*.gguf")) if split else [path]


def write_mlx(folder: Path) -> Path:
    """An MLX-style 4-bit model folder: config, one safetensors shard, tokenizer config."""
    folder.mkdir(parents=True)
    config = {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "max_position_embeddings": 32768,
        "quantization": {"group_size": 64, "bits": 4},
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    tensors = {  # a 4-bit [64, 128] weight packs into uint32 [64, 16]
        "model.layers.0.mlp.up_proj.weight": ("U32", [64, 16]),
        "model.layers.0.mlp.up_proj.scales": ("F16", [64, 2]),
        "model.layers.0.mlp.up_proj.biases": ("F16", [64, 2]),
        "model.norm.weight": ("F16", [128]),
    }
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = int(np.prod(shape)) * (4 if dtype == "U32" else 2)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return folder


@pytest.fixture(scope="module")
def smollm_entry(tmp_path_factory: pytest.TempPathFactory) -> ModelEntry:
    """The default model imported once (inspecting its 49k-token vocabulary takes seconds)."""
    home = tmp_path_factory.mktemp("smol-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(home))
        return Library().import_model(default_model_path())


# --- metadata -----------------------------------------------------------------------------------


def test_import_of_the_default_model_shows_its_metadata(smollm_entry: ModelEntry) -> None:
    model = smollm_entry
    assert model.format == "gguf"
    assert model.name == "SmolLM2-135M-Instruct.Q4_1"
    assert model.architecture == "llama"
    assert model.parameters is not None and 130e6 < model.parameters < 140e6
    assert model.quantization == "Q4_1"
    assert model.context_length == 8192
    assert model.chat_template is True
    assert model.size_bytes == default_model_path().stat().st_size
    assert model.id == model.fingerprint == fingerprint(default_model_path())
    assert model.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and not model.linked
    assert model.to_dict()["fingerprint"] == model.id
    assert ModelEntry.from_dict(json.loads(json.dumps(model.to_dict()))) == model


def test_truncated_gguf_is_refused_with_the_inspectors_reason(tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(default_model_path().read_bytes()[: 20 << 20])
    with pytest.raises(LibraryError, match=r"cut\.gguf is truncated: tensor .* Download it again"):
        Library().import_model(cut)
    assert list(paths.models_dir().iterdir()) == []


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    notes = tmp_path / "notes.gguf"
    notes.write_text("my shopping list, not a model")
    with pytest.raises(LibraryError, match="is not a GGUF model file"):
        Library().import_model(notes)


def test_split_set_is_one_model(tmp_path: Path) -> None:
    parts = write_gguf(paths.models_dir() / "tiny.gguf", split=True)
    assert len(parts) == 2
    (model,) = Library().models()
    assert (model.name, model.path, model.files) == ("tiny", parts[0], tuple(parts))
    assert model.parameters == 4 * 8 * 32
    assert (model.quantization, model.context_length, model.chat_template) == ("F16", 256, True)
    assert model.size_bytes == sum(p.stat().st_size for p in parts)
    parts[1].unlink()
    lib = Library()
    assert lib.models() == []
    assert [p.message for p in lib.problems] == [
        f"tiny-00001-of-00002.gguf is one part of a 2-part model, but tiny-00002-of-00002.gguf "
        f"is missing. Download every part into {paths.models_dir()}."
    ]


def test_mlx_folder_is_scanned(tmp_path: Path) -> None:
    folder = write_mlx(paths.models_dir() / "Qwen2-tiny-4bit")
    (model,) = Library().models()
    assert (model.format, model.name, model.path) == ("mlx", "Qwen2-tiny-4bit", folder)
    assert model.architecture == "qwen2"
    assert model.parameters == 64 * 128 + 128  # scales and biases are not parameters
    assert (model.quantization, model.context_length, model.chat_template) == ("4bit", 32768, True)
    assert model.size_bytes == sum(f.stat().st_size for f in folder.iterdir())
    with pytest.raises(LibraryError, match="load settings cover GGUF models"):
        Library().set_load_settings(model.id, {"n_ctx": 4096})


# --- scanning fast --------------------------------------------------------------------------


def test_rescan_reads_the_cache_until_a_file_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    (path,) = write_gguf(paths.models_dir() / "cached.gguf")
    first = Library().models()
    inspected: list[Path] = []
    real = library._inspect

    def counting(kind: library.ModelFormat, first_path: Path) -> ModelEntry:
        inspected.append(first_path)
        return real(kind, first_path)

    monkeypatch.setattr(library, "_inspect", counting)
    assert Library().models() == first
    assert inspected == []
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 1_000_000_000))
    # a new mtime may mean new weights, so the id (the fingerprint) follows it
    assert Library().models()[0].id == fingerprint(path, hash_content=False) != first[0].id
    assert inspected == [path]


# --- operations ---------------------------------------------------------------------------------


def test_import_modes_copy_move_and_link(tmp_path: Path) -> None:
    lib = Library()
    (copied,) = write_gguf(tmp_path / "a.gguf")
    (moved,) = write_gguf(tmp_path / "b.gguf", template=False)
    linked = write_mlx(tmp_path / "mlx-model")
    a = lib.import_model(copied)
    b = lib.import_model(moved, "move")
    c = lib.import_model(linked, "link")
    assert copied.exists() and not moved.exists()
    assert (paths.models_dir() / "mlx-model").is_symlink() and c.linked
    assert {m.name for m in lib.models()} == {"a", "b", "mlx-model"}
    assert not b.chat_template
    assert lib.total_size() == a.size_bytes + b.size_bytes  # the link's bytes are elsewhere
    with pytest.raises(LibraryError, match=r"already has a\.gguf"):
        lib.import_model(copied)
    with pytest.raises(LibraryError, match="already in the library"):
        lib.import_model(paths.models_dir() / "a.gguf")
    lib.delete("mlx-model")
    assert (tmp_path / "mlx-model" / "config.json").exists()  # only the link went


def test_import_refuses_when_the_disk_is_too_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (source,) = write_gguf(tmp_path / "big.gguf")
    monkeypatch.setattr(library, "disk_free", lambda path: 100)
    with pytest.raises(LibraryError, match=r"needs [\d.]+ kB, 100 bytes free"):
        Library().import_model(source)
    Library().import_model(source, "link")  # a link needs no space


def test_rename_keeps_id_and_settings(tmp_path: Path) -> None:
    lib = Library()
    parts = write_gguf(tmp_path / "tiny.gguf", split=True)
    model = lib.import_model(parts[1])  # any part brings the whole set
    lib.set_load_settings(model.id, {"n_ctx": 4096, "n_gpu_layers": 99, "engine": "llama.cpp"})
    renamed = lib.rename("tiny", "mine")
    assert [f.name for f in renamed.files] == [
        "mine-00001-of-00002.gguf",
        "mine-00002-of-00002.gguf",
    ]
    assert renamed.id == model.id
    assert Library().models() == [renamed]
    assert Library().load_settings("mine")["n_gpu_layers"] == 99
    with pytest.raises(LibraryError, match="cannot be a model name"):
        lib.rename("mine", "../escape")
    with pytest.raises(LibraryError, match="plain values"):
        lib.set_load_settings("mine", {"callback": print})


def test_delete_removes_files_and_kv_snapshots(tmp_path: Path) -> None:
    lib = Library()
    (source,) = write_gguf(tmp_path / "gone.gguf")
    model = lib.import_model(source)
    snapshots = paths.kv_dir(model.id)
    (snapshots / "conv-1.kv").write_bytes(b"STKV")
    other = paths.kv_dir("0123456789abcdef")
    lib.delete(model.id)
    assert not model.path.exists()
    assert not snapshots.exists()
    assert other.exists()  # another model's snapshots stay
    assert lib.models() == []
    with pytest.raises(LibraryError, match="No model 'gone' in the library"):
        lib.delete("gone")


def test_user_folders(tmp_path: Path) -> None:
    lib = Library()
    extra = tmp_path / "external-disk"
    extra.mkdir()
    write_gguf(extra / "far.gguf")
    lib.add_folder(extra)
    assert [m.name for m in Library().models()] == ["far"]
    with pytest.raises(LibraryError, match="already a library folder"):
        lib.add_folder(extra)
    extra.rename(tmp_path / "unplugged")
    lib = Library()
    assert lib.models() == []
    assert lib.problems[0].message == f"The library folder {extra} is not available."
    lib.remove_folder(extra)
    assert lib.folders() == [paths.models_dir()]


# --- the catalog ------------------------------------------------------------------------------


def machine(*, gpus: int = 0, gpu_gib: int = 0, ram_gib: int, apple: bool = False) -> Hardware:
    gib = 1 << 30
    return Hardware(
        os="Darwin" if apple else "Linux",
        machine="arm64" if apple else "x86_64",
        cpu=CpuInfo("test", 16, 8),
        memory=MemoryInfo(ram_gib * gib, ram_gib * gib),
        models_dir="/models",
        disk_free=0,
        gpus=tuple(
            GpuInfo(i, f"CUDA{i}", "test GPU", "gpu", "cuda", gpu_gib * gib, gpu_gib * gib)
            for i in range(gpus)
        ),
        gpu_offload=gpus > 0 or apple,
        rebuild_hint=None,
        apple=AppleInfo("M3 Ultra", ram_gib * gib, None) if apple else None,
    )


def test_catalog_lists_the_flagship_first_as_people_download_it() -> None:
    entries = catalog.load_catalog()
    assert entries[0].family == "DeepSeek V4 Flash"
    flagship = [e for e in entries if e.family == "DeepSeek V4 Flash"]
    assert {e.format for e in flagship} == {"gguf", "mlx"}
    repos = {e.repo.split("/")[0] for e in flagship}
    assert {"mlx-community", "unsloth", "antirez", "deepseek-ai"} <= repos
    assert all("Source:" in e.notes for e in flagship)  # where each figure comes from
    assert {"smollm2-135m", "smollm2-360m", "smollm2-1.7b", "qwen2.5-0.5b"} <= {
        e.id for e in entries
    }
    assert all(e.files or e.quant for e in entries)  # each says what to download


def test_verdicts_follow_gpu_and_ram() -> None:
    entries = {e.id: e for e in catalog.load_catalog()}
    q2, smol = entries["deepseek-v4-flash-q2"], entries["smollm2-135m"]
    four_3060s = machine(gpus=4, gpu_gib=12, ram_gib=128)
    assert catalog.verdict(smol, four_3060s) == catalog.FITS_GPU
    assert catalog.verdict(q2, four_3060s) == catalog.FITS_EXPERT_OFFLOAD
    assert (
        catalog.verdict(entries["deepseek-v4-flash-q4"], four_3060s) == catalog.FITS_EXPERT_OFFLOAD
    )
    laptop = machine(ram_gib=16)
    one_4090 = machine(gpus=1, gpu_gib=24, ram_gib=128)
    assert catalog.verdict(smol, laptop) == catalog.RUNS_ON_CPU
    assert catalog.verdict(q2, laptop) == catalog.DOES_NOT_FIT
    assert catalog.verdict(q2, machine(ram_gib=192, apple=True)) == catalog.FITS_GPU
    dense = dataclasses.replace(q2, moe=False, family="A dense model")
    assert catalog.verdict(dense, four_3060s) == catalog.FITS_CPU_OFFLOAD
    assert catalog.verdict(entries["deepseek-v4-flash-mxfp4"], one_4090) == catalog.DOES_NOT_FIT
    assert catalog.verdict(q2, machine(gpus=8, gpu_gib=141, ram_gib=1024)) == catalog.FITS_GPU


def test_flagship_verdicts_are_the_planners() -> None:
    """DeepSeek V4 Flash entries are planned on the real layout, expert tensors sized to the
    entry's file, before anything is downloaded; small models say they rest on size."""
    entries = {e.id: e for e in catalog.load_catalog()}
    mxfp4, smol = entries["deepseek-v4-flash-mxfp4"], entries["smollm2-135m"]
    four_3060s = machine(gpus=4, gpu_gib=12, ram_gib=128)
    fit = catalog.assess(mxfp4, four_3060s)
    assert fit.basis == "planner"
    sized = catalog._sized(catalog.flash_layout(), mxfp4.size_bytes)
    assert sized.total_bytes == pytest.approx(mxfp4.size_bytes, rel=1e-6)
    devices = [DeviceBudget(f"CUDA{i}", 12 << 30) for i in range(4)]
    p = plan(sized, devices, ram_bytes=(128 << 30) - (1 << 30), n_ctx=catalog.PLAN_CONTEXT)
    assert p.fits and 0 < p.expert_bytes_gpu < p.expert_bytes_total
    assert fit.detail.startswith(f"{p.expert_layers_on_gpu:.1f} of 43 expert layers")
    assert catalog.assess(smol, four_3060s).basis == "size"
    short = catalog.assess(mxfp4, machine(gpus=1, gpu_gib=24, ram_gib=128))
    assert short.verdict == catalog.DOES_NOT_FIT and "more RAM" in short.detail


def test_speed_class_reads_active_weights_where_they_live() -> None:
    """Decode reads a token's active weights where the plan put them: the MXFP4 file on the
    seed's 4x3060 box lands at the 10.1 tok/s it measured (FIELD_NOTES); the 2-bit one keeps
    twice the expert layers on the GPUs and is faster."""
    entries = {e.id: e for e in catalog.load_catalog()}
    q2, smol = entries["deepseek-v4-flash-q2"], entries["smollm2-135m"]
    assert catalog.active_fraction(q2) == 13 / 284
    assert catalog.active_fraction(smol) == 1.0
    four_3060s = machine(gpus=4, gpu_gib=12, ram_gib=128)
    assert catalog.speed_class(entries["deepseek-v4-flash-mxfp4"], four_3060s) == (
        "usable, up to ~10 tok/s"
    )
    assert catalog.speed_class(q2, four_3060s) == "usable, up to ~17 tok/s"
    assert catalog.speed_class(smol, four_3060s).startswith("fast")
    assert catalog.speed_class(q2, machine(ram_gib=16)) is None  # does not fit


# --- the command line -------------------------------------------------------------------------


def run_cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="stoke")
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["models", *argv])
    code = args.run(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_import_list_info_delete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (source,) = write_gguf(tmp_path / "cli.gguf")
    assert run_cli("import", str(source), "--link", capsys=capsys)[0] == 0
    code, out, _ = run_cli("list", "--json", capsys=capsys)
    listed = json.loads(out)
    names = [m["name"] for m in listed["models"]]
    assert code == 0 and names == ["cli", "SmolLM2-135M-Instruct.Q4_1"]  # and the bundled one
    assert listed["total_bytes"] == 0  # linked
    code, out, _ = run_cli("info", "cli", capsys=capsys)
    assert code == 0 and "architecture  llama" in out and "parameters    1.0K" in out
    code, _, err = run_cli("delete", "cli", capsys=capsys)  # not a terminal: needs --yes
    assert code == 1 and "needs --yes" in err
    assert run_cli("delete", "cli", "--yes", capsys=capsys)[0] == 0
    assert source.exists()  # the link went, the file stayed
    code, _, err = run_cli("info", "cli", capsys=capsys)
    assert code == 1 and err.startswith("stoke: No model 'cli' in the library.")


def test_flagship_verdict_falls_back_to_size_when_the_layout_cannot_be_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(catalog, "flash_layout", full_disk)
    q2 = {e.id: e for e in catalog.load_catalog()}["deepseek-v4-flash-q2"]
    fit = catalog.assess(q2, machine(gpus=4, gpu_gib=12, ram_gib=128))
    assert (fit.basis, fit.verdict) == ("size", catalog.FITS_EXPERT_OFFLOAD)


def test_each_entry_names_the_engine_that_runs_it_here() -> None:
    entries = {e.id: e for e in catalog.load_catalog()}
    mac = machine(ram_gib=192, apple=True)
    q4 = catalog.assess(entries["deepseek-v4-flash-q4"], mac)
    assert q4.engine == "llama.cpp" and "Q4_K" in q4.engine_reason
    assert catalog.assess(entries["deepseek-v4-flash-mxfp4"], mac).engine == "MLX"
    assert catalog.assess(entries["deepseek-v4-flash-mlx-4bit"], mac).engine == "MLX"
    pc = machine(gpus=4, gpu_gib=12, ram_gib=128)
    assert catalog.assess(entries["deepseek-v4-flash-mxfp4"], pc).engine == "llama.cpp"
    folder_on_pc = catalog.assess(entries["deepseek-v4-flash-mlx-4bit"], pc)
    assert "Apple Silicon" in folder_on_pc.engine_reason


def test_catalog_notes_state_each_download_size_as_the_card_does() -> None:
    """A card shows its size once, as `decimal_bytes` writes it; a figure in its notes with
    decimals is that same size, never another rounding or a GiB figure beside it (the
    whole numbers there are machines' RAM: "for 128 GB machines")."""
    from app.models.catalog import load_catalog
    from app.units import decimal_bytes

    for entry in load_catalog():
        assert "GiB" not in entry.notes, entry.name
        for figure in re.findall(r"\d+\.\d+ (?:GB|TB|MB)", entry.notes):
            assert figure == decimal_bytes(entry.size_bytes), (entry.name, figure)
