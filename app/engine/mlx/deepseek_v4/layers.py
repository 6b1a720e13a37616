"""The numeric building blocks after ggml: RMS norm and ggml's NORM-mode RoPE with YaRN
(llama.cpp's numbers are the reference, so its formulas are used rather than mlx-lm's)."""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from app.engine.mlx.deepseek_v4.args import ModelArgs


def rms_norm(x: mx.array, eps: float) -> mx.array:
    return mx.fast.rms_norm(x, None, eps)


def grouped_linear(layer: nn.Module, x: mx.array) -> mx.array:
    """x [G, L, in] through a (quantized) SwitchLinear's G matrices -> [G, L, out] as one
    batched matmul: every token uses every group here, where the layer's own call would
    gather a matrix per token and group."""
    if "scales" in layer:
        return mx.quantized_matmul(
            x,
            layer["weight"],
            scales=layer["scales"],
            biases=layer.get("biases"),
            transpose=True,
            group_size=layer.group_size,
            bits=layer.bits,
            mode=layer.mode,
        )
    return x @ layer["weight"].swapaxes(-1, -2)


class RoPE:
    """ggml's NORM-mode RoPE (adjacent pairs) on the last `dims` channels, with YaRN.

    Same frequencies, ramp and magnitude as `ggml_rope_ext` (ggml-cpu/ops.cpp `rope_yarn`):
    llama.cpp's numbers are the reference, so its formula is used rather than mlx-lm's YaRN.
    """

    def __init__(self, dims: int, base: float, yarn: dict[str, Any] | None) -> None:
        self.dims = dims
        pair = np.arange(dims // 2, dtype=np.float32)
        theta = np.float32(base) ** (-2.0 * pair / dims)
        self.mscale = 1.0
        if yarn is not None:
            freq_scale = np.float32(1.0 / yarn["factor"])
            corr = [
                dims
                * math.log(yarn["original_max_position_embeddings"] / (beta * 2 * math.pi))
                / (2 * math.log(base))
                for beta in (yarn["beta_fast"], yarn["beta_slow"])
            ]
            low, high = max(0.0, math.floor(corr[0])), min(dims - 1.0, math.ceil(corr[1]))
            ramp = 1 - np.clip((pair - low) / max(0.001, high - low), 0, 1)
            theta = theta * (freq_scale * (1 - ramp) + ramp)
            # DeepSeek V4 passes attn_factor = 1 / (1 + 0.1 ln(1/s)); YaRN multiplies it back.
            gain = np.float32(1.0) + np.float32(0.1) * np.log(np.float32(1.0) / freq_scale)
            self.mscale = float(np.float32(np.float32(1.0) / gain) * gain)
        self._wavelengths = 1.0 / theta.astype(np.float32)
        self._padded: dict[int, tuple[mx.array, mx.array | None]] = {}

    def _for_width(self, width: int) -> tuple[mx.array, mx.array | None]:
        """Wavelengths for all `width` channels, infinite (angle 0: left exactly as they are)
        on the leading ones, and YaRN's magnitude per channel where it is not 1: one rope
        call over the whole row instead of slicing it apart and joining it again."""
        if width not in self._padded:
            still = np.full((width - self.dims) // 2, np.inf, np.float32)
            gains = None
            if self.mscale != 1.0:
                gains = mx.array(np.r_[np.ones(width - self.dims), np.full(self.dims, self.mscale)])
            self._padded[width] = (mx.array(np.r_[still, self._wavelengths]), gains)
        return self._padded[width]

    def __call__(
        self, x: mx.array, offset: int, stride: int = 1, inverse: bool = False
    ) -> mx.array:
        """Rotate `x[..., T, D]` as if its T rows sat at offset, offset+stride, ...; `inverse`
        undoes a rotation (ggml_rope_ext_back)."""
        wavelengths, gains = self._for_width(x.shape[-1])
        out = mx.fast.rope(
            x,
            x.shape[-1],
            traditional=True,
            base=None,
            scale=float(stride),
            offset=offset // stride,
            freqs=-wavelengths if inverse else wavelengths,
        )
        return out if gains is None else (out * gains).astype(x.dtype)


def yarn(args: ModelArgs) -> dict[str, Any] | None:
    scaling = args.rope_scaling or {}
    if scaling.get("type", scaling.get("rope_type")) != "yarn":
        return None
    return {
        "factor": float(scaling["factor"]),
        "original_max_position_embeddings": int(scaling["original_max_position_embeddings"]),
        "beta_fast": float(scaling.get("beta_fast", 32.0)),
        "beta_slow": float(scaling.get("beta_slow", 1.0)),
    }
