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


def set_agreement(
    ref_scores: np.ndarray,
    got_scores: np.ndarray,
    want: np.ndarray,
    got: np.ndarray,
    n_visible: np.ndarray,
    k: int,
) -> dict[str, float | int]:
    """How far another implementation's selection agrees with the reference's on inputs
    that are not exact (random fp16): rows checked, skipped and differing.

    Both implementations read the same fp16 Q/K and accumulate in fp32, so their scores
    differ only by summation order. Per row, d = max over the visible rows of
    |got score - reference score| is measured, not bounded: if the reference's k-th and
    (k+1)-th scores are more than 2d apart, every row the reference keeps still outscores
    every row it drops in the other implementation's scores, so a correct selector must
    return the same set. Only rows with d > 0 and a gap <= 2d are skipped as near-ties (the
    worst-case `selection_tolerance` is far larger and would skip nearly every row at H = 64,
    D = 128). Rows with at most k visible must hold exactly the visible rows.
    """
    n_rows = ref_scores.shape[1]
    nv = np.minimum(np.asarray(n_visible), n_rows)
    visible = np.arange(n_rows)[None, :] < nv[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(visible, np.abs(got_scores.astype(np.float64) - ref_scores), 0.0)
    d = diff.max(axis=1) if n_rows else np.zeros(len(nv))
    has_cut = nv > k
    gap = np.full(len(nv), np.inf)
    if has_cut.any():
        ranked = -np.partition(-np.where(visible, ref_scores, -np.inf), [k - 1, k], axis=1)
        gap = np.where(has_cut, ranked[:, k - 1] - ranked[:, k], np.inf)
    skipped = has_cut & (d > 0) & (gap <= 2 * d)
    same_set = (np.sort(got, axis=1) == np.sort(want, axis=1)).all(axis=1)
    return {
        "rows": len(nv),
        "checked": int((~skipped).sum()),
        "skipped_near_ties": int(skipped.sum()),
        "differing_sets": int((~skipped & ~same_set).sum()),
        "identical_rows_incl_order": int((got == want).all(axis=1).sum()),
        "max_score_difference": float(d.max()) if len(d) else 0.0,
        "median_row_score_difference": float(np.median(d)) if len(d) else 0.0,
    }
