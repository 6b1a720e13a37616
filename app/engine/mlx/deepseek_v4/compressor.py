"""The compressor: each completed block of `ratio` tokens becomes one K row, carrying the
projections its next block needs in the layer's cache between chunks."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from app.engine.mlx.deepseek_v4.args import CSA_RATIO
from app.engine.mlx.deepseek_v4.cache import DeepseekV4Cache, Pending
from app.engine.mlx.deepseek_v4.layers import RoPE


class Compressor(nn.Module):
    """Turns each completed block of `ratio` tokens into one K row (softmax-gated sum).

    4:1 blocks overlap: a row mixes the previous block's first-half projections with its own
    block's second half, so `wkv`/`wgate` are twice as wide there.
    """

    def __init__(self, hidden: int, head_dim: int, ratio: int, rope: RoPE, eps: float) -> None:
        super().__init__()
        self.ratio, self.head_dim = ratio, head_dim
        width = (2 if ratio == CSA_RATIO else 1) * head_dim
        self.wkv = nn.Linear(hidden, width, bias=False)
        self.wgate = nn.Linear(hidden, width, bias=False)
        self.ape = mx.zeros((ratio, width))
        self.norm = nn.RMSNorm(head_dim, eps=eps)
        self._rope = rope

    def __call__(self, x: mx.array, cache: DeepseekV4Cache, name: str) -> mx.array:
        """Add the rows the chunk `x` [L, hidden] completes; return all rows so far [n, D]."""
        r, d = self.ratio, self.head_dim
        state = cache.compressor(name, r, self.wkv.weight.shape[0])
        offset, n_new = cache.offset, x.shape[0]
        end = offset + n_new
        if n_new == 1:  # decode: one position's bias, sliced rather than gathered
            ape = self.ape[offset % r : offset % r + 1]
        else:
            ape = self.ape[mx.arange(offset, end) % r]
        kv = self.wkv(x).astype(mx.float32)
        score = self.wgate(x).astype(mx.float32) + ape.astype(mx.float32)
        p = state.pending
        all_kv = mx.concatenate([p.kv, kv])
        all_score = mx.concatenate([p.score, score])
        first, last = offset // r, end // r  # blocks [first, last) complete in this chunk
        if last > first:
            state.rows.append(self._compress(all_kv, all_score, p.start, first, last))
        for c in range(
            (offset // cache.checkpoint_every + 1) * cache.checkpoint_every,
            end + 1,
            cache.checkpoint_every,
        ):
            lo = state.needed_from(c)
            state.checkpoints[c] = Pending(
                all_kv[lo - p.start : c - p.start], all_score[lo - p.start : c - p.start], lo
            )
        keep = max(p.start, state.needed_from(max(cache.floor, end - cache.history, 0)))
        state.pending = Pending(all_kv[keep - p.start :], all_score[keep - p.start :], keep)
        return state.rows.view().astype(x.dtype) if state.rows.n else mx.zeros((0, d), x.dtype)

    def _compress(
        self, kv: mx.array, score: mx.array, start: int, first: int, last: int
    ) -> mx.array:
        r, d = self.ratio, self.head_dim
        n_blocks = last - first
        if r == CSA_RATIO:
            lo = (first - 1) * r
            if lo < 0:  # block 0 has no previous block: zero values, -inf gates
                pad = mx.zeros((r, kv.shape[1]), mx.float32)
                kv = mx.concatenate([pad, kv])
                score = mx.concatenate([mx.full(pad.shape, -mx.inf), score])
                start -= r
            span = slice(lo - start, lo - start + (n_blocks + 1) * r)
            kv = kv[span].reshape(n_blocks + 1, r, -1)
            score = score[span].reshape(n_blocks + 1, r, -1)
            values = mx.concatenate([kv[:-1, :, :d], kv[1:, :, d:]], axis=1)
            gates = mx.concatenate([score[:-1, :, :d], score[1:, :, d:]], axis=1)
        else:
            span = slice(first * r - start, last * r - start)
            values = kv[span].reshape(n_blocks, r, d)
            gates = score[span].reshape(n_blocks, r, d)
        rows = self.norm(_gated_sum(values, gates))
        return self._rope(rows[None], first * r, stride=r)[0]


@mx.compile
def _gated_sum(values: mx.array, gates: mx.array) -> mx.array:
    """Each block's rows weighed by the softmax of their gates over the block, summed."""
    return (values * mx.softmax(gates, axis=1)).sum(axis=1)
