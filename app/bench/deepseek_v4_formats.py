"""DeepSeek V4 in DeepSeek's release layout, and mlx-vlm's model reading it: the independent
reference Stoke's own DeepSeek V4 model is measured against (`stoke bench dsv4-reference`) and
tested against (tests/deepseek_v4_formats.py writes the other published formats from here).

`source_model` is a scaled `deepseek4` GGUF's weights (`synthetic_gguf`: hash layers, 4:1
layers with the indexer, 128:1 layers, hyper-connections, sinks, YaRN) in Stoke's model;
`write_official` writes a model's parameters as DeepSeek's release does (its names, FP4
experts with E8M0 scales per 32, an FP8 matrix with block scales, bfloat16 elsewhere).
`reference_model` loads any folder mlx-vlm reads (the release, mlx-lm's and mlx-vlm's
conversions) with mlx-vlm's own classes and `sanitize`, packed matrices expanded by
`mx.dequantize` (float32: MLX's CPU build runs its MoE in float32 only), so the reference
computes without any of Stoke's layers. mlx-vlm is not one of Stoke's dependencies: `make
test` installs it without its own (its converter, server and transformers are not needed to
build a model), and its package `__init__`s, which import them, are not run here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from app.engine.mlx.deepseek_v4 import Model
from app.hardware.synthetic_gguf import write_deepseek4

HF_PROJ = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
FP8_SCALE_EXPONENT = 124  # E8M0 byte: 2**(124 - 127) = 1/8
MLX_VLM = "mlx-vlm==0.7.10"


def source_model(folder: Path, seed: int = 4, **dims: int) -> tuple[Model, dict[str, Any], Path]:
    """Stoke's model of a scaled float32 GGUF's weights (`dims` override the scaled sizes),
    the GGUF's metadata, and the GGUF."""
    from app.engine.mlx.gguf_deepseek_v4 import build

    gguf = write_deepseek4(folder / "source.gguf", mode="scaled", seed=seed, weights="f32", **dims)
    weights, metadata = mx.load(str(gguf), return_metadata=True)
    model = build(weights, metadata)
    model.set_dtype(mx.float32)
    return model, metadata, gguf


def _vlm_module(name: str) -> types.ModuleType:
    """An mlx-vlm package as a bare namespace (its __init__ not run), so importing the model
    modules does not import its converter, server or transformers."""
    if name not in sys.modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError(f"{name} is not installed (make test installs mlx-vlm)")
        sys.modules[name] = importlib.util.module_from_spec(spec)
    return sys.modules[name]


def vlm_classes() -> tuple[type, type]:
    """mlx-vlm's DeepSeek V4 `LanguageModel` and `ModelConfig`."""
    for package in ("mlx_vlm", "mlx_vlm.models", "mlx_vlm.models.deepseek_v4"):
        _vlm_module(package)
    from mlx_vlm.models.deepseek_v4.config import ModelConfig
    from mlx_vlm.models.deepseek_v4.language import LanguageModel

    return LanguageModel, ModelConfig


