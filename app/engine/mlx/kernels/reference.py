"""The lightning indexer's answer, defined in pure MLX: every kernel must return exactly this.

score(l, s) = sum_h w[l, h] * ReLU(q[l, h] . k[s]) over the rows s that query l may see; the
result is the top-k rows per query in canonical order (score descending, index ascending),
-1 where fewer than k rows are visible.

Every implementation computes on the same numbers: Q and K rounded to fp16 once (as the ds4
kernels do), weights in fp32, products and sums in fp32. Products of two fp16 values are exact
in fp32, so implementations differ only in summation order; on integer-valued inputs whose
partial sums stay below 2^24 they agree bit for bit, and on other inputs by at most
`selection_tolerance` (derived there). A score of -0.0 is read as +0.0, so a zero never
outranks another zero by its sign.
"""

from __future__ import annotations

import mlx.core as mx

# Queries per chunk keep the [chunk, H, S] fp32 intermediate under 2^26 elements (256 MiB).
CHUNK_ELEMENTS = 1 << 26
_ALL_ONES = 0xFFFFFFFF


def causal_n_visible(start_pos: int, n_queries: int, n_rows: int, ratio: int = 4) -> mx.array:
    """How many compressed rows each query of a prefill chunk sees, as int32 [n_queries].

    Query l sits at absolute position start_pos + l; compressed row s covers tokens
    [ratio*s, ratio*s + ratio), and a query sees it once the whole block is at or before its
    own position. A chunk with start_pos > 0 is a resumed prefill (the earlier tokens'
    rows are already in the cache).
    """
    if start_pos < 0 or n_queries < 0 or n_rows < 0 or ratio < 1:
        raise ValueError(
            f"visibility needs start_pos, n_queries, n_rows >= 0 and ratio >= 1, got "
            f"{start_pos}, {n_queries}, {n_rows}, {ratio}"
        )
    positions = mx.arange(start_pos, start_pos + n_queries, dtype=mx.int32)
    return mx.minimum((positions + 1) // ratio, n_rows).astype(mx.int32)


def to_fp16(x: mx.array) -> mx.array:
    """Q and K as the kernels read them: fp16, converted once per call."""
    return x if x.dtype == mx.float16 else x.astype(mx.float16)


def reference_scores(
    q: mx.array, weights: mx.array, keys: mx.array, chunk_elements: int = CHUNK_ELEMENTS
) -> mx.array:
    """fp32 scores [L, S] of every query against every row (visibility is applied later)."""
    n_queries, n_heads, dim = q.shape
    n_rows = keys.shape[0]
    q32 = to_fp16(q).astype(mx.float32)
    k32_t = to_fp16(keys).astype(mx.float32).T
    w32 = weights.astype(mx.float32)
    step = max(1, chunk_elements // max(1, n_heads * n_rows))
    parts = []
    for start in range(0, n_queries, step):
        qc = q32[start : start + step]
        dots = (qc.reshape(-1, dim) @ k32_t).reshape(qc.shape[0], n_heads, n_rows)
        wc = w32[start : start + step][:, None, :]
        parts.append((wc @ mx.maximum(dots, 0.0)).squeeze(1))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)


def sort_keys(scores: mx.array) -> mx.array:
    """uint64 keys whose ascending order is the canonical order (score desc, index asc).

    High word: the score's order-preserving bits, inverted so a larger score sorts first;
    low word: the row index. Keys are unique per row, so any sort (stable or not) and any
    partition agree on them.
    """
    n_rows = scores.shape[-1]
    scores = mx.where(scores == 0, 0.0, scores.astype(mx.float32))
    bits = mx.view(scores, mx.uint32)
    ordered = mx.where((bits >> 31) == 1, ~bits, bits | 0x80000000)
    index = mx.arange(n_rows, dtype=mx.uint32).astype(mx.uint64)
    return ((~ordered).astype(mx.uint64) << 32) | index


def canonical_top_k(scores: mx.array, n_visible: mx.array, k: int) -> mx.array:
    """Top-k row indices per query from fp32 scores [L, S]: int32 [L, k], -1 padded."""
    n_queries, n_rows = scores.shape
    visible_rows = mx.minimum(n_visible.astype(mx.int32), n_rows)
    column = mx.arange(n_rows, dtype=mx.int32)
    keys = mx.where(
        column[None, :] < visible_rows[:, None], sort_keys(scores), ~mx.array(0, mx.uint64)
    )
    if n_rows > k:
        keys = mx.partition(keys, k - 1, axis=-1)[:, :k]
    best = mx.sort(keys, axis=-1)
    index = (best & _ALL_ONES).astype(mx.int32)
    taken = best.shape[1]
    slot = mx.arange(taken, dtype=mx.int32)
    index = mx.where(slot[None, :] < visible_rows[:, None], index, -1)
    if taken < k:
        index = mx.concatenate([index, mx.full((n_queries, k - taken), -1, mx.int32)], axis=1)
    return index


def reference_top_k(
    q: mx.array, weights: mx.array, keys: mx.array, n_visible: mx.array, k: int
) -> mx.array:
    """The answer every implementation must return (see the module docstring)."""
    return canonical_top_k(reference_scores(q, weights, keys), n_visible, k)


def selection_tolerance(q: mx.array, weights: mx.array, keys: mx.array) -> mx.array:
    """Per query, the gap between the k-th and (k+1)-th scores below which the selected
    sets of two implementations may differ on inputs that are not exact (fp32 [L]).

    With fp16 Q/K every product q_i k_i is exact in fp32, so one implementation's score
    differs from the exact real score only by its additions: at most gamma_D per dot
    product, relative to A_h = sum_i |q_hi k_i| (the D-term sum, in any order, any
    blocking; u = 2^-23 per addition also covers tensor cores that truncate instead of
    rounding), ReLU does not enlarge it, then one rounding for w_h * r_h and gamma_H for the
    head sum. Bounding |e_h| by A_h, one implementation is within
        delta(l, s) = 1.01 * (D + H + 1) * 2^-23 * sum_h |w_lh| sum_i |q_lhi| |k_si|
    of the exact score, two implementations within 2 delta of each other, and the sets are
    identical whenever the reference's k-th score exceeds its (k+1)-th by more than
    4 delta. This returns 4 * max_s delta(l, s) per query.
    """
    n_queries, n_heads, dim = q.shape
    q_abs = mx.abs(to_fp16(q).astype(mx.float32))
    k_abs = mx.abs(to_fp16(keys).astype(mx.float32))
    per_dim = (mx.abs(weights.astype(mx.float32))[:, :, None] * q_abs).sum(axis=1)
    magnitude = (per_dim @ k_abs.T).max(axis=1) if keys.shape[0] else mx.zeros(n_queries)
    return 4.0 * 1.01 * (dim + n_heads + 1) * 2.0**-23 * magnitude
