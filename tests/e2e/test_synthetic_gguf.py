"""Synthetic DeepSeek V4 Flash: the full sparse replica, and the scaled model llama.cpp runs."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest

from app.engine.gguf_info import GGUFInfo, inspect_gguf
from app.engine.llamacpp import cpu_buffers
from app.engine.llamacpp.backend import LlamaCppEngine, _install_log
from app.engine.protocol import FinishReason, LoadOptions, SamplingParams, TokenEvent
from app.hardware.synthetic_gguf import write_deepseek4

MIB = 1 << 20
FLASH_WEIGHTS_MIB = 148_899  # FIELD_NOTES: what llama.cpp maps for the 0731 release
EXPERT_LAYER_MIB = 3_264  # gate + up + down of 256 experts in MXFP4


@pytest.fixture(scope="module")
def full_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_deepseek4(tmp_path_factory.mktemp("flash") / "flash.gguf", mode="full")


@pytest.fixture(scope="module")
def full(full_file: Path) -> GGUFInfo:
    return inspect_gguf(full_file)


def test_full_file_is_sparse(full_file: Path) -> None:
    stat = full_file.stat()
    assert stat.st_size > 145 << 30
    assert stat.st_blocks * 512 < 64 * MIB


def test_full_file_header(full: GGUFInfo) -> None:
    assert full.architecture == "deepseek4"
    assert full.block_count == 43
    assert full.expert_count == 256
    assert full.expert_used_count == 6
    assert full.context_length == 1_048_576
    assert full.embedding_length == 4096
    assert full.vocab_size == 129_280
    assert full.file_type == "MXFP4_MOE"
    assert full.metadata["deepseek4.attention.compress_ratios"] == (0, 0) + (4, 128) * 20 + (4,)
    assert len(full.tensors) == 1328  # 1,199 dense + 129 routed-expert tensors


def test_full_file_sizes(full: GGUFInfo) -> None:
    kinds = full.bytes_by_kind()
    print(
        f"\nfull replica: {full.total_bytes / MIB:,.2f} MiB of weights "
        f"(FIELD_NOTES {FLASH_WEIGHTS_MIB:,}); by kind, MiB: "
        + ", ".join(f"{k} {v / MIB:,.1f}" for k, v in sorted(kinds.items()))
    )
    assert full.total_bytes / MIB == pytest.approx(FLASH_WEIGHTS_MIB, rel=0.01)
    assert kinds["expert"] == 43 * EXPERT_LAYER_MIB * MIB
    assert set(full.bytes_by_layer("expert").values()) == {EXPERT_LAYER_MIB * MIB}
    outside_gpu = kinds["expert"] + kinds["embedding"]  # experts offloaded, token_embd on CPU
    assert (full.total_bytes - outside_gpu) / MIB == pytest.approx(7_537, abs=1)


def test_full_file_layer_pattern(full: GGUFInfo) -> None:
    names = {t.name: t for t in full.tensors}
    gate = names["blk.42.ffn_gate_exps.weight"]
    assert (gate.ggml_type, gate.shape, gate.kind) == ("MXFP4", (4096, 2048, 256), "expert")
    assert names["blk.0.ffn_down_exps.weight"].shape == (2048, 4096, 256)
    assert names["blk.0.ffn_up_shexp.weight"].kind == "shared_expert"
    for layer in range(43):
        has = {name.split(".", 2)[2] for name in names if name.startswith(f"blk.{layer}.")}
        assert ("attn_compressor_kv.weight" in has) == (layer >= 2)
        assert ("indexer.attn_q_b.weight" in has) == (layer >= 2 and layer % 2 == 0)
        assert ("ffn_gate_tid2eid.weight" in has) == (layer < 3)
        assert ("exp_probs_b.bias" in has) == (layer >= 3)


def test_llama_cpp_accepts_the_full_file(full_file: Path, full: GGUFInfo) -> None:
    """A dry run (no allocation, no reads) through llama.cpp's own deepseek4 loader."""
    _install_log()  # llama.cpp's log goes to the engine's buffer, not the terminal
    params = cpu_buffers.model_params()
    params.no_alloc = True
    params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
    model = llama_cpp.llama_model_load_from_file(str(full_file).encode(), params)
    assert model, "llama.cpp rejected the full replica"
    try:
        assert llama_cpp.llama_model_size(model) == full.total_bytes
        assert 284e9 < llama_cpp.llama_model_n_params(model) < 285e9
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = 8192
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        assert ctx, "llama.cpp could not plan a context for the full replica"
        llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_model_free(model)


def test_scaled_model_generates(tmp_path: Path) -> None:
    path = write_deepseek4(tmp_path / "scaled.gguf", mode="scaled", seed=1)
    info = inspect_gguf(path)
    experts = [t for t in info.tensors if t.kind == "expert"]
    assert len(experts) == 3 * info.block_count
    assert info.expert_count == 8
    engine = LlamaCppEngine()
    loaded = engine.load(LoadOptions(str(path), n_ctx=512, snapshots=False))
    try:
        assert loaded.architecture == "deepseek4"
        prompt = engine.tokenize("the quick brown fox jumps over the lazy dog. " * 8)
        assert len(prompt) > 128  # past a 128:1 compression block and the sliding window
        events = list(engine.generate([loaded.bos_id, *prompt], SamplingParams.greedy(), 12))
    finally:
        engine.unload()
    *tokens, stats = events
    assert len(tokens) == 12 and all(isinstance(t, TokenEvent) for t in tokens)
    assert stats.finish_reason is FinishReason.LENGTH


def test_scaled_model_is_reproducible(tmp_path: Path) -> None:
    a = write_deepseek4(tmp_path / "a.gguf", mode="scaled", seed=3)
    b = write_deepseek4(tmp_path / "b.gguf", mode="scaled", seed=3)
    c = write_deepseek4(tmp_path / "c.gguf", mode="scaled", seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_scaled_model_serves_two_slots_branches_and_snapshots(tmp_path: Path) -> None:
    """deepseek4's hybrid memory copies only whole sequences and cannot cut one mid-way:
    a second slot, a branch and a snapshot round trip must all work anyway."""
    path = write_deepseek4(tmp_path / "scaled.gguf", mode="scaled", seed=2)
    engine = LlamaCppEngine()
    loaded = engine.load(LoadOptions(str(path), n_ctx=1024))
    try:
        prompt = [loaded.bos_id, *engine.tokenize("a hybrid memory test. " * 10)]

        def reply(slot: str, tokens: list[int]) -> tuple[list[int], object]:
            *events, stats = engine.generate(tokens, SamplingParams.greedy(), 8, slot=slot)
            return [e.token_id for e in events], stats

        first, _ = reply("a", prompt)
        second, stats = reply("b", prompt)  # a partial copy from "a" used to abort here
        assert second == first and stats.prefilled_tokens == len(prompt)
        branch, stats = reply("a", prompt[:-5])  # shorter: the memory cannot be cut, re-prefill
        assert stats.finish_reason is FinishReason.LENGTH and len(branch) == 8
        assert engine.snapshot("b", wait=True) > 0
    finally:
        engine.unload()
