"""The indexer's Metal kernels (mx.fast.metal_kernel): ds4's three designs, in MLX.

1. Threadgroup-tiled scorer over half-packed Q/K: a 256-thread group scores 8 queries x 64
   compressed rows. The K tile (half4-packed, padded rows against bank conflicts) is read
   into threadgroup memory once for all heads; per head the group stages the 8 queries'
   Q rows and weights, and each thread accumulates two (query, row) dot products in fp32.
   It has no 8-query minimum per simdgroup: the choice for decode.
2. Register-blocked, K-resident scorer: each simdgroup loads its 32 rows of K as 8x8
   simdgroup matrices (transposed) into registers once, before the loop over heads; per
   head it only loads the 8 queries' Q tiles, multiplies into fp32 accumulators, and folds
   ReLU and the head weight into per-thread running sums (thread_elements, MLX's fragment
   coordinates). The choice for prefill.
3. Streaming top-k selector: one 512-thread group per query scans its visible scores in
   512-wide tiles with 64-bit keys (order-preserving float bits, then the inverted index),
   compacts keys above the running threshold into a 2048-slot buffer with SIMD prefix sums
   (no atomics), and re-sorts / raises the threshold when it holds more than 1536.

Q and K are read as fp16, products and sums are fp32, as in reference.py. These kernels
run on Apple GPUs only (test_indexer_metal.py, skipped elsewhere); in CI their exact text, as
MLX's metal_kernel wraps it, is compiled as C++ and run on CPU threads against the reference
(tests/unit/metal_on_cpu.h, test_indexer_metal_emulated.py).
"""

from __future__ import annotations

import functools

import mlx.core as mx

SELECT_THREADS = 512
SELECT_CAPACITY = 2048
QUERY_TILE = 8  # both scorers: queries per group
TILED_ROWS = 64
RESIDENT_ROWS = 128  # 4 simdgroups x 32 rows

HEADER = r"""
#include <metal_simdgroup>
#include <metal_simdgroup_matrix>

// Canonical key: order-preserving score bits (a zero of either sign reads as +0), then the
// inverted row index, so a larger key is a better row (score desc, index asc).
inline ulong stoke_key(float f, int s) {
  uint u = as_type<uint>(f == 0.0f ? 0.0f : f);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (ulong(u) << 32) | ulong(0xFFFFFFFFu - uint(s));
}

// Sorts a[0, P) descending (P a power of two) with every thread of the group.
template <int TPB>
inline void stoke_bitonic_desc(threadgroup ulong* a, int P, uint tid) {
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = int(tid); i < P; i += TPB) {
        const int j = i ^ stride;
        if (j > i) {
          const ulong x = a[i];
          const ulong y = a[j];
          const bool desc = (i & size) == 0;
          if (desc ? (x < y) : (x > y)) {
            a[i] = y;
            a[j] = x;
          }
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
  }
}
"""

TILED_SOURCE = r"""
  // Template constant: D (head dim, a multiple of 8).
  constexpr int TQ = 8;
  constexpr int TS = 64;
  constexpr int NT = 256;
  constexpr int D4 = D / 4;
  constexpr int KS = D4 + 1;  // padded K row stride, in half4
  threadgroup half4 k_tile[TS * KS];
  threadgroup half4 q_tile[TQ * D4];
  threadgroup float w_tile[TQ];
  threadgroup int max_visible[1];

  const int L = dims[0];
  const int H = dims[1];
  const int S = dims[2];
  const int tid = int(thread_index_in_threadgroup);
  const int l0 = int(threadgroup_position_in_grid.y) * TQ;
  const int s0 = int(threadgroup_position_in_grid.x) * TS;

  if (tid == 0) {
    int m = 0;
    for (int i = 0; i < TQ; ++i) {
      if (l0 + i < L) m = max(m, nv[l0 + i]);
    }
    max_visible[0] = m;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (max_visible[0] <= s0) return;

  for (int i = tid; i < TS * D4; i += NT) {
    const int r = i / D4;
    const int c = i % D4;
    const int s = s0 + r;
    k_tile[r * KS + c] = s < S ? ((const device half4*)(k + size_t(s) * D))[c] : half4(0.0h);
  }
  const int qi = tid / 32;
  const int r0 = tid % 32;
  float acc0 = 0.0f;
  float acc1 = 0.0f;
  for (int h = 0; h < H; ++h) {
    threadgroup_barrier(mem_flags::mem_threadgroup);  // the last head's Q reads are done
    for (int i = tid; i < TQ * D4; i += NT) {
      const int r = i / D4;
      const int c = i % D4;
      const int l = l0 + r;
      q_tile[i] = l < L ? ((const device half4*)(q + (size_t(l) * H + h) * D))[c] : half4(0.0h);
    }
    if (tid < TQ) w_tile[tid] = l0 + tid < L ? w[size_t(l0 + tid) * H + h] : 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float d0 = 0.0f;
    float d1 = 0.0f;
    for (int c = 0; c < D4; ++c) {
      const float4 qv = float4(q_tile[qi * D4 + c]);
      d0 += dot(qv, float4(k_tile[r0 * KS + c]));
      d1 += dot(qv, float4(k_tile[(r0 + 32) * KS + c]));
    }
    const float wq = w_tile[qi];
    acc0 = fma(wq, max(d0, 0.0f), acc0);
    acc1 = fma(wq, max(d1, 0.0f), acc1);
  }
  const int l = l0 + qi;
  if (l < L) {
    const int s = s0 + r0;
    if (s < S) scores[size_t(l) * S + s] = acc0;
    if (s + 32 < S) scores[size_t(l) * S + s + 32] = acc1;
  }
"""

