"""Tiny DeepSeek V4 models in every format DeepSeek V4 Flash is published in, from one set of
weights, and mlx-vlm's model as the independent reference that reads them.

The weights are a scaled `deepseek4` GGUF's (`synthetic_gguf`, float32, every structural
feature: hash layers, 4:1 layers with the indexer, 128:1 layers, hyper-connections, sinks,
YaRN). From them:

- `write_official`: DeepSeek's release layout and names (FP4 experts with E8M0 scales, an FP8
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

The weights, the release writer and mlx-vlm's reference model (`reference_model(folder)`, the
independent reference Stoke's model is checked against) come from
`app.bench.deepseek_v4_formats`, which `stoke bench dsv4-reference` shares.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from app.bench.deepseek_v4_formats import (
    logits,
    reference_model,
    source_model,
    to_bfloat16,
    top1_agreement,
    vlm_classes,
    write_official,
)
from tests.e2e import mlx_folder

__all__ = [
    "RECIPES",
    "logits",
    "mlx_lm_folder",
    "mlx_vlm_folder",
    "reference_model",
    "source_model",
    "top1_agreement",
    "vlm_classes",
    "write_official",
    "write_tokenizer",
]
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
    "nvfp4": (16, 4, "nvfp4"),
    "mixed_2_6": "mixed_2_6",
}


def write_tokenizer(metadata: dict[str, Any], folder: Path) -> None:
    """The GGUF's tokenizer as a Hugging Face one, with DeepSeek's turn markers as template."""
    mlx_folder.write_tokenizer(metadata, folder, CHAT_TEMPLATE)


def _quantized(official: Path, recipe: str) -> tuple[nn.Module, dict[str, Any]]:
    """mlx-lm's conversion of the release at `official`: loaded, expanded, cast to bfloat16
    (the hyper-connection and routing parameters kept in float32, as mlx-vlm's
    `cast_predicate` says), quantized by mlx-lm's `quantize_model` with `recipe`."""
    from mlx_lm.convert import mixed_quant_predicate_builder
    from mlx_lm.utils import quantize_model

    model = reference_model(official)
    to_bfloat16(model)
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
