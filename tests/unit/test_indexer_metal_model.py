"""The Metal scorers' tiling, modelled in NumPy thread by thread against the reference.

The Metal kernels only run on Apple GPUs (test_indexer_metal.py, skipped in CI); this runs
their index arithmetic here: the tiled scorer's 8 x 64 tile with two rows per thread and a
padded K stride, and the K-resident scorer's padding, simdgroup skip, transposed K tiles and
the thread_elements coordinates (MLX's BaseMMAFrag get_coord) that the epilogue weights and
stores by. The selector is the CUDA selector's algorithm (test_indexer_cuda_model.py) with
SIMD prefix sums in place of ballots, which compact to the same slots.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.mlx.kernels import reference_scores
from app.engine.mlx.kernels.acceptance import Inputs, integer_inputs
from app.engine.mlx.kernels.metal_indexer import QUERY_TILE, RESIDENT_ROWS, TILED_ROWS

LANE = np.arange(32)
QID = LANE // 4
FM = (QID & 4) + (LANE // 2) % 4  # fragment row of thread_elements()
FN = (QID & 2) * 2 + (LANE % 2) * 2  # ... and its first column


def arrays(inputs: Inputs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.array(inputs.q).astype(np.float64),
        np.array(inputs.weights).astype(np.float64),
        np.array(inputs.keys).astype(np.float64),
        np.array(inputs.n_visible),
    )


def model_tiled(inputs: Inputs) -> np.ndarray:
    q, w, k, nv = arrays(inputs)
    n_queries, n_heads, dim = q.shape
    n_rows = k.shape[0]
    d4, stride = dim // 4, dim // 4 + 1
    out = np.full((n_queries, n_rows), np.nan)
    tid = np.arange(256)
    qi, r0 = tid // 32, tid % 32
    for l0 in range(0, n_queries, QUERY_TILE):
        n_max = max(0, nv[l0 : l0 + QUERY_TILE].max())
        for s0 in range(0, -(-n_rows // TILED_ROWS) * TILED_ROWS, TILED_ROWS):
            if n_max <= s0:
                continue
            k_tile = np.zeros((TILED_ROWS * stride, 4))
            for i in range(TILED_ROWS * d4):
                r, c = divmod(i, d4)
                if s0 + r < n_rows:
                    k_tile[r * stride + c] = k[s0 + r, 4 * c : 4 * c + 4]
            acc0, acc1 = np.zeros(256), np.zeros(256)
            for h in range(n_heads):
                q_tile = np.zeros((QUERY_TILE * d4, 4))
                for i in range(QUERY_TILE * d4):
                    r, c = divmod(i, d4)
                    if l0 + r < n_queries:
                        q_tile[i] = q[l0 + r, h, 4 * c : 4 * c + 4]
                w_tile = np.array([w[l0 + t, h] if l0 + t < n_queries else 0.0 for t in range(8)])
                d0 = sum((q_tile[qi * d4 + c] * k_tile[r0 * stride + c]).sum(1) for c in range(d4))
                d1 = sum(
                    (q_tile[qi * d4 + c] * k_tile[(r0 + 32) * stride + c]).sum(1) for c in range(d4)
                )
                acc0 += w_tile[qi] * np.maximum(d0, 0)
                acc1 += w_tile[qi] * np.maximum(d1, 0)
            row, col = l0 + qi, s0 + r0
            ok = (row < n_queries) & (col < n_rows)
            out[row[ok], col[ok]] = acc0[ok]
            ok = (row < n_queries) & (col + 32 < n_rows)
            out[row[ok], col[ok] + 32] = acc1[ok]
    return out


def model_resident(inputs: Inputs) -> np.ndarray:
    q, w, k, nv = arrays(inputs)
    n_queries, n_heads, dim = q.shape
    n_rows = k.shape[0]
    pad_q = -(-n_queries // QUERY_TILE) * QUERY_TILE - n_queries
    pad_k = -(-n_rows // 32) * 32 - n_rows
    q = np.pad(q, [(0, pad_q), (0, 0), (0, 0)])
    w = np.pad(w, [(0, pad_q), (0, 0)])
    nv = np.pad(nv, [(0, pad_q)])
    k = np.pad(k, [(0, pad_k), (0, 0)])
    out = np.full((n_queries, n_rows), np.nan)
    for l0 in range(0, q.shape[0], QUERY_TILE):
        n_max = nv[l0 : l0 + 8].max()
        for g0 in range(0, -(-n_rows // RESIDENT_ROWS) * RESIDENT_ROWS, RESIDENT_ROWS):
            for simdgroup in range(4):
                ws0 = g0 + simdgroup * 32
                if n_max <= ws0:
                    continue
                # simdgroup_load(..., transpose=true): kt[j][t] is K[rows, dims].T
                kt = [
                    [k[ws0 + 8 * j : ws0 + 8 * j + 8, 8 * t : 8 * t + 8].T for t in range(dim // 8)]
                    for j in range(4)
                ]
                acc = np.zeros((4, 32, 2))
                for h in range(n_heads):
                    c = [np.zeros((8, 8)) for _ in range(4)]
                    for t in range(dim // 8):
                        qm = q[l0 : l0 + 8, h, 8 * t : 8 * t + 8]
                        for j in range(4):
                            c[j] = qm @ kt[j][t] + c[j]
                    wq = w[l0 + FM, h]
                    for j in range(4):
                        elements = np.stack([c[j][FM, FN], c[j][FM, FN + 1]], axis=1)
                        acc[j] += wq[:, None] * np.maximum(elements, 0)
                row = l0 + FM
                for j in range(4):
                    col = ws0 + 8 * j + FN
                    for pair in range(2):
                        ok = (row < n_queries) & (col + pair < n_rows)
                        out[row[ok], col[ok] + pair] = acc[j, ok, pair]
    return out


@pytest.mark.parametrize("model", [model_tiled, model_resident])
@pytest.mark.parametrize(
    ("n_queries", "n_rows", "heads", "dim", "kind"),
    [
        (1, 1, 1, 8, "all"),
        (9, 130, 3, 16, "all"),
        (21, 300, 2, 32, "resumed"),
        (8, 77, 2, 64, "fresh"),
    ],
)
def test_metal_scorer_models_match_the_reference(
    model, n_queries: int, n_rows: int, heads: int, dim: int, kind: str
) -> None:
    inputs = integer_inputs(
        np.random.default_rng(n_rows + dim), n_queries, n_rows, heads, dim, kind
    )
    got = model(inputs)
    want = np.array(reference_scores(inputs.q, inputs.weights, inputs.keys))
    visible = np.arange(n_rows)[None, :] < np.array(inputs.n_visible)[:, None]
    assert np.array_equal(got[visible], want[visible])


def test_thread_elements_cover_the_fragment_once() -> None:
    cells = {(int(m), int(n) + pair) for m, n in zip(FM, FN, strict=True) for pair in range(2)}
    assert len(cells) == 64