RESIDENT_SOURCE = r"""
  // Template constant: D (head dim, a multiple of 8). q, w, nv are padded to a multiple of
  // 8 queries (padding sees no rows) and k to a multiple of 32 rows; dims hold the real L, S.
  constexpr int DT = D / 8;
  const int L = dims[0];
  const int H = dims[1];
  const int S = dims[2];
  const ushort lane = ushort(thread_index_in_simdgroup);
  const int l0 = int(threadgroup_position_in_grid.y) * 8;
  const int ws0 =
      int(threadgroup_position_in_grid.x) * 128 + int(simdgroup_index_in_threadgroup) * 32;
  const int n_max = simd_max(lane < 8 ? nv[l0 + lane] : 0);
  if (n_max <= ws0) return;  // no barriers below: a simdgroup may leave on its own

  simdgroup_matrix<half, 8, 8> kt[4][DT];
  for (int j = 0; j < 4; ++j) {
    for (int t = 0; t < DT; ++t) {
      simdgroup_load(kt[j][t], k + size_t(ws0 + 8 * j) * D + 8 * t, D, ulong2(0, 0), true);
    }
  }
  const short qid = lane / 4;
  const short fm = (qid & 4) + ((lane / 2) % 4);  // this thread's row (query) in a fragment
  const short fn = (qid & 2) * 2 + (lane % 2) * 2;  // ... and its two columns (rows of K)
  float2 acc[4] = {float2(0.0f), float2(0.0f), float2(0.0f), float2(0.0f)};
  for (int h = 0; h < H; ++h) {
    simdgroup_matrix<float, 8, 8> c[4];
    for (int j = 0; j < 4; ++j) c[j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    const device half* qh = q + (size_t(l0) * H + h) * D;
    for (int t = 0; t < DT; ++t) {
      simdgroup_matrix<half, 8, 8> qm;
      simdgroup_load(qm, qh + 8 * t, ulong(H * D));
      for (int j = 0; j < 4; ++j) simdgroup_multiply_accumulate(c[j], qm, kt[j][t], c[j]);
    }
    const float wq = w[size_t(l0 + fm) * H + h];
    for (int j = 0; j < 4; ++j) {
      const float2 e = c[j].thread_elements();
      acc[j] = fma(float2(wq), max(e, float2(0.0f)), acc[j]);
    }
  }
  const int l = l0 + fm;
  if (l < L) {
    for (int j = 0; j < 4; ++j) {
      const int s = ws0 + 8 * j + fn;
      if (s < S) scores[size_t(l) * S + s] = acc[j].x;
      if (s + 1 < S) scores[size_t(l) * S + s + 1] = acc[j].y;
    }
  }
"""

SELECT_SOURCE = r"""
  // Template constant: K (how many rows to keep, K + TPB <= CAP).
  constexpr int TPB = 512;
  constexpr int CAP = 2048;
  constexpr int NW = TPB / 32;
  threadgroup ulong cand[CAP];
  threadgroup int warp_count[NW];

  const int S = dims[2];
  const int row = int(threadgroup_position_in_grid.x);
  const uint tid = thread_index_in_threadgroup;
  const uint lane = thread_index_in_simdgroup;
  const int sg = int(simdgroup_index_in_threadgroup);
  const int n = max(0, min(nv[row], S));
  // No `device` pointer into scores: MLX passes an input of fewer than 8 elements (a few
  // compressed rows early in a conversation) in the constant address space.
  const size_t row0 = size_t(row) * S;

  int count = 0;      // the same in every thread
  ulong thr = 0;      // keep keys above it; every real key is > 0
  for (int base = 0; base < n; base += TPB) {
    const int s = base + int(tid);
    ulong key = 0;
    bool take = false;
    if (s < n) {
      key = stoke_key(scores[row0 + s], s);
      take = key > thr;
    }
    const uint one = take ? 1u : 0u;
    const uint lane_before = simd_prefix_exclusive_sum(one);
    const uint in_simd = simd_sum(one);
    if (lane == 0) warp_count[sg] = int(in_simd);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    int before = 0;
    int total = 0;
    for (int i = 0; i < NW; ++i) {
      const int c = warp_count[i];
      before += (i < sg) ? c : 0;
      total += c;
    }
    if (take) cand[count + before + int(lane_before)] = key;
    count += total;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (count > CAP - TPB) {  // room for one more tile no longer guaranteed
      for (int i = count + int(tid); i < CAP; i += TPB) cand[i] = 0;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      stoke_bitonic_desc<TPB>(cand, CAP, tid);
      thr = cand[K - 1];
      count = K;
    }
  }
  int P = 1;
  while (P < count) P <<= 1;
  for (int i = count + int(tid); i < P; i += TPB) cand[i] = 0;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  stoke_bitonic_desc<TPB>(cand, P, tid);
  for (int j = int(tid); j < K; j += TPB) {
    out[size_t(row) * K + j] = j < count ? int(0xFFFFFFFFu - uint(cand[j] & 0xFFFFFFFFul)) : -1;
  }
"""


