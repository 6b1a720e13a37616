"""A GGUF's tensors on MLX, by the file's own table: what `mx.load` leaves out (everything
after an MXFP4 tensor) is read from the bytes, MXFP4 becomes MLX mxfp4 without dequantizing,
the packed types come back exactly as `mx.load` gives them, and a file of K-quant tensors is
refused in words before anything is expanded."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from app.engine import choice
from app.engine.gguf_info import inspect_gguf
from app.engine.mlx import gguf_tensors
from app.engine.mlx.models import _read_gguf
from app.engine.protocol import LoadOptions, ModelLoadError

Q = GGMLQuantizationType
ROWS, COLS = 6, 128


def matrix(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, COLS)).astype(np.float32)


def write(path: Path, tensors: list[tuple[str, np.ndarray, Q]], arch: str = "llama") -> Path:
    writer = GGUFWriter(path, arch)
    writer.add_block_count(1)
    for name, data, qtype in tensors:
        if data.dtype == np.uint8:  # bytes already in the type's blocks
            writer.add_tensor(name, data, raw_dtype=qtype)
        elif qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, data.astype(np.float16 if qtype == Q.F16 else np.float32))
        else:
            writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_bf16_stays_bfloat16(tmp_path: Path) -> None:
    """mx.load turns BF16 into float16 (another range); the table's reading keeps its bits."""
    path = write(tmp_path / "m.gguf", [("a.weight", matrix(1), Q.BF16)])
    ours = gguf_tensors.read(info := inspect_gguf(path), info.tensors)["a.weight"]
    assert ours.dtype == mx.bfloat16
    assert mx.array_equal(ours, mx.array(matrix(1)).astype(mx.bfloat16))


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_read_by_the_table_equals_mx_load(tmp_path: Path, qtype: Q) -> None:
    path = write(tmp_path / "m.gguf", [("a.weight", matrix(1), qtype)])
    theirs = mx.load(str(path))
    ours = gguf_tensors.read(info := inspect_gguf(path), info.tensors)
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert ours[name].dtype == value.dtype and ours[name].shape == value.shape, name
        assert mx.array_equal(ours[name], value), name


def test_mxfp4_is_kept_as_mlx_mxfp4(tmp_path: Path) -> None:
    data = matrix(2)
    path = write(tmp_path / "m.gguf", [("e.weight", data, Q.MXFP4)])
    ours = gguf_tensors.read(info := inspect_gguf(path), info.tensors)
    assert ours["e.weight"].dtype == mx.uint32 and ours["e.weight"].shape == (ROWS, COLS // 8)
    assert ours["e.scales"].dtype == mx.uint8 and ours["e.scales"].shape == (ROWS, COLS // 32)
    values = mx.dequantize(ours["e.weight"], ours["e.scales"], group_size=32, bits=4, mode="mxfp4")
    expected = dequantize(quantize(data, Q.MXFP4), Q.MXFP4)  # gguf-py's own reading
    assert np.array_equal(np.array(values.astype(mx.float32)), expected)


def test_what_mx_load_leaves_out_is_read(tmp_path: Path) -> None:
    """mx.load stops at the first MXFP4 tensor without a word; the table says what is owed."""
    tensors = [
        ("a.weight", matrix(3), Q.F32),
        ("e.weight", matrix(4), Q.MXFP4),
        ("b.weight", matrix(5), Q.Q8_0),
    ]
    path = write(tmp_path / "m.gguf", tensors)
    partial = mx.load(str(path))
    assert set(partial) == {"a.weight"}  # the gap this guards against (mlx 0.32)
    info = inspect_gguf(path)
    assert [t.name for t in gguf_tensors.missing(info, partial)] == ["e.weight", "b.weight"]
    weights, _ = _read_gguf(path)
    assert {"a.weight", "e.weight", "e.scales", "b.weight", "b.scales", "b.biases"} <= set(weights)
    b = mx.dequantize(weights["b.weight"], weights["b.scales"], weights["b.biases"], 32, 8)
    assert np.allclose(np.array(b), matrix(5), atol=0.05)


def test_a_cut_off_tensor_is_refused_in_words(tmp_path: Path) -> None:
    path = write(tmp_path / "m.gguf", [("e.weight", matrix(6), Q.MXFP4)])
    info = inspect_gguf(path)
    with path.open("r+b") as file:  # the header still promises the bytes
        file.truncate(path.stat().st_size - 10)
    with pytest.raises(ModelLoadError, match="truncated"):
        gguf_tensors.read(info, info.tensors)


def k_quant_file(path: Path) -> Path:
    """A file whose big tensor is Q4_K (bytes of the right size: only the table is read)."""
    block, size = 256, 144
    raw = np.zeros((64, 1024 // block * size), np.uint8)
    tensors = [("token_embd.weight", matrix(7), Q.F32), ("blk.0.ffn_gate_exps.weight", raw, Q.Q4_K)]
    return write(path, tensors, arch="deepseek4")


def test_k_quants_on_mlx_are_refused_with_their_cost(tmp_path: Path) -> None:
    path = k_quant_file(tmp_path / "q4k.gguf")
    with pytest.raises(ModelLoadError) as refused:
        _read_gguf(path)
    message = str(refused.value)
    assert "Q4_K" in message and "float16" in message and "llama.cpp" in message
    assert "Traceback" not in message


def test_k_quants_go_to_llamacpp_on_a_mac(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "apple_silicon", lambda: True)
    monkeypatch.setattr(choice, "mlx_installed", lambda: True)
    k_quants = choice.platform_choice(k_quant_file(tmp_path / "q4k.gguf"))
    assert k_quants.engine == "llama.cpp" and "Q4_K" in k_quants.reason
    mxfp4 = write(tmp_path / "e.gguf", [("e.weight", matrix(8), Q.MXFP4)], arch="deepseek4")
    assert choice.choose_engine(LoadOptions(str(mxfp4))).engine == "mlx"


def test_a_split_model_is_read_from_every_part(tmp_path: Path) -> None:
    """mx.load reads one file; a model published in parts has its tensors in all of them."""
    writer = GGUFWriter(tmp_path / "m.gguf", "llama", split_max_tensors=1)
    writer.add_block_count(1)
    for name, seed in (("a.weight", 9), ("b.weight", 10)):
        writer.add_tensor(name, quantize(matrix(seed), Q.Q8_0), raw_dtype=Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    first = tmp_path / "m-00001-of-00002.gguf"
    assert set(mx.load(str(first))) == {"a.weight", "a.scales", "a.biases"}
    weights, _ = _read_gguf(first)
    b = mx.dequantize(weights["b.weight"], weights["b.scales"], weights["b.biases"], 32, 8)
    assert np.allclose(np.array(b), matrix(10), atol=0.05)
