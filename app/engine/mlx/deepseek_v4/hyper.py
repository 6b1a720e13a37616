"""Hyper-connections: the residual as `hc_mult` streams, collapsed before each sublayer and
spread back after it through a Sinkhorn-normalised stream mix."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from app.engine.mlx.deepseek_v4.args import ModelArgs
from app.engine.mlx.deepseek_v4.layers import rms_norm


def _sinkhorn(comb: mx.array, iters: int, eps: float) -> mx.array:
    """comb [L, src, dst]: softmax over dst, then alternate column/row normalisation."""
    comb = mx.softmax(comb, axis=-1) + eps
    comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(axis=-1, keepdims=True) + eps)
        comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    return comb


class HyperMix(nn.Module):
    """The hyper-connection weights around one sublayer (`hc_attn_*` or `hc_ffn_*`)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        hc = args.hc_mult
        self.fn = mx.zeros(((2 + hc) * hc, hc * args.hidden_size))
        self.base = mx.zeros(((2 + hc) * hc,))
        self.scale = mx.zeros((3,))
        self._hc, self._eps, self._norm_eps = hc, args.hc_eps, args.rms_norm_eps
        self._iters = args.hc_sinkhorn_iters

    def collapse(self, h: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """h [L, hc, E] -> the sublayer input [L, E], and the post gains and stream mix."""
        flat = rms_norm(h.reshape(h.shape[0], -1), self._norm_eps)
        mixes = flat @ self.fn.T
        return _collapse(h, mixes, self.scale, self.base, self._hc, self._iters, self._eps)

    @staticmethod
    def expand(y: mx.array, h: mx.array, post: mx.array, comb: mx.array) -> mx.array:
        """The sublayer output y [L, E] spread back over the streams, plus the mixed residual."""
        return _expand(y, h, post, comb)


# The hyper-connections' many small element-wise ops (twice per layer and token) compiled into
# a few kernels: decode spent more time launching them than in the matmuls around them.
@mx.compile
def _collapse(
    h: mx.array, mixes: mx.array, scale: mx.array, base: mx.array, hc: int, iters: int, eps: float
) -> tuple[mx.array, mx.array, mx.array]:
    pre = mx.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2 * mx.sigmoid(mixes[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    comb = mixes[:, 2 * hc :] * scale[2] + base[2 * hc :]
    comb = _sinkhorn(comb.reshape(-1, hc, hc), iters, eps)
    return (pre[..., None] * h).sum(axis=1), post, comb


@mx.compile
def _expand(y: mx.array, h: mx.array, post: mx.array, comb: mx.array) -> mx.array:
    mixed = (comb[..., None] * h[:, :, None, :]).sum(axis=1)  # [L, dst, E]
    return y[:, None, :] * post[..., None] + mixed
