"""Checkpoint tensors as `Model` parameters: any published dialect's names (`names`) and
layouts mapped onto the modules, FP8 block-scaled matrices kept as MLX mxfp8 and FP4 experts
as MLX mxfp4, and MLX-quantized modules (any mode, bits and group size, mixed per layer) swapped
in where the tensors are packed."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from app.engine.mlx.deepseek_v4.args import ModelArgs
from app.engine.mlx.deepseek_v4.names import canonical
from app.engine.mlx.lm import packed_config

_PROJ = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}
_FP8_BLOCK = 128  # DeepSeek's FP8 matrices carry one scale per 128 x 128 block


def _e8m0(scale: mx.array) -> mx.array:
    """Scales as floats: E8M0 bytes are biased powers of two."""
    if scale.dtype == mx.uint8:
        return mx.power(2.0, scale.astype(mx.float32) - 127.0)
    return scale.astype(mx.float32)


def _dequantize_fp8(weight: mx.array, scale: mx.array) -> mx.array:
    """An FP8 (E4M3) matrix with per-block scales, as bfloat16."""
    if weight.dtype not in (mx.uint8, mx.int8):
        return weight
    rows, cols = weight.shape
    values = mx.from_fp8(weight.view(mx.uint8), dtype=mx.float32)
    factors = mx.repeat(mx.repeat(_e8m0(scale), _FP8_BLOCK, axis=0), _FP8_BLOCK, axis=1)
    return (values * factors[:rows, :cols]).astype(mx.bfloat16)


def _fp8(weight: mx.array, scale: mx.array) -> tuple[mx.array, mx.array | None]:
    """An FP8 matrix with E8M0 block scales as MLX mxfp8 (its E4M3 bytes as uint32 words, the
    block's exponent repeated per 32 values): the same numbers at 8 bits, where bfloat16
    would double the release's non-expert weights. Scales that are not E8M0 bytes, or rows
    not a multiple of 32 wide, are dequantized to bfloat16."""
    if weight.dtype not in (mx.uint8, mx.int8):
        return weight, None
    rows, cols = weight.shape
    if scale.dtype != mx.uint8 or cols % 32:
        return _dequantize_fp8(weight, scale), None
    per_32 = mx.repeat(mx.repeat(scale, _FP8_BLOCK // 32, axis=1), _FP8_BLOCK, axis=0)
    return weight.view(mx.uint8).view(mx.uint32), per_32[:rows, : cols // 32]


def _fp4_or_float(weight: mx.array, scale: mx.array | None) -> tuple[mx.array, mx.array | None]:
    """One routed expert's matrix: packed FP4 bytes as MLX mxfp4 (uint32 words, uint8
    scales), FP8 as mxfp8, floats as they are."""
    if scale is None:
        return weight, None
    if weight.shape[-1] == 16 * scale.shape[-1]:  # two codes a byte, 32 codes a scale
        return weight.view(mx.uint8).view(mx.uint32), scale.view(mx.uint8)
    return _fp8(weight, scale)


def sanitize_checkpoint(args: ModelArgs, weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """`Model.sanitize` without the quantized-layer swap (its docstring says what it does)."""
    out: dict[str, mx.array] = {}
    experts: dict[str, list[tuple[int, mx.array, mx.array | None]]] = {}
    named = {ours: value for name, value in weights.items() if (ours := canonical(name))}
    for name, value in named.items():
        quant_scale = name.endswith(".scale") and name[:-6] + ".weight" in named
        hf_mtp = name.startswith("mtp.") and not args.mtp_layers  # a GGUF's is kept (mtp.0.)
        beyond = name.startswith("layers.") and int(name.split(".")[1]) >= args.num_hidden_layers
        if hf_mtp or beyond or name.endswith(".bias_vl") or quant_scale:
            continue
        layer, _, rest = name.removeprefix("layers.").partition(".")
        scale = named.get(name.removesuffix(".weight") + ".scale")
        if rest.startswith("ffn.experts."):
            expert, proj, _ = rest.removeprefix("ffn.experts.").split(".")
            experts.setdefault(f"layers.{layer}.ffn.switch_mlp.{_PROJ[proj]}", []).append(
                (int(expert), value, scale)
            )
            continue
        hashed = name.startswith("layers.") and int(layer) < args.num_hash_layers
        if name.endswith(".gate.bias") and hashed:
            continue  # hash layers route by table; llama.cpp drops this bias too
        packed = None
        if name.endswith("tid2eid"):
            value = value.astype(mx.int32)
        elif scale is not None:
            value, packed = _fp8(value, scale)
        if ".attn.wo_a." in name and value.ndim == 2:  # official: flat; MLX's: 3-D already
            value = value.reshape(args.o_groups, args.o_lora_rank, -1)
            if packed is not None:
                packed = packed.reshape(args.o_groups, args.o_lora_rank, -1)
        out[name] = value
        if packed is not None:
            out[name.removesuffix(".weight") + ".scales"] = packed
    for path, parts in experts.items():
        parts.sort(key=lambda part: part[0])
        packed = [_fp4_or_float(value, scale) for _, value, scale in parts]
        out[f"{path}.weight"] = mx.stack([w for w, _ in packed])
        if packed[0][1] is not None:
            out[f"{path}.scales"] = mx.stack([sc for _, sc in packed])
    return out


def quantize_for(model: nn.Module, weights: dict[str, mx.array]) -> None:
    """Swap in quantized layers wherever the checkpoint brings packed weights."""

    def packed(path: str, module: nn.Module) -> dict[str, Any] | bool:
        if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
            return False
        return packed_config(path, module, weights)

    nn.quantize(model, class_predicate=packed)
