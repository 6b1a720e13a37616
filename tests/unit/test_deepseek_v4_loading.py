"""Loading DeepSeek V4 checkpoints: a Hugging Face folder (FP4 experts, FP8 matrices, its own
names) and an MLX folder of this model's own parameters, through mlx-lm's loader as the MLX
engine calls it; the GGUF name map covers every tensor the generator writes."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

from app.engine.mlx.deepseek_v4 import Model, ModelArgs
from app.engine.mlx.deepseek_v4.names import gguf_to_model
from app.hardware.synthetic_gguf import SCALED, tensor_specs
from tests.deepseek_v4_formats import write_official
from tests.unit.test_deepseek_v4_cache import random_model, tiny_args


def classes(config: dict) -> tuple[type, type]:
    return Model, ModelArgs


@pytest.fixture(scope="module")
def tokens() -> mx.array:
    return mx.array([np.random.default_rng(3).integers(0, 97, 140).tolist()])


def test_hugging_face_folder(tmp_path: Path, tokens: mx.array) -> None:
    original = random_model(tiny_args(moe_intermediate_size=32), seed=5)
    exact = write_official(original, tmp_path)
    loaded, _ = load_model(tmp_path, get_model_classes=classes)
    assert type(loaded.layers[2].ffn.switch_mlp.gate_proj).__name__ == "QuantizedSwitchLinear"
    assert loaded.layers[2].ffn.switch_mlp.gate_proj.mode == "mxfp4"
    assert loaded.layers[2].ffn.shared_experts.w1.mode == "mxfp8"  # FP8 kept at 8 bits

    loaded.set_dtype(mx.float32)  # the release's bfloat16, computed as the reference does
    reference = Model(original.args)
    reference.load_weights(list(exact.items()), strict=True)
    ours, theirs = np.array(loaded(tokens)), np.array(reference(tokens))
    assert np.abs(ours - theirs).max() < 1e-4


def test_mlx_folder_of_its_own_parameters(tmp_path: Path, tokens: mx.array) -> None:
    original = random_model(tiny_args(), seed=6)
    mx.save_safetensors(
        str(tmp_path / "model.safetensors"), dict(tree_flatten(original.parameters()))
    )
    (tmp_path / "config.json").write_text(json.dumps(vars(original.args)))
    loaded, _ = load_model(tmp_path, get_model_classes=classes)
    assert np.array_equal(np.array(loaded(tokens)), np.array(original(tokens)))


def test_gguf_names_cover_the_model() -> None:
    """Every tensor llama.cpp's loader knows maps to a distinct parameter, and back."""
    names = [gguf_to_model(spec.name) for spec in tensor_specs(SCALED)]
    assert None not in names
    assert len(set(names)) == len(names)
    model_params = {name for name, _ in tree_flatten(Model(_scaled_args()).parameters())}
    assert set(names) == model_params


def _scaled_args() -> ModelArgs:
    d = SCALED
    return ModelArgs(
        vocab_size=d.n_vocab,
        hidden_size=d.n_embd,
        num_hidden_layers=d.n_layer,
        num_attention_heads=d.n_head,
        head_dim=d.head_dim,
        qk_rope_head_dim=d.n_rot,
        q_lora_rank=d.q_lora_rank,
        o_groups=d.o_groups,
        o_lora_rank=d.o_lora_rank,
        sliding_window=d.sliding_window,
        compress_ratios=[d.compress_ratio(i) for i in range(d.n_layer)],
        index_n_heads=d.indexer_heads,
        index_head_dim=d.indexer_head_dim,
        index_topk=d.indexer_top_k,
        n_routed_experts=d.n_expert,
        num_experts_per_tok=d.n_expert_used,
        moe_intermediate_size=d.n_ff_exp,
        num_hash_layers=d.hash_layers,
    )
