"""Tiny DeepSeek V4 models in every format DeepSeek V4 Flash is published in, from one set of
weights, and mlx-vlm's model as the independent reference that reads them.

The weights are a scaled `deepseek4` GGUF's (`synthetic_gguf`, float32, every structural
feature: hash layers, 4:1 layers with the indexer, 128:1 layers, hyper-connections, sinks,
YaRN). From them:

- `official_folder`: DeepSeek's release layout and names (FP4 experts with E8M0 scales, an FP8
  matrix with a block scale), as `tests/unit/test_deepseek_v4_loading.py` checks it;
- `mlx_lm_folder`: what mlx-lm's converter writes from that release (mlx-community's uploads):
  mlx-vlm's language model (the same names as mlx-lm's `deepseek_v4.py`, which no released
  mlx-lm ships) read through its own `sanitize`, quantized and saved by mlx-lm's own
  `quantize_model`/`save_model`/`save_config`, per recipe (affine bits and group size, mxfp4,
  mixed_2_6, ...);
- `mlx_vlm_folder`: the same under `language_model.`, with mlx-vlm's own quantization recipe
  (mxfp8 attention and shared experts, mxfp4 routed experts, affine 8-bit elsewhere);
- every folder gets the GGUF's tokenizer (`tokenizer.json`) and a chat template, so the app runs
  it as a user's download.

`reference_model(folder)` loads any of these with mlx-vlm's classes and `sanitize` (its
quantized layers found the way mlx-lm's loader finds them), expanded to float32 as MLX's CPU
build needs: the independent reference Stoke's model is checked against. mlx-vlm is a
test-only dependency installed without its dependencies (`make test`); its package
`__init__`s, which import its converter, transformers and more, are not run.
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
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>"
    "{{ m['content'] }}{% elif m['role'] == 'assistant' %}<｜Assistant｜>{{ m['content'] }}"
    "{{ eos_token }}{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)
# mlx-lm recipes by name: quantize_model's (group_size, bits, mode), or a mixed recipe
RECIPES: dict[str, tuple[int, int, str] | str] = {
    "q4-g64": (64, 4, "affine"),
    "q8-g64": (64, 8, "affine"),
    "q2-g32": (32, 2, "affine"),
    "q3-g128": (128, 3, "affine"),
    "q5-g32": (32, 5, "affine"),
    "q6-g128": (128, 6, "affine"),
    "mxfp4": (32, 4, "mxfp4"),
    "mxfp8": (32, 8, "mxfp8"),
    "mixed_2_6": "mixed_2_6",
}


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


def source_model(folder: Path, seed: int = 4) -> tuple[Model, dict[str, Any], Path]:
    """Stoke's model of a scaled float32 GGUF's weights, the GGUF's metadata, and the GGUF."""
    from app.engine.mlx.gguf_deepseek_v4 import build

    gguf = write_deepseek4(folder / "source.gguf", mode="scaled", seed=seed, weights="f32")
    weights, metadata = mx.load(str(gguf), return_metadata=True)
    model = build(weights, metadata)
    model.set_dtype(mx.float32)
    return model, metadata, gguf


def write_tokenizer(metadata: dict[str, Any], folder: Path) -> None:
    """The GGUF's byte-level BPE vocabulary as a Hugging Face tokenizer, with a chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = list(metadata["tokenizer.ggml.tokens"])
    kinds = metadata["tokenizer.ggml.token_type"].tolist()
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    control = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True) for t, k in zip(tokens, kinds, strict=True) if k == control]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokens[0],
        "eos_token": tokens[1],
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")


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
        if biases is None:  # float-block scales are exponent bytes
            mode = {4: "mxfp4", 8: "mxfp8"}[bits]
        else:  # affine: expanded in float32, not in the scales' bfloat16
            mode, scales, biases = "affine", scales.astype(mx.float32), biases.astype(mx.float32)
        weights[f"{stem}.weight"] = mx.dequantize(
            packed, scales, biases, group_size=group_size, bits=bits, mode=mode
        )
    model.load_weights(list(weights.items()), strict=True)
    model.set_dtype(mx.float32)
    return model


def _quantized(official: Path, recipe: str) -> tuple[nn.Module, dict[str, Any]]:
    """mlx-lm's conversion of the release at `official`: loaded, expanded, cast to bfloat16
    (the hyper-connection and routing parameters kept in float32, as mlx-vlm's
    `cast_predicate` says), quantized by mlx-lm's `quantize_model` with `recipe`."""
    from mlx_lm.convert import mixed_quant_predicate_builder
    from mlx_lm.utils import quantize_model

    model = reference_model(official)
    keep = model.cast_predicate
    model.update(
        dict(
            _unflatten(
                {
                    k: v.astype(mx.bfloat16)
                    if keep(k) and mx.issubdtype(v.dtype, mx.floating)
                    else v
                    for k, v in tree_flatten(model.parameters())
                }
            )
        )
    )
    config = json.loads((official / "config.json").read_text())
    config.pop("quantization_config", None)
    spec = RECIPES[recipe]
    if isinstance(spec, str):
        predicate = mixed_quant_predicate_builder(spec, model)
        return quantize_model(model, config, 64, 2, quant_predicate=predicate)
    group_size, bits, mode = spec  # every layer alike (mlx-vlm's own recipe is not mlx-lm's)
    return quantize_model(model, config, group_size, bits, mode=mode, quant_predicate=_every)


def _every(path: str, module: nn.Module) -> bool:
    return True


def _unflatten(flat: dict[str, mx.array]) -> Any:
    from mlx.utils import tree_unflatten

    return tree_unflatten(list(flat.items()))


def mlx_lm_folder(official: Path, folder: Path, recipe: str, metadata: dict[str, Any]) -> Path:
    """The release at `official` as mlx-lm's converter writes it with `recipe`."""
    from mlx_lm.utils import save_config, save_model

    model, config = _quantized(official, recipe)
    save_model(folder, model)
    save_config(config, folder / "config.json")
    write_tokenizer(metadata, folder)
    return folder


def mlx_vlm_folder(official: Path, folder: Path, metadata: dict[str, Any]) -> Path:
    """The release at `official` as mlx-vlm's converter writes it with `-q`: its own mixed
    recipe (`quant_predicate`), keys under `language_model.`."""
    from mlx_lm.utils import quantize_model, save_config

    model = reference_model(official)
    config = json.loads((official / "config.json").read_text())
    config.pop("quantization_config", None)
    model, config = quantize_model(model, config, 64, 8, quant_predicate=model.quant_predicate)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {f"language_model.{k}": v for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(folder / "model.safetensors"), weights, {"format": "mlx"})
    config["quantization"] = {
        (f"language_model.{k}" if isinstance(v, dict) else k): v
        for k, v in config["quantization"].items()
    }
    save_config(config, folder / "config.json")
    write_tokenizer(metadata, folder)
    return folder


def logits(model: nn.Module, tokens: list[int]) -> np.ndarray:
    """Logits [L, vocab] of one pass over `tokens`, float32, from Stoke's or mlx-vlm's model."""
    out = model(mx.array([tokens]), cache=model.make_cache())  # mlx-vlm masks by its cache
    out = getattr(out, "logits", out)
    return np.array(out[0].astype(mx.float32))


def top1_agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).mean())
