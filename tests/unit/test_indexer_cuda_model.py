"""The CUDA twin's algorithms, executed in NumPy lane by lane, against the reference.

CUDA cannot run here, so this models what cuda_indexer.py's kernels do, with the same index
formulas: the cp.async loader's swizzled shared-memory image, ldmatrix's lane addresses and
register hand-out, the PTX ISA's m16n8k16 fragment layouts (A, B, C), the K-resident B
fragments loaded from global memory, the epilogue's row weights, the tile and warp skips and
the stores; then the radix selector's levels, bin chunks, compaction, final gather and
bitonic network. If a formula here and in the kernel disagree, the GPU run's exact checks
(bench/indexer.py) say so; if the algorithm itself is wrong, these tests do, in CI.
"""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from app.engine.mlx.kernels import canonical_top_k, reference_scores
from app.engine.mlx.kernels.acceptance import Inputs, integer_inputs
from app.engine.mlx.kernels.cuda_indexer import sort_size

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
    scores: np.ndarray,
    n_visible: np.ndarray,
    k: int,
    tpb: int = 256,
    cap: int = 2048,
    radix: int = 11,
    seed: int = 0,
) -> tuple[np.ndarray, Counter]:
    """SELECT_SOURCE per row: radix levels over the 64-bit keys, the compaction into the
    candidate buffer, the per-thread bin chunks and their exclusive sum, the final gather and
    sort. Atomic slots land in any order: the model shuffles them. Also returns how the rows
    went: "global_levels", "cand_levels", "compactions", "final_global", "final_cand"."""
    rng = np.random.default_rng(seed)
    bins = 1 << radix
    per = bins // tpb
    kp = sort_size(k)
    stats: Counter = Counter()
    out = np.full((scores.shape[0], k), -1, np.int64)
    for row in range(scores.shape[0]):
        n = max(0, min(int(n_visible[row]), scores.shape[1]))
        row_keys = keys_of(scores[row, :n], np.arange(n))
        shift, prefix, need, match = 64, 0, k, n
        cand = None

        def high(keys: np.ndarray, shift: int = shift) -> np.ndarray:
            return np.zeros_like(keys) if shift >= 64 else keys >> np.uint64(shift)

        while match > need:
            if cand is None and k - need + match <= cap:
                cand = rng.permutation(row_keys[high(row_keys, shift) >= prefix])
                stats["compactions"] += 1
            source = row_keys if cand is None else cand
            stats["global_levels" if cand is None else "cand_levels"] += 1
            width = min(radix, shift)
            nxt = shift - width
            hist = np.zeros(bins, np.int64)
            same = source[high(source, shift) == prefix]
            digits = (same >> np.uint64(nxt)) & np.uint64((1 << width) - 1)
            np.add.at(hist, digits.astype(np.int64), 1)
            top = bins - per * np.arange(tpb)
            chunk = hist[top[:, None] - np.arange(1, per + 1)[None, :]]  # [thread, j]
            mine = chunk.sum(axis=1)
            above = np.cumsum(mine) - mine
            owner = np.flatnonzero((above < need) & (above + mine >= need))
            assert owner.size == 1  # exactly one thread writes found_bin
            t = int(owner[0])
            acc = int(above[t])
            for j in range(per):
                if acc + chunk[t, j] >= need:
                    found = int(top[t]) - 1 - j
                    break
                acc += int(chunk[t, j])
            need -= acc
            match = int(hist[found])
            prefix = (prefix << width) | found
            shift = nxt
        source = row_keys if cand is None else cand
        stats["final_global" if cand is None else "final_cand"] += 1
        best = rng.permutation(source[high(source, shift) >= prefix])
        taken = best.size
        assert taken == min(n, k) and (cand is None or cand.size <= cap)
        padded = np.zeros(kp, np.uint64)
        padded[:taken] = best
        bitonic_desc(padded, kp)
        inverted = padded[:taken] & np.uint64(0xFFFFFFFF)
        out[row, :taken] = (np.uint64(0xFFFFFFFF) - inverted).astype(np.int64)
    return out, stats


def canonical(scores: np.ndarray, n_visible: np.ndarray, k: int) -> np.ndarray:
    """The reference's selection (its uint64 keys order NaN above +inf, as the kernel's do)."""
    return np.array(canonical_top_k(mx.array(scores), mx.array(n_visible), k)).astype(np.int64)


def test_bitonic_network_sorts_descending() -> None:
    rng = np.random.default_rng(5)
    for size_p in (1, 2, 8, 64, 2048):
        a = rng.integers(0, 50, size_p).astype(np.uint64)
        want = np.sort(a)[::-1]
        bitonic_desc(a, size_p)
        assert np.array_equal(a, want)


@pytest.mark.parametrize(
    ("tpb", "cap", "radix", "k"),
    [(256, 2048, 11, 512), (32, 128, 5, 40), (8, 64, 3, 1), (16, 256, 4, 100)],
)
def test_selector_model_is_canonical_on_adversarial_rows(
    tpb: int, cap: int, radix: int, k: int
) -> None:
    rng = np.random.default_rng(tpb + k)
    n_rows = 12 * cap + 7
    rows = [
        np.arange(n_rows, dtype=np.float32),  # ascending: the best rows come last
        -np.arange(n_rows, dtype=np.float32),  # descending
        np.zeros(n_rows, np.float32),  # all tied: the index decides, down to the last bit
        rng.integers(-3, 4, n_rows).astype(np.float32),  # heavy ties
        rng.standard_normal(n_rows).astype(np.float32),
        (5.0 + 1e-3 * rng.standard_normal(n_rows)).astype(np.float32),  # one crowded octave
        np.where(rng.random(n_rows) < 0.5, -0.0, 0.0).astype(np.float32),  # signed zeros
        np.full(n_rows, -np.inf, np.float32),
        np.where(rng.random(n_rows) < 0.01, np.nan, rng.standard_normal(n_rows)).astype(np.float32),
    ]
    scores = np.stack(rows)
    seen: Counter = Counter()
    for n_visible in (
        [n_rows] * len(rows),
        [0, 1, k - 1, k, k + 1, cap - 1, cap + 1, 3 * cap + 5, n_rows - 1],
    ):
        nv = np.array(n_visible)
        got, stats = model_select(scores, nv, k, tpb, cap, radix, seed=len(seen))
        assert np.array_equal(got, canonical(scores, nv, k)), n_visible
        seen += stats
    # Every path ran: levels over the row and over the buffer, finals from both.
    assert all(seen[name] > 0 for name in ("global_levels", "cand_levels", "compactions"))
    assert seen["final_global"] > 0 and seen["final_cand"] > 0


def test_random_scores_take_two_passes_over_the_row() -> None:
    """The bench's case: one histogram pass, one compaction, the rest in shared memory."""
    rng = np.random.default_rng(3)
    scores = rng.standard_normal((8, 16384)).astype(np.float32)
    nv = np.full(8, 16384)
    got, stats = model_select(scores, nv, 512)
    assert np.array_equal(got, canonical(scores, nv, 512))
    assert stats["global_levels"] == 8 and stats["compactions"] == 8
    assert stats["final_cand"] == 8
