"""The indexer's acceptance inputs, shared by the CPU tests and the GPU benchmark.

Integer-valued inputs make every implementation's scores exact in any summation order (all
partial sums stay far below 2^24), so their indices must match the reference's bit for bit,
ties included; the small value range makes ties plentiful. Visibility comes in three kinds:
every row visible (decode), a fresh causal prefill, and a resumed one (a chunk that starts
mid-sequence, its last query seeing every row).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from app.engine.mlx.kernels.reference import causal_n_visible

ROW_COUNTS = (1, 511, 512, 513, 4096, 16387)
QUERY_COUNTS = (1, 7, 32, 2048)
VISIBILITIES = ("all", "fresh", "resumed")
RATIO = 4


class Inputs:
    """One indexer call's arguments, as MLX arrays."""

    def __init__(self, q: np.ndarray, weights: np.ndarray, keys: np.ndarray, nv: np.ndarray):
        self.q = mx.array(q.astype(np.float16))
        self.weights = mx.array(weights.astype(np.float32))
        self.keys = mx.array(keys.astype(np.float16))
        self.n_visible = mx.array(nv.astype(np.int32))

    def args(self) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        return self.q, self.weights, self.keys, self.n_visible


def n_visible(kind: str, n_queries: int, n_rows: int) -> np.ndarray:
    """Visible rows per query for one of VISIBILITIES."""
    if kind == "all":
        return np.full(n_queries, n_rows, np.int32)
    if kind not in ("fresh", "resumed"):
        raise ValueError(f"unknown visibility {kind!r}; choose one of {VISIBILITIES}")
    start = 0 if kind == "fresh" else max(0, RATIO * n_rows - n_queries)
    return np.array(causal_n_visible(start, n_queries, n_rows, RATIO))


def integer_inputs(
    rng: np.random.Generator, n_queries: int, n_rows: int, heads: int, dim: int, kind: str
) -> Inputs:
    """Values in -3..3 (weights -2..2): |dot| <= 9 D and |score| <= 18 H D, exact in fp32."""
    q = rng.integers(-3, 4, (n_queries, heads, dim))
    keys = rng.integers(-3, 4, (n_rows, dim))
    weights = rng.integers(-2, 3, (n_queries, heads))
    return Inputs(q, weights, keys, n_visible(kind, n_queries, n_rows))


def random_inputs(
    rng: np.random.Generator, n_queries: int, n_rows: int, heads: int, dim: int, kind: str
) -> Inputs:
    """Gaussian fp16 Q/K and fp32 weights at the model's scale (w ~ 1/sqrt(D H))."""
    q = rng.standard_normal((n_queries, heads, dim))
    keys = rng.standard_normal((n_rows, dim))
    weights = rng.standard_normal((n_queries, heads)) / np.sqrt(dim * heads)
    return Inputs(q, weights, keys, n_visible(kind, n_queries, n_rows))
