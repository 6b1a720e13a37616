"""mlx-lm's model pieces without its package's front door, and what GGUF loading needs of it.

`import mlx_lm.models.cache` first runs `mlx_lm/__init__.py`, which imports mlx-lm's converter
and generator and through them transformers, and transformers imports PyTorch wherever PyTorch
is installed: seconds per process and a second CUDA stack inside the MLX engine's process on a
CUDA machine (whose image carries PyTorch). The engine uses only mlx-lm's caches, samplers and
layer modules, which import MLX alone. So `register()`, which app/engine/mlx/__init__.py calls
(this module imports nothing heavy, so that works without MLX too), makes `mlx_lm` a package
whose __init__ has not run: its submodules import as usual, each with its own imports, and
transformers loads only where something needs it (an mlx-lm folder's Hugging Face tokenizer,
`mlx_lm.utils`). A process that imported mlx_lm before keeps it whole.

`packed_config` is `mlx_lm.utils.infer_quant_config` and `dequantized` its
`dequantize_model`, here because `mlx_lm.utils` imports transformers at its top (seconds in
every engine process) and every GGUF load asks the first, every CPU load the second.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mlx.nn as nn


def register() -> None:
    """`mlx_lm` importable without running its __init__ (see the module docstring)."""
    if "mlx_lm" in sys.modules:
        return
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or spec.submodule_search_locations is None:
        return  # no mlx-lm here: importing the engine says so where it is used
    package = importlib.util.module_from_spec(spec)
    sys.modules["mlx_lm"] = package
    from mlx_lm._version import __version__

    package.__version__ = __version__


def packed_config(path: str, module: nn.Module, weights: dict[str, Any]) -> dict[str, Any]:
    """The group size, bits and mode a packed weight was quantized with (mlx-lm's rule)."""
    import mlx.core as mx

    scales = weights[f"{path}.scales"]
    in_dims = module.weight.shape[-1]
    group_size = in_dims // scales.shape[-1]
    bits = (weights[f"{path}.weight"].shape[-1] * 32) // in_dims
    if scales.dtype != mx.uint8:  # only affine keeps its scales in the weights' dtype
        return {"group_size": group_size, "bits": bits, "mode": "affine"}
    modes = {(4, 16): "nvfp4", (4, 32): "mxfp4", (8, 32): "mxfp8"}
    if (bits, group_size) not in modes:
        raise ValueError(
            f"Cannot infer the quantization mode of {path}: {bits} bits, group size {group_size}."
        )
    return {"group_size": group_size, "bits": bits, "mode": modes[bits, group_size]}


def dequantized(model: nn.Module) -> nn.Module:
    """`model` with its quantized layers (linear, embedding, mlx-lm's expert switch) expanded
    to dense ones, exactly (mlx-lm's rule)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_unflatten
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

    dense: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.QuantizedEmbedding):
            kind, kwargs = nn.Embedding, {}
        elif isinstance(module, nn.QuantizedLinear | QuantizedSwitchLinear):
            kind = SwitchLinear if isinstance(module, QuantizedSwitchLinear) else nn.Linear
            kwargs = {"bias": "bias" in module}
        else:
            continue
        weight = mx.dequantize(
            module.weight,
            module.scales,
            module.biases,
            module.group_size,
            module.bits,
            module.mode,
        )
        layer = kind(*weight.shape[::-1], **kwargs)
        if kwargs.get("bias"):
            layer.bias = module.bias
        layer.weight = weight
        dense.append((name, layer))
    if dense:
        model.update_modules(tree_unflatten(dense))
    return model
