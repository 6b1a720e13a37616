"""Llama-family GGUF files on MLX: mlx-lm's llama modules, fed the GGUF's own tensors.

`mx.load` reads a GGUF and keeps Q4_0/Q4_1/Q8_0 tensors quantized as MLX affine triplets
(`weight` packed in uint32, `scales`, `biases`, group 32), so each maps onto an
`nn.QuantizedLinear`/`nn.QuantizedEmbedding` with no dequantize step; other types arrive
as floats. llama.cpp's converter permutes the rows of attn_q/attn_k so that RoPE rotates
*adjacent* pairs (its own convention). Instead of undoing that permutation (which would
touch packed rows), the model uses MLX's `traditional` RoPE, which rotates adjacent pairs:
the same computation llama.cpp runs, on the same bytes.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from app.engine.mlx.lm import packed_config
from app.engine.protocol import ModelLoadError

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_ROPE_FREQS = "rope_freqs.weight"  # Llama 3's per-dimension RoPE divisors, precomputed


def meta_value(metadata: dict[str, Any], key: str, default: Any = None) -> Any:
    """A GGUF metadata value as a Python scalar (mx.load returns numbers as 0-d arrays)."""
    value = metadata.get(key, default)
    return value.item() if isinstance(value, mx.array) and value.ndim == 0 else value


def model_args(metadata: dict[str, Any], weights: dict[str, mx.array]) -> llama.ModelArgs:
    """mlx-lm's llama arguments from the GGUF's `<arch>.*` keys."""
    arch = meta_value(metadata, "general.architecture")

    def get(key: str, default: Any = None) -> Any:
        value = meta_value(metadata, f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"The GGUF has no {arch}.{key}: it is not a complete model.")
        return value

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    rope_scaling = None
    if meta_value(metadata, f"{arch}.rope.scaling.type", "none") == "linear":
        rope_scaling = {"type": "linear", "factor": float(get("rope.scaling.factor"))}
    vocab = metadata.get("tokenizer.ggml.tokens")
    return llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=int(get("block_count")),
        intermediate_size=int(get("feed_forward_length")),
        num_attention_heads=heads,
        num_key_value_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", hidden // heads)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        vocab_size=int(get("vocab_size", len(vocab) if vocab else 0)),
        max_position_embeddings=int(get("context_length")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_traditional=True,  # see the module docstring
        rope_scaling=rope_scaling,
        tie_word_embeddings="output.weight" not in weights,
    )


def mlx_name(gguf_name: str) -> str | None:
    """The mlx-lm parameter a GGUF tensor fills (None: not a module parameter)."""
    base, _, suffix = gguf_name.rpartition(".")
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        target = _LAYER_NAMES.get(part)
        return f"model.layers.{layer}.{target}.{suffix}" if target else None
    target = _GLOBAL_NAMES.get(base)
    return f"{target}.{suffix}" if target else None


class _FreqRoPE(nn.Module):
    """RoPE with explicit per-dimension wavelengths (Llama 3's rope_freqs tensor)."""

    def __init__(self, dims: int, base: float, divisors: mx.array) -> None:
        super().__init__()
        self.dims = dims
        self._freqs = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims) * divisors

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        return mx.fast.rope(
            x, self.dims, traditional=True, base=None, scale=1.0, offset=offset, freqs=self._freqs
        )


def build(weights: dict[str, mx.array], metadata: dict[str, Any]) -> nn.Module:
    """The llama model holding the GGUF's tensors (quantized ones stay quantized)."""
    args = model_args(metadata, weights)
    model = llama.Model(args)
    mapped: dict[str, mx.array] = {}
    unknown = []
    for name, tensor in weights.items():
        target = mlx_name(name)
        if target is not None:
            mapped[target] = tensor
        elif name != _ROPE_FREQS:
            unknown.append(name)
    if unknown:
        raise ModelLoadError(
            f"The GGUF has tensors a llama model does not ({', '.join(sorted(unknown)[:3])}"
            f"{'…' if len(unknown) > 3 else ''}): it is another architecture under the llama name."
        )

    def quantized(path: str, module: nn.Module) -> dict[str, Any] | bool:
        if not hasattr(module, "to_quantized") or f"{path}.scales" not in mapped:
            return False
        return packed_config(path, module, mapped)

    nn.quantize(model, class_predicate=quantized)
    try:
        model.load_weights(list(mapped.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"The GGUF's tensors do not fit a llama model: {exc}") from exc
    if _ROPE_FREQS in weights:
        head_dim = args.head_dim
        for layer in model.layers:
            layer.self_attn.rope = _FreqRoPE(head_dim, args.rope_theta, weights[_ROPE_FREQS])
    return model