def available() -> bool:
    """True on an Apple GPU, where metal_kernel can compile."""
    return bool(mx.metal.is_available())


def unsupported(dim: int, k: int) -> str | None:
    """Why the Metal kernels cannot take this shape (None when they can)."""
    if dim % 8 or dim > 128:  # the tiled scorer's K tile must fit 32 KiB of threadgroup memory
        return f"head dim {dim} is not a multiple of 8 up to 128"
    if not 1 <= k <= SELECT_CAPACITY - SELECT_THREADS:
        return f"k = {k} is outside 1..{SELECT_CAPACITY - SELECT_THREADS}"
    return None


@functools.cache
def _kernel(name: str, source: str, inputs: tuple[str, ...], output: str):
    return mx.fast.metal_kernel(
        name=f"stoke_indexer_{name}",
        input_names=list(inputs),
        output_names=[output],
        source=source,
        header=HEADER,
    )


def _dims(n_queries: int, n_heads: int, n_rows: int) -> mx.array:
    return mx.array([n_queries, n_heads, n_rows], dtype=mx.int32)


def _ceil(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def tiled_scores(q16: mx.array, weights: mx.array, k16: mx.array, n_visible: mx.array) -> mx.array:
    """fp32 scores [L, S] from the threadgroup-tiled scorer; only s < n_visible[l] defined."""
    n_queries, n_heads, dim = q16.shape
    n_rows = k16.shape[0]
    kernel = _kernel("tiled", TILED_SOURCE, ("q", "w", "k", "nv", "dims"), "scores")
    return kernel(
        inputs=[
            q16,
            weights.astype(mx.float32),
            k16,
            n_visible.astype(mx.int32),
            _dims(n_queries, n_heads, n_rows),
        ],
        template=[("D", dim)],
        grid=(_ceil(n_rows, TILED_ROWS) * 4, _ceil(n_queries, QUERY_TILE) // QUERY_TILE, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[(n_queries, n_rows)],
        output_dtypes=[mx.float32],
    )[0]


def resident_scores(
    q16: mx.array, weights: mx.array, k16: mx.array, n_visible: mx.array
) -> mx.array:
    """fp32 scores [L, S] from the K-resident simdgroup scorer; only s < n_visible[l] defined."""
    n_queries, n_heads, dim = q16.shape
    n_rows = k16.shape[0]
    pad_q = _ceil(n_queries, QUERY_TILE) - n_queries
    pad_k = _ceil(n_rows, 32) - n_rows
    if pad_q:
        q16 = mx.pad(q16, [(0, pad_q), (0, 0), (0, 0)])
        weights = mx.pad(weights, [(0, pad_q), (0, 0)])
        n_visible = mx.pad(n_visible, [(0, pad_q)])
    if pad_k:
        k16 = mx.pad(k16, [(0, pad_k), (0, 0)])
    kernel = _kernel("resident", RESIDENT_SOURCE, ("q", "w", "k", "nv", "dims"), "scores")
    return kernel(
        inputs=[
            q16,
            weights.astype(mx.float32),
            k16,
            n_visible.astype(mx.int32),
            _dims(n_queries, n_heads, n_rows),
        ],
        template=[("D", dim)],
        grid=(_ceil(n_rows, RESIDENT_ROWS), (n_queries + pad_q) // QUERY_TILE, 1),
        threadgroup=(RESIDENT_ROWS, 1, 1),
        output_shapes=[(n_queries, n_rows)],
        output_dtypes=[mx.float32],
    )[0]


def select(scores: mx.array, n_visible: mx.array, k: int) -> mx.array:
    """Canonical top-k of each query's visible scores: int32 [L, k], -1 padded."""
    n_queries, n_rows = scores.shape
    kernel = _kernel("select", SELECT_SOURCE, ("scores", "nv", "dims"), "out")
    return kernel(
        inputs=[scores, n_visible.astype(mx.int32), _dims(n_queries, 0, n_rows)],
        template=[("K", k)],
        grid=(SELECT_THREADS * n_queries, 1, 1),
        threadgroup=(SELECT_THREADS, 1, 1),
        output_shapes=[(n_queries, k)],
        output_dtypes=[mx.int32],
    )[0]
