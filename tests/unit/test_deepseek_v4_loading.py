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
from app.engine.mlx.gguf_deepseek_v4 import mlx_name
from app.hardware.synthetic_gguf import SCALED, tensor_specs
from tests.unit.test_deepseek_v4_cache import random_model, tiny_args

HF_PROJ = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
FP8_SCALE_EXPONENT = 124  # E8M0 byte: 2**(124 - 127) = 1/8


def classes(config: dict) -> tuple[type, type]:
    return Model, ModelArgs


def fp4(weight: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """An expert matrix as DeepSeek ships it (int8 bytes of two E2M1 codes, E8M0 scales per
    32) and the values those bytes stand for."""
    packed, scales = mx.quantize(weight, group_size=32, bits=4, mode="mxfp4")
    values = mx.dequantize(packed, scales, group_size=32, bits=4, mode="mxfp4")
    return packed.view(mx.int8), scales, values


def fp8(weight: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """An FP8 matrix with one block scale, and its values."""
    codes = mx.to_fp8(weight * 8.0)
    scale = mx.full((1, 1), FP8_SCALE_EXPONENT, mx.uint8)
    return codes, scale, mx.from_fp8(codes, dtype=mx.float32) / 8.0


def hugging_face_checkpoint(model: Model, folder: Path) -> dict[str, mx.array]:
    """Write `model` as a DeepSeek V4 release folder; return the parameters it now stands for
    (the FP4/FP8 round trip changes the experts and the shared experts' gate)."""
    args = model.args
    tensors: dict[str, mx.array] = {}
    exact: dict[str, mx.array] = {}
    for name, value in tree_flatten(model.parameters()):
        exact[name] = value
        hf = name
        for stage in ("hc_attn", "hc_ffn"):
            hf = hf.replace(f".{stage}.", f".{stage}_")
        if ".switch_mlp." in name:
            layer, proj = name.split(".")[1], name.split(".")[-2]
            restored = []
            for e in range(value.shape[0]):
                codes, scales, values = fp4(value[e])
                key = f"layers.{layer}.ffn.experts.{e}.{HF_PROJ[proj]}"
                tensors[f"{key}.weight"], tensors[f"{key}.scale"] = codes, scales
                restored.append(values)
            exact[name] = mx.stack(restored)
            continue
        if name.endswith("shared_experts.w1.weight"):
            codes, scale, exact[name] = fp8(value)
            tensors[hf], tensors[hf.replace(".weight", ".scale")] = codes, scale
            continue
        if name.endswith("attn.wo_a.weight"):
            value = value.reshape(-1, value.shape[-1])
        if name.endswith("tid2eid"):
            value = value.astype(mx.int64)
        tensors[hf] = value
    # what a release also carries and this model does not use
    tensors["layers.0.ffn.gate.bias"] = mx.zeros((args.n_routed_experts,))
    tensors["layers.3.ffn.gate.bias_vl"] = mx.zeros((args.n_routed_experts,))
    tensors["mtp.0.norm.weight"] = mx.ones((args.hidden_size,))
    mx.save_safetensors(str(folder / "model-00001-of-00001.safetensors"), tensors)
    config = {k: v for k, v in vars(args).items()}
    config["num_nextn_predict_layers"] = 1
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (folder / "config.json").write_text(json.dumps(config))
    return exact


@pytest.fixture(scope="module")
def tokens() -> mx.array:
    return mx.array([np.random.default_rng(3).integers(0, 97, 140).tolist()])


def test_hugging_face_folder(tmp_path: Path, tokens: mx.array) -> None:
    original = random_model(tiny_args(moe_intermediate_size=32), seed=5)
    exact = hugging_face_checkpoint(original, tmp_path)
    loaded, _ = load_model(tmp_path, get_model_classes=classes)
    assert type(loaded.layers[2].ffn.switch_mlp.gate_proj).__name__ == "QuantizedSwitchLinear"
    assert loaded.layers[2].ffn.switch_mlp.gate_proj.mode == "mxfp4"

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
    names = [mlx_name(spec.name) for spec in tensor_specs(SCALED)]
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