def _fp4(weight: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """An expert matrix as DeepSeek ships it (int8 bytes of two E2M1 codes, E8M0 scales per
    32) and the values those bytes stand for."""
    packed, scales = mx.quantize(weight, group_size=32, bits=4, mode="mxfp4")
    values = mx.dequantize(packed, scales, group_size=32, bits=4, mode="mxfp4")
    return packed.view(mx.int8), scales, values


def _fp8(weight: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """An FP8 matrix with one block scale per 128 x 128, and its values."""
    codes = mx.to_fp8(weight * 8.0)
    rows, cols = weight.shape
    scale = mx.full(((rows + 127) // 128, (cols + 127) // 128), FP8_SCALE_EXPONENT, mx.uint8)
    return codes, scale, mx.from_fp8(codes, dtype=mx.float32) / 8.0


def write_official(model: Model, folder: Path, *, mtp: bool = True) -> dict[str, mx.array]:
    """`model` as a DeepSeek V4 release folder; returns the parameters it now stands for (the
    FP4/FP8 round trip changes the experts and the shared experts' gate)."""
    args = model.args
    folder.mkdir(parents=True, exist_ok=True)
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
                codes, scales, values = _fp4(value[e])
                key = f"layers.{layer}.ffn.experts.{e}.{HF_PROJ[proj]}"
                tensors[f"{key}.weight"], tensors[f"{key}.scale"] = codes, scales
                restored.append(values)
            exact[name] = mx.stack(restored)
            continue
        if name.endswith("shared_experts.w1.weight"):
            codes, scale, exact[name] = _fp8(value)
            tensors[hf], tensors[hf.replace(".weight", ".scale")] = codes, scale
            continue
        if name.endswith("attn.wo_a.weight"):
            value = value.reshape(-1, value.shape[-1])
        if name.endswith("tid2eid"):
            value = value.astype(mx.int64)
        tensors[hf] = value.astype(mx.bfloat16) if _castable(hf) else value
        exact[name] = tensors[hf].astype(exact[name].dtype).reshape(exact[name].shape)
    if mtp:  # a release also carries its MTP block, which the model leaves out
        tensors["mtp.0.norm.weight"] = mx.ones((args.hidden_size,))
    mx.save_safetensors(str(folder / "model-00001-of-00001.safetensors"), tensors)
    config = {k: v for k, v in vars(args).items() if k != "mtp_layers"}
    config["num_nextn_predict_layers"] = 1
    config["torch_dtype"] = "bfloat16"
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (folder / "config.json").write_text(json.dumps(config))
    return exact


def _castable(name: str) -> bool:
    """What a release keeps in bfloat16: matrices and norms, not the float32 hyper-connection
    weights, sinks, routing biases or the compressor's position terms."""
    kept = ("hc_", "attn_sink", "gate.bias", ".ape", "tid2eid")
    return not any(part in name for part in kept)


def reference_model(folder: Path, **overrides: Any) -> nn.Module:
    """mlx-vlm's language model holding `folder`'s weights (any dialect it reads), in float32:
    packed matrices are expanded with `mx.dequantize` (mode, bits and group size read off
    their shapes) before they are loaded, so the reference computes without Stoke's layers.
    HISA's block selection is off (`index_block` 0) so the indexer picks the exact top-k, as
    DeepSeek's own model does."""
    language_model, model_config = vlm_classes()
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    model = language_model(model_config.from_dict({**config, "index_block": 0, **overrides}))
    weights: dict[str, mx.array] = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(mx.load(str(file)))
    weights = {k.removeprefix("language_model."): v for k, v in weights.items()}
    weights = model.sanitize(weights)
    shapes = {name: value.shape for name, value in tree_flatten(model.parameters())}
    for name in [n for n in weights if n.endswith(".scales")]:
        stem = name.removesuffix(".scales")
        packed, scales = weights.pop(f"{stem}.weight"), weights.pop(name)
        biases = weights.pop(f"{stem}.biases", None)
        in_dims = shapes[f"{stem}.weight"][-1]
        bits = packed.shape[-1] * 32 // in_dims
        group_size = in_dims // scales.shape[-1]
        if biases is None:  # float-block scales are bytes: E8M0 per 32, or E4M3 per 16
            mode = {(4, 32): "mxfp4", (8, 32): "mxfp8", (4, 16): "nvfp4"}[bits, group_size]
        else:  # affine: expanded in float32, not in the scales' bfloat16
            mode, scales, biases = "affine", scales.astype(mx.float32), biases.astype(mx.float32)
        weights[f"{stem}.weight"] = mx.dequantize(
            packed, scales, biases, group_size=group_size, bits=bits, mode=mode
        )
    model.load_weights(list(weights.items()), strict=True)
    model.set_dtype(mx.float32)
    return model


def to_bfloat16(model: nn.Module) -> None:
    """mlx-vlm's model in bfloat16 as its converter casts it: float parameters its
    `cast_predicate` names (not the hyper-connection, sink and routing-bias ones)."""
    from mlx.utils import tree_unflatten

    cast = model.cast_predicate
    params = [
        (k, v.astype(mx.bfloat16) if cast(k) and mx.issubdtype(v.dtype, mx.floating) else v)
        for k, v in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(params))


def logits(model: nn.Module, tokens: list[int]) -> np.ndarray:
    """Logits [L, vocab] of one pass over `tokens`, float32, from Stoke's or mlx-vlm's model."""
    out = model(mx.array([tokens]), cache=model.make_cache())  # mlx-vlm masks by its cache
    out = getattr(out, "logits", out)
    return np.array(out[0].astype(mx.float32))


def top1_agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).mean())
