"""Stoke's MLX DeepSeek V4 against llama.cpp's `deepseek4` on random scaled GGUFs.

Both read the same F32 tensors; llama.cpp keeps its caches in F32 and runs without flash
attention, so the two differ only by summation order: raw window, 4:1 rows, 128:1 rows,
hash-routed and scored MoE layers, hyper-connections. With `indexer_top_k` 512 every visible
4:1 row is attended and the logits must agree to 1e-3 everywhere. With the scaled default of
8 (of up to 64 rows) the indexer really picks; there Stoke's indexer reads Q and K in fp16
(the kernels' precision contract) where llama.cpp's CPU path keeps Q in fp32, so a near-tie
at the 8th row can go the other way and its effect spreads to later rows: the acceptance is
top-1 agreement on >= 99% of positions, and the largest difference is reported.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from app.engine.llamacpp import cpu_buffers
from app.engine.mlx.gguf_deepseek_v4 import build
from app.hardware.synthetic_gguf import write_deepseek4

N_TOKENS = 256
GGML_TYPE_F32 = 0
# 16 indexer heads: with the scaled default of 4, ReLU zeroes every head of many rows and
# their scores tie exactly at 0, where llama.cpp's std::partial_sort and any canonical order
# pick different rows. DeepSeek V4 Flash has 64 heads.
DIMS = {"indexer_heads": 16}
ALL_ROWS = {"indexer_top_k": 512}  # every 4:1 row attended: the comparison is of one function


@pytest.fixture(scope="module")
def tokens() -> list[int]:
    return np.random.default_rng(7).integers(2, 512, N_TOKENS).tolist()


def llamacpp_logits(path: Path, tokens: list[int]) -> np.ndarray:
    llm = cpu_buffers.llama(
        str(path),
        n_ctx=512,
        n_batch=N_TOKENS,
        n_ubatch=N_TOKENS,
        logits_all=True,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
        flash_attn=False,
        n_threads=2,
        verbose=False,
    )
    try:
        llm.eval(tokens)
        return np.array(llm.scores[: len(tokens)], dtype=np.float32)
    finally:
        llm.close()


@pytest.mark.parametrize("top_k", [512, 8])
def test_next_token_logits_match_llamacpp(tmp_path: Path, tokens: list[int], top_k: int) -> None:
    gguf = write_deepseek4(
        tmp_path / "dsv4-f32.gguf",
        mode="scaled",
        seed=4,
        weights="f32",
        indexer_top_k=top_k,
        **DIMS,
    )
    weights, metadata = mx.load(str(gguf), return_metadata=True)
    model = build(weights, metadata)
    ours = np.array(model(mx.array([tokens]))[0])
    theirs = llamacpp_logits(gguf, tokens)

    top1 = float((ours.argmax(-1) == theirs.argmax(-1)).mean())
    max_abs = float(np.abs(ours - theirs).max())
    print(
        f"\nDeepSeek V4 MLX vs llama.cpp, indexer top-{top_k}, {N_TOKENS} tokens: top-1 "
        f"agreement {top1:.2%}, max |logit difference| {max_abs:.2e} "
        f"(logits up to {np.abs(theirs).max():.2f})"
    )
    assert top1 >= 0.99
    if top_k >= N_TOKENS // 4:  # no selection: the same function, to rounding
        assert max_abs < 1e-3


@pytest.mark.parametrize("packed", ["mxfp4", "quantized"])
def test_packed_weights_stay_packed_and_match_llamacpp(
    tmp_path: Path, tokens: list[int], packed: str
) -> None:
    """The 0731 release's GGUF keeps its routed experts in MXFP4 (after which `mx.load` returns
    nothing more); other files hold Q8_0. Read by the file's table, they stay packed on MLX
    (no float copy: the model's memory is the file's, within 15%), and the model computes what
    llama.cpp computes: exactly llama.cpp's function on a twin file holding the same values
    as F32, and on the packed file itself differing from llama.cpp by no more than llama.cpp
    differs from itself between the two (its CPU kernels round the activations to Q8 for
    these dot products; on random models with flat logits that alone flips ~10% of the
    argmaxes)."""
    from mlx.utils import tree_flatten

    from app.engine.mlx.fit import fit_device
    from app.engine.mlx.models import _read_gguf

    made = {
        kind: write_deepseek4(
            tmp_path / f"{kind}.gguf",
            mode="scaled",
            seed=4,
            weights=kind,
            indexer_top_k=512,
            **DIMS,
        )
        for kind in (packed, f"{packed}-values")
    }
    gguf = made[packed]
    mx.clear_cache()
    before = mx.get_active_memory()
    model = build(*_read_gguf(gguf))
    mx.eval(model.parameters())
    resident = mx.get_active_memory() - before
    experts = model.layers[2].ffn.switch_mlp.gate_proj
    mode = "mxfp4" if packed == "mxfp4" else "affine"
    assert (experts.mode, experts.weight.dtype) == (mode, mx.uint32)
    size = gguf.stat().st_size
    held = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    print(
        f"\n{packed} GGUF on MLX: file {size:,} B, parameters {held:,} B, resident {resident:,} B"
    )
    assert abs(resident - size) <= 0.15 * size

    ours = np.array(fit_device(model, gguf=True)(mx.array([tokens]))[0])
    same_values = llamacpp_logits(made[f"{packed}-values"], tokens)
    theirs = llamacpp_logits(gguf, tokens)
    assert (ours.argmax(-1) == same_values.argmax(-1)).mean() >= 0.99
    assert np.abs(ours - same_values).max() < 1e-3
    ours_off, own_off = np.abs(ours - theirs).max(), np.abs(same_values - theirs).max()
    print(f"{packed}: |MLX - llama.cpp| {ours_off:.3e}, llama.cpp's own rounding {own_off:.3e}")
    assert ours_off <= own_off + 1e-3
