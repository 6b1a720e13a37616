"""GGUF inspection against the real default model, damaged copies and split files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from app.engine.gguf_info import GGUFInfo, classify, inspect_gguf
from app.engine.protocol import ModelLoadError
from app.models.default import default_model_path


@pytest.fixture(scope="module")
def smollm() -> GGUFInfo:
    return inspect_gguf(default_model_path())


def test_default_model_header(smollm: GGUFInfo) -> None:
    assert smollm.architecture == "llama"
    assert smollm.block_count == 30
    assert smollm.context_length == 8192
    assert smollm.embedding_length == 576
    assert smollm.expert_count is None
    assert smollm.file_type == "Q4_1"
    assert smollm.vocab_size == 49152
    assert smollm.files == (default_model_path(),)
    assert smollm.metadata["llama.attention.head_count"] == 9


def test_default_model_tensors(smollm: GGUFInfo) -> None:
    by_name = {t.name: t for t in smollm.tensors}
    embd = by_name["token_embd.weight"]
    assert (embd.kind, embd.layer, embd.shape) == ("embedding", None, (576, 49152))
    q = by_name["blk.7.attn_q.weight"]
    assert (q.kind, q.layer, q.ggml_type, q.shape) == ("attention", 7, "Q4_1", (576, 576))
    assert by_name["blk.0.ffn_up.weight"].kind == "ffn_dense"
    assert by_name["blk.0.ffn_norm.weight"].kind == "norm"
    assert set(smollm.bytes_by_kind()) == {"embedding", "attention", "ffn_dense", "norm"}
    assert list(smollm.bytes_by_layer()) == list(range(30))
    assert len(set(smollm.bytes_by_layer().values())) == 1  # every llama block is alike
    size = default_model_path().stat().st_size
    assert all(t.offset + t.n_bytes <= size for t in smollm.tensors)
    assert 0.95 * size < smollm.total_bytes < size  # everything but the header is weights
    assert sum(smollm.bytes_by_kind().values()) == smollm.total_bytes


def test_truncated_copy_is_refused(tmp_path: Path) -> None:
    data = default_model_path().read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"cut\.gguf is truncated: tensor blk\.\d+\."):
        inspect_gguf(cut)


def test_header_cut_short_is_refused(tmp_path: Path) -> None:
    cut = tmp_path / "head.gguf"
    cut.write_bytes(default_model_path().read_bytes()[: 64 << 10])
    with pytest.raises(ModelLoadError, match="truncated or damaged"):
        inspect_gguf(cut)


def test_garbage_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        inspect_gguf(junk)


def _write_split(path: Path) -> list[Path]:
    writer = GGUFWriter(path, "llama", split_max_tensors=2)
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(32)
    names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.attn_q.weight", "output.weight"]
    for name in names:
        writer.add_tensor(name, np.zeros((8, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(path.parent.glob("tiny-*-of-*.gguf"))


def test_split_model_is_read_as_one(tmp_path: Path) -> None:
    parts = _write_split(tmp_path / "tiny.gguf")
    assert [p.name for p in parts] == ["tiny-00001-of-00002.gguf", "tiny-00002-of-00002.gguf"]
    info = inspect_gguf(parts[1])  # any part names the whole model
    assert info.files == tuple(parts)
    assert info.path == parts[0]
    assert info.block_count == 2
    assert [(t.name, t.part) for t in info.tensors] == [
        ("token_embd.weight", 0),
        ("blk.0.attn_q.weight", 0),
        ("blk.1.attn_q.weight", 1),
        ("output.weight", 1),
    ]
    assert info.total_bytes == 4 * 8 * 32 * 4


def test_split_model_with_a_missing_part(tmp_path: Path) -> None:
    parts = _write_split(tmp_path / "tiny.gguf")
    parts[1].unlink()
    with pytest.raises(ModelLoadError, match=r"tiny-00002-of-00002\.gguf is missing"):
        inspect_gguf(parts[0])


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("blk.5.ffn_gate_exps.weight", "expert"),
        ("blk.5.ffn_down_exps.weight", "expert"),
        ("blk.5.ffn_gate_up_exps.weight", "expert"),
        ("blk.5.ffn_up_shexp.weight", "shared_expert"),
        ("blk.5.ffn_gate_inp_shexp.weight", "shared_expert"),
        ("blk.5.attn_q_b.weight", "attention"),
        ("blk.5.attn_output_a.weight", "attention"),
        ("blk.5.attn_sinks.weight", "attention"),
        ("blk.5.attn_compressor_kv.weight", "attention"),
        ("blk.5.indexer.attn_q_b.weight", "attention"),
        ("blk.5.indexer_compressor_ape.weight", "attention"),
        ("blk.5.attn_kv_a_norm.weight", "norm"),
        ("blk.5.indexer_compressor_norm.weight", "norm"),
        ("blk.5.ffn_down.weight", "ffn_dense"),
        ("blk.5.ffn_gate_inp.weight", "other"),
        ("blk.5.exp_probs_b.bias", "other"),
        ("blk.5.ffn_gate_tid2eid.weight", "other"),
        ("blk.5.hc_attn_fn.weight", "other"),
        ("token_embd.weight", "embedding"),
        ("token_embd_norm.weight", "norm"),
        ("output.weight", "output"),
        ("output_hc_fn.weight", "output"),
        ("output_norm.weight", "norm"),
    ],
)
def test_classify(name: str, kind: str) -> None:
    assert classify(name) == kind
