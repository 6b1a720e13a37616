"""Weights in the form the device runs fastest (its own module so that a benchmark can fit a
model without the engine's tokenizers and their dependencies)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


def fit_device(model: nn.Module, *, gguf: bool) -> nn.Module:
    """Weights in the form this device runs fastest. MLX's CPU kernels for quantized
    matmuls are slower than its dense float32 ones, so on the CPU (Linux tests) quantized
    layers are expanded to float32, exactly (scales cast first); GPUs keep them packed.
    A GGUF keeps its norms in float32 beside float16 scales: on a GPU everything computes
    in float16, as the quantized layers do."""
    if mx.default_device() == mx.cpu:
        from app.engine.mlx.lm import dequantized

        model.set_dtype(mx.float32)
        model = dequantized(model)
        model.set_dtype(mx.float32)  # float-block modes (mxfp4, mxfp8) expand to bfloat16
        return model
    if gguf:
        model.set_dtype(mx.float16)
    return model
