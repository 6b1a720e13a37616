"""The CUDA twin's algorithms, executed in NumPy lane by lane, against the reference.

CUDA cannot run here, so this models what cuda_indexer.py's kernels do, with the same index
formulas: the cp.async loader's swizzled shared-memory image, ldmatrix's lane addresses and
register hand-out, the PTX ISA's m16n8k16 fragment layouts (A, B, C), the K-resident B
fragments loaded from global memory, the epilogue's row weights, the tile and warp skips and
the stores; then the streaming selector's tiles, ballot compaction, threshold raises and
bitonic network. If a formula here and in the kernel disagree, the GPU run's exact checks
(bench/indexer.py) say so; if the algorithm itself is wrong, these tests do, in CI.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from app.engine.mlx.kernels import reference_scores
from app.engine.mlx.kernels.acceptance import Inputs, integer_inputs

LANE = np.arange(32)
GROUP, IN_GROUP = LANE >> 2, LANE & 3  # PTX groupID, threadID_in_group


def fragment_a(regs: np.ndarray) -> np.ndarray:
    """A (16x16) from the 4 x f16x2 registers of 32 lanes ([32, 4, 2]), per the PTX layout."""
    a = np.zeros((16, 16))
    for pair in range(2):
        col = IN_GROUP * 2 + pair
        a[GROUP, col] = regs[:, 0, pair]
        a[GROUP + 8, col] = regs[:, 1, pair]
        a[GROUP, col + 8] = regs[:, 2, pair]
        a[GROUP + 8, col + 8] = regs[:, 3, pair]
    return a


def fragment_b(regs: np.ndarray) -> np.ndarray:
    """B (16x8, k x n) from 2 x f16x2 registers of 32 lanes ([32, 2, 2])."""
    b = np.zeros((16, 8))
    for pair in range(2):
        b[IN_GROUP * 2 + pair, GROUP] = regs[:, 0, pair]
        b[IN_GROUP * 2 + pair + 8, GROUP] = regs[:, 1, pair]
    return b


def fragment_c(c: np.ndarray) -> np.ndarray:
    """The 4 f32 registers of 32 lanes ([32, 4]) holding the 16x8 accumulator c."""
    regs = np.empty((32, 4))
    for pair in range(2):
        regs[:, pair] = c[GROUP, IN_GROUP * 2 + pair]
        regs[:, 2 + pair] = c[GROUP + 8, IN_GROUP * 2 + pair]
    return regs


def ldmatrix_x4(tile: np.ndarray, addresses: np.ndarray) -> np.ndarray:
    """Lane i gives the start of row i % 8 of matrix i // 8; lane T receives, for each
    matrix m, the pair at (row T // 4, cols 2 (T % 4), +1) of matrix m: [32, 4, 2]."""
    matrices = np.stack([tile[a : a + 8] for a in addresses]).reshape(4, 8, 8)
    out = np.empty((32, 4, 2))
    for m in range(4):
        for pair in range(2):
            out[:, m, pair] = matrices[m][GROUP, IN_GROUP * 2 + pair]
    return out


def model_scores(inputs: Inputs, warps: int, m_tiles: int) -> np.ndarray:
    """SCORE_SOURCE, block by block and lane by lane; NaN where the kernel writes nothing."""
    q = np.array(inputs.q).astype(np.float64)
    w = np.array(inputs.weights).astype(np.float64)
    k = np.array(inputs.keys).astype(np.float64)
    nv = np.array(inputs.n_visible)
    n_queries, n_heads, dim = q.shape
    n_rows = k.shape[0]
    bq, bs, cpr = 16 * m_tiles, warps * 32, dim // 8
    swz, ksteps = min(cpr, 8) - 1, dim // 16
    out = np.full((n_queries, n_rows), np.nan)
    for l0 in range(0, n_queries, bq):
        n_max = max(0, nv[l0 : l0 + bq].max())
        for s0 in range(0, n_rows, bs):
            if n_max <= s0:
                continue
            # The loader's shared-memory image of every head's Q tile and weights.
            tiles = np.zeros((n_heads, bq * dim))
            w_tile = np.zeros((n_heads, bq))
            for c in range(bq * cpr):
                r, ch = divmod(c, cpr)
                src = min(l0 + r, n_queries - 1)
                dst = r * dim + (ch ^ (r & swz)) * 8
                tiles[:, dst : dst + 8] = q[src, :, ch * 8 : ch * 8 + 8]
            for t in range(bq):
                w_tile[:, t] = w[min(l0 + t, n_queries - 1)]
            for warp in range(warps):
                ws0 = s0 + warp * 32
                if ws0 >= n_max:
                    continue
                kb = np.zeros((4, ksteps, 32, 2, 2))  # [j, t, lane, reg, pair]
                for j in range(4):
                    s = ws0 + j * 8 + GROUP
                    ok = s < n_rows
                    base = np.where(ok, s, 0)
                    for t in range(ksteps):
                        for reg in range(2):
                            for pair in range(2):
                                d = (LANE & 3) * 2 + t * 16 + reg * 8 + pair
                                kb[j, t, :, reg, pair] = np.where(ok, k[base, d], 0.0)
                acc = np.zeros((m_tiles, 4, 32, 4))
                for h in range(n_heads):
                    c = np.zeros((m_tiles, 4, 16, 8))
                    for t in range(ksteps):
                        for mi in range(m_tiles):
                            r = mi * 16 + (LANE & 15)
                            ch = t * 2 + (LANE >> 4)
                            a = fragment_a(ldmatrix_x4(tiles[h], r * dim + (ch ^ (r & swz)) * 8))
                            for j in range(4):
                                c[mi, j] += a @ fragment_b(kb[j, t])
                    for mi in range(m_tiles):
                        w_lo = w_tile[h, mi * 16 + (LANE >> 2)]
                        w_hi = w_tile[h, mi * 16 + (LANE >> 2) + 8]
                        for j in range(4):
                            regs = np.maximum(fragment_c(c[mi, j]), 0.0)
                            acc[mi, j] += regs * np.stack([w_lo, w_lo, w_hi, w_hi], axis=1)
                for mi in range(m_tiles):
                    for j in range(4):
                        col = ws0 + j * 8 + (LANE & 3) * 2
                        for half in range(2):
                            row = l0 + mi * 16 + (LANE >> 2) + half * 8
                            for pair in range(2):
                                ok = (row < n_queries) & (col + pair < n_rows)
                                out[row[ok], col[ok] + pair] = acc[mi, j, ok, half * 2 + pair]
    return out


@pytest.mark.parametrize(
    ("n_queries", "n_rows", "heads", "dim", "warps", "m_tiles", "kind"),
    [
        (1, 1, 1, 16, 1, 2, "all"),
        (7, 70, 3, 32, 2, 1, "all"),
        (33, 200, 2, 64, 2, 2, "resumed"),
        (40, 97, 2, 128, 1, 1, "fresh"),
        (65, 300, 2, 16, 4, 2, "resumed"),
    ],
)
def test_scorer_model_matches_the_reference(
    n_queries: int, n_rows: int, heads: int, dim: int, warps: int, m_tiles: int, kind: str
) -> None:
    rng = np.random.default_rng(n_queries + n_rows + dim)
    inputs = integer_inputs(rng, n_queries, n_rows, heads, dim, kind)
    got = model_scores(inputs, warps, m_tiles)
    want = np.array(reference_scores(inputs.q, inputs.weights, inputs.keys))
    visible = np.arange(n_rows)[None, :] < np.array(inputs.n_visible)[:, None]
    assert np.array_equal(got[visible], want[visible])


def test_scorer_model_skips_tiles_nobody_sees() -> None:
    rng = np.random.default_rng(1)
    inputs = integer_inputs(rng, 40, 300, 1, 16, "all")
    inputs.n_visible = mx.array([5] * 32 + [0] * 8, dtype=mx.int32)
    got = model_scores(inputs, warps=1, m_tiles=2)
    assert np.isnan(got[:, 32:]).all()  # one warp's 32 rows computed, the rest skipped
    assert not np.isnan(got[:32, :32]).any()


def keys_of(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """stoke_key: order-preserving float bits (zero read as +0), then the inverted index."""
    values = np.where(values == 0, np.float32(0), values).astype(np.float32)
    bits = values.view(np.uint32)
    ordered = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(0x80000000))
    inverted = np.uint64(0xFFFFFFFF) - index.astype(np.uint64)
    return (ordered.astype(np.uint64) << np.uint64(32)) | inverted


def bitonic_desc(a: np.ndarray, size_p: int) -> None:
    """stoke_bitonic_desc's network on a[0, size_p), one stage per __syncthreads."""
    i = np.arange(size_p)
    size = 2
    while size <= size_p:
        stride = size >> 1
        while stride > 0:
            j = i ^ stride
            lo = i[j > i]
            hi = lo ^ stride
            x, y = a[lo].copy(), a[hi].copy()
            desc = (lo & size) == 0
            swap = np.where(desc, x < y, x > y)
            a[lo[swap]], a[hi[swap]] = y[swap], x[swap]
            stride >>= 1
        size <<= 1


def model_select(
    scores: np.ndarray, n_visible: np.ndarray, k: int, tpb: int = 512, cap: int = 2048
) -> tuple[np.ndarray, int]:
    """SELECT_SOURCE per row; also returns how many threshold raises (sorts) it made."""
    n_queries, n_rows = scores.shape
    out = np.full((n_queries, k), -1, np.int64)
    raises = 0
    for row in range(n_queries):
        n = max(0, min(int(n_visible[row]), n_rows))
        cand = np.zeros(cap, np.uint64)
        count, thr = 0, np.uint64(0)
        for base in range(0, n, tpb):
            s = base + np.arange(tpb)
            valid = s < n
            key = np.zeros(tpb, np.uint64)
            key[valid] = keys_of(scores[row, s[valid]], s[valid])
            take = valid & (key > thr)
            per_warp = take.reshape(-1, 32)
            warp_count = per_warp.sum(axis=1)
            before = np.concatenate([[0], np.cumsum(warp_count)[:-1]])
            lane_prefix = np.cumsum(per_warp, axis=1) - per_warp
            slot = count + before[:, None] + lane_prefix
            cand[slot[per_warp]] = key.reshape(-1, 32)[per_warp]
            count += int(warp_count.sum())
            if count > cap - tpb:
                cand[count:] = 0
                bitonic_desc(cand, cap)
                thr, count = cand[k - 1], k
                raises += 1
        size_p = 1
        while size_p < count:
            size_p <<= 1
        cand[count:size_p] = 0
        bitonic_desc(cand, size_p)
        taken = min(count, k)
        out[row, :taken] = (np.uint64(0xFFFFFFFF) - (cand[:taken] & np.uint64(0xFFFFFFFF))).astype(
            np.int64
        )
    return out, raises


def canonical(scores: np.ndarray, n_visible: np.ndarray, k: int) -> np.ndarray:
    out = np.full((scores.shape[0], k), -1, np.int64)
    for row, nv in enumerate(np.minimum(n_visible, scores.shape[1])):
        order = np.lexsort((np.arange(nv), -scores[row, :nv]))[:k]
        out[row, : order.size] = order
    return out


def test_bitonic_network_sorts_descending() -> None:
    rng = np.random.default_rng(5)
    for size_p in (1, 2, 8, 64, 2048):
        a = rng.integers(0, 50, size_p).astype(np.uint64)
        want = np.sort(a)[::-1]
        bitonic_desc(a, size_p)
        assert np.array_equal(a, want)


@pytest.mark.parametrize(("tpb", "cap", "k"), [(512, 2048, 512), (32, 128, 40), (64, 256, 1)])
def test_selector_model_is_canonical_on_adversarial_rows(tpb: int, cap: int, k: int) -> None:
    rng = np.random.default_rng(tpb + k)
    n_rows = 40 * tpb + 7
    rows = [
        np.arange(n_rows, dtype=np.float32),  # ascending: every tile beats the threshold
        -np.arange(n_rows, dtype=np.float32),  # descending: the first tile wins
        np.zeros(n_rows, np.float32),  # all tied: index order
        rng.integers(-3, 4, n_rows).astype(np.float32),  # heavy ties
        rng.standard_normal(n_rows).astype(np.float32),
        np.where(rng.random(n_rows) < 0.5, -0.0, 0.0).astype(np.float32),  # signed zeros
        np.full(n_rows, -np.inf, np.float32),
    ]
    scores = np.stack(rows)
    for n_visible in ([n_rows] * 7, [0, 1, k - 1, k, k + 1, tpb + 3, 3 * cap + 5]):
        nv = np.array(n_visible)
        got, raises = model_select(scores, nv, k, tpb, cap)
        assert np.array_equal(got, canonical(scores, nv, k)), n_visible
    assert raises > 0  # the threshold path ran
