"""DeepSeek V4 GGUF files (llama.cpp arch `deepseek4`) on MLX: names, hyperparameters, build.

llama.cpp's converter copies the checkpoint's tensors without permuting them, so a GGUF
tensor read by `mx.load` (numpy order: the reverse of ggml's ne) has the Hugging Face shape,
and each GGUF name maps onto one parameter of `deepseek_v4.Model`. Q4_0/Q4_1/Q8_0 arrive as
MLX affine triplets and become quantized layers; F16/F32/BF16 and the types `mx.load`
dequantizes arrive as floats; MXFP4 (the released experts) `mx.load` cannot read, and the
load says so.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from app.engine.mlx.deepseek_v4 import Model, ModelArgs
from app.engine.mlx.deepseek_v4.names import gguf_to_model
from app.engine.protocol import ModelLoadError

ARCHITECTURE = "deepseek4"


def model_args(metadata: dict[str, Any], has_mtp: bool = True) -> ModelArgs:
    """`ModelArgs` from the GGUF's `deepseek4.*` keys (llama.cpp's `load_arch_hparams`).
    `has_mtp`: whether the file holds the MTP block's tensors; antirez's files say
    `nextn_predict_layers` 1 without them, and llama.cpp then counts no MTP block either."""

    def get(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{ARCHITECTURE}.{key}", default)
        if value is None:
            raise ModelLoadError(
                f"The GGUF has no {ARCHITECTURE}.{key}: it is not a complete model."
            )
        return value.tolist() if isinstance(value, mx.array) else value

    n_mtp = int(metadata.get(f"{ARCHITECTURE}.nextn_predict_layers", 0)) if has_mtp else 0
    if n_mtp > 1:
        raise ModelLoadError("This GGUF has several MTP blocks; DeepSeek V4 has one.")
    n_layer = int(get("block_count")) - n_mtp
    limits = get("swiglu_clamp_exp")
    limits = limits if isinstance(limits, list) else [limits] * n_layer
    if len(set(limits[:n_layer])) > 1:
        raise ModelLoadError(
            "This GGUF clamps SwiGLU differently per layer, which Stoke's MLX model does not."
        )
    if int(get("expert_gating_func")) != 4:
        raise ModelLoadError(
            "DeepSeek V4 routes with sqrt(softplus); this GGUF names another gating."
        )
    vocab = metadata.get("tokenizer.ggml.tokens")
    rope_scaling = None
    if metadata.get(f"{ARCHITECTURE}.rope.scaling.type") == "yarn":
        rope_scaling = {
            "type": "yarn",
            "factor": float(get("rope.scaling.factor")),
            "original_max_position_embeddings": int(get("rope.scaling.original_context_length")),
            "beta_fast": float(get("rope.scaling.yarn_beta_fast", 32.0)),
            "beta_slow": float(get("rope.scaling.yarn_beta_slow", 1.0)),
        }
    try:
        return ModelArgs(
            vocab_size=int(get("vocab_size", len(vocab) if vocab else 0)),
            hidden_size=int(get("embedding_length")),
            num_hidden_layers=n_layer,
            num_attention_heads=int(get("attention.head_count")),
            head_dim=int(get("attention.key_length")),
            qk_rope_head_dim=int(get("rope.dimension_count")),
            q_lora_rank=int(get("attention.q_lora_rank")),
            o_groups=int(get("attention.output_group_count")),
            o_lora_rank=int(get("attention.output_lora_rank")),
            sliding_window=int(get("attention.sliding_window")),
            compress_ratios=[int(r) for r in get("attention.compress_ratios")],
            compress_rope_theta=float(get("attention.compress_rope_freq_base")),
            rope_theta=float(get("rope.freq_base", 10_000.0)),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(get("context_length")),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
            index_n_heads=int(get("attention.indexer.head_count")),
            index_head_dim=int(get("attention.indexer.key_length")),
            index_topk=int(get("attention.indexer.top_k")),
            n_routed_experts=int(get("expert_count")),
            num_experts_per_tok=int(get("expert_used_count")),
            n_shared_experts=int(get("expert_shared_count")),
            moe_intermediate_size=int(get("expert_feed_forward_length")),
            num_hash_layers=int(get("hash_layer_count")),
            routed_scaling_factor=float(get("expert_weights_scale")),
            norm_topk_prob=bool(get("expert_weights_norm")),
            swiglu_limit=float(limits[0]),
            hc_mult=int(get("hyper_connection.count")),
            hc_sinkhorn_iters=int(get("hyper_connection.sinkhorn_iterations")),
            hc_eps=float(get("hyper_connection.epsilon")),
            mtp_layers=n_mtp,
        )
    except ValueError as exc:
        raise ModelLoadError(f"The GGUF's DeepSeek V4 settings do not fit together: {exc}") from exc


def build(weights: dict[str, mx.array], metadata: dict[str, Any]) -> nn.Module:
    """The DeepSeek V4 model holding the GGUF's tensors (quantized ones stay quantized)."""
    last = int(metadata.get(f"{ARCHITECTURE}.block_count", 0)) - 1
    args = model_args(metadata, any(n.startswith(f"blk.{last}.nextn.") for n in weights))
    model = Model(args)
    mapped: dict[str, mx.array] = {}
    unknown = []
    mtp_block = args.num_hidden_layers if args.mtp_layers else -1
    for name, tensor in weights.items():
        target = gguf_to_model(name, mtp_block)
        if target is None:
            unknown.append(name)
        else:
            mapped[target] = tensor
    if unknown:
        raise ModelLoadError(
            f"The GGUF has tensors DeepSeek V4 does not ({', '.join(sorted(unknown)[:3])}"
            f"{'…' if len(unknown) > 3 else ''})."
        )
    try:
        model.load_weights(list(model.sanitize(mapped).items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"The GGUF's tensors do not fit a DeepSeek V4 model: {exc}") from exc
    return model
