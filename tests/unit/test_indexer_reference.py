"""The indexer reference (pure MLX, CPU) against an independent NumPy oracle.

The oracle scores in float64 and orders with np.partition + np.lexsort; the reference uses
fp32 MLX matmuls and unique uint64 sort keys. On integer-valued inputs both are exact, so the
indices must match bit for bit (ties included) over the whole acceptance grid; on random fp16
inputs the selected sets must match wherever the k-th and (k+1)-th scores are further apart
than the documented tolerance. CPU tests use H = 4, D = 16 so the largest case
(2,048 queries x 16,387 rows) stays cheap; the kernels' own head count is covered on the GPU.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from app.engine.mlx.kernels import (
    canonical_top_k,
    causal_n_visible,
    reference_scores,
    reference_top_k,
    selection_tolerance,
)
from app.engine.mlx.kernels.acceptance import (
    QUERY_COUNTS,
    ROW_COUNTS,
    VISIBILITIES,
    Inputs,
    integer_inputs,
    random_inputs,
    set_agreement,
)

K = 512
HEADS, DIM = 4, 16


def oracle_scores(inputs: Inputs) -> np.ndarray:
    """float64 scores [L, S] straight from the definition."""
    q = np.array(inputs.q).astype(np.float64)
    keys = np.array(inputs.keys).astype(np.float64)
    w = np.array(inputs.weights).astype(np.float64)
    out = np.empty((q.shape[0], keys.shape[0]))
    for start in range(0, q.shape[0], 128):
        qc = q[start : start + 128]
        dots = (qc.reshape(-1, qc.shape[2]) @ keys.T).reshape(qc.shape[0], qc.shape[1], -1)
        np.maximum(dots, 0.0, out=dots)
        out[start : start + 128] = (dots * w[start : start + 128, :, None]).sum(axis=1)
    return out


def oracle_top_k(scores: np.ndarray, n_visible: np.ndarray, k: int) -> np.ndarray:
    """Canonical top-k per row: the k-th largest value bounds the candidates, lexsort orders."""
    out = np.full((scores.shape[0], k), -1, np.int32)
    for row, nv in enumerate(np.minimum(n_visible, scores.shape[1])):
        values = scores[row, :nv]
        if nv > k:
            kth = np.partition(values, nv - k)[nv - k]
            candidates = np.flatnonzero(values >= kth)
        else:
            candidates = np.arange(nv)
        order = np.lexsort((candidates, -values[candidates]))[:k]
        out[row, : order.size] = candidates[order]
    return out


@pytest.mark.parametrize("n_rows", ROW_COUNTS)
@pytest.mark.parametrize("n_queries", QUERY_COUNTS)
def test_integer_inputs_match_the_oracle_exactly(n_queries: int, n_rows: int) -> None:
    rng = np.random.default_rng(n_queries * 100_003 + n_rows)
    # The largest case (33M scores) runs its resumed chunk only, to keep CI time small.
    kinds = ("resumed",) if n_queries * n_rows > 8_000_000 else VISIBILITIES
    for kind in kinds:
        inputs = integer_inputs(rng, n_queries, n_rows, HEADS, DIM, kind)
        got = np.array(reference_top_k(*inputs.args(), K))
        want = oracle_top_k(oracle_scores(inputs), np.array(inputs.n_visible), K)
        assert got.shape == (n_queries, K)
        mismatched = np.flatnonzero((got != want).any(axis=1))
        assert mismatched.size == 0, f"{kind}: rows {mismatched[:5]} differ"


def test_ties_break_by_ascending_index_and_short_rows_pad_with_minus_one() -> None:
    # Every score is 0 (one weight of -1 turns ReLU's zeros into -0.0 in some orders):
    # the canonical order is then plain index order.
    q = np.zeros((3, 2, 16))
    keys = np.ones((700, 16))
    weights = np.array([[1.0, -1.0], [-1.0, -1.0], [0.0, 0.0]])
    inputs = Inputs(q, weights, keys, np.array([700, 5, 0]))
    got = np.array(reference_top_k(*inputs.args(), K))
    assert got[0].tolist() == list(range(K))
    assert got[1].tolist() == [0, 1, 2, 3, 4] + [-1] * (K - 5)
    assert (got[2] == -1).all()


def test_causal_visibility_counts_whole_blocks() -> None:
    # Query at position p sees row s once tokens 4s..4s+3 are all <= p.
    assert causal_n_visible(0, 9, 100).tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert causal_n_visible(4090, 4, 1023).tolist() == [1022, 1023, 1023, 1023]
    with pytest.raises(ValueError, match="ratio"):
        causal_n_visible(0, 4, 10, ratio=0)


def test_random_fp16_sets_agree_outside_the_rounding_tolerance() -> None:
    rng = np.random.default_rng(7)
    inputs = random_inputs(rng, 96, 4096, 8, 64, "resumed")
    exact = oracle_scores(inputs)
    ref = np.array(reference_scores(inputs.q, inputs.weights, inputs.keys))
    tolerance = np.array(selection_tolerance(inputs.q, inputs.weights, inputs.keys))
    # Each implementation is within a quarter of the tolerance of the exact score.
    assert (np.abs(ref - exact) <= tolerance[:, None] / 4).all()

    got = np.array(reference_top_k(*inputs.args(), K))
    want = oracle_top_k(exact, np.array(inputs.n_visible), K)
    checked = 0
    for row, nv in enumerate(np.array(inputs.n_visible)):
        ranked = np.sort(ref[row, :nv])[::-1]
        if nv > K and ranked[K - 1] - ranked[K] <= tolerance[row]:
            continue  # a near-tie at the cut: either set is right
        checked += 1
        assert set(got[row]) == set(want[row]), f"row {row}"
    assert checked >= 32, "a worst-case bound, but it should still leave rows to check"


def fp32_scores_other_order(inputs: Inputs) -> np.ndarray:
    """A second fp32 implementation: D summed in two halves, heads in reverse order."""
    q = np.array(inputs.q).astype(np.float32)
    keys = np.array(inputs.keys).astype(np.float32)
    w = np.array(inputs.weights).astype(np.float32)
    half = q.shape[2] // 2
    out = np.zeros((q.shape[0], keys.shape[0]), np.float32)
    for h in reversed(range(q.shape[1])):
        dots = q[:, h, :half] @ keys[:, :half].T + q[:, h, half:] @ keys[:, half:].T
        out += w[:, h, None] * np.maximum(dots, np.float32(0))
    return out


def test_random_fp16_sets_agree_outside_the_observed_difference() -> None:
    """The GPU bench's random-input check, on two CPU implementations: rows are skipped only
    where the cut's gap is within twice the scores' measured difference."""
    inputs = random_inputs(np.random.default_rng(8), 128, 4096, 16, 128, "resumed")
    ref = np.array(reference_scores(inputs.q, inputs.weights, inputs.keys))
    other = fp32_scores_other_order(inputs)
    nv = np.array(inputs.n_visible)
    want = np.array(canonical_top_k(mx.array(ref), inputs.n_visible, K))
    got = np.array(canonical_top_k(mx.array(other), inputs.n_visible, K))
    result = set_agreement(ref, other, want, got, nv, K)
    tolerance = np.array(selection_tolerance(inputs.q, inputs.weights, inputs.keys))
    assert result["differing_sets"] == 0
    assert result["checked"] >= 0.9 * result["rows"], result
    assert 0 < result["max_score_difference"] <= tolerance.min() / 2  # the worst case holds
    # The worst-case bound alone would skip most rows: the measured difference is what
    # makes the check mean something.
    ranked = -np.sort(-np.where(np.arange(4096) < nv[:, None], ref, -np.inf), axis=1)
    worst_case_skips = int(((nv > K) & (ranked[:, K - 1] - ranked[:, K] <= tolerance)).sum())
    assert worst_case_skips > result["skipped_near_ties"]


def test_chunked_scores_equal_one_pass() -> None:
    inputs = integer_inputs(np.random.default_rng(3), 37, 300, HEADS, DIM, "all")
    whole = reference_scores(inputs.q, inputs.weights, inputs.keys)
    chunked = reference_scores(inputs.q, inputs.weights, inputs.keys, chunk_elements=5 * 300)
    assert mx.array_equal(whole, chunked)
