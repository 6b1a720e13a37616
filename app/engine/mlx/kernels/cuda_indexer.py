"""The indexer's CUDA twin (mx.fast.cuda_kernel): the ds4 Metal design on NVIDIA tensor cores.

Scorer: one block scores 16 * MT queries (MT = 2 by default) x 32 * WARPS compressed rows.
Each warp keeps its 32 rows of K resident in registers as mma B fragments (loaded once,
before the loop over heads: the register-blocked, K-resident idea), so a head only brings in
its Q tile (16 * MT x D fp16), staged through shared memory with cp.async three heads deep
(XOR-swizzled rows, so ldmatrix reads are conflict-free). Per head a warp runs
D/16 x MT x 4 mma.sync m16n8k16 (fp16 in, fp32 accumulate), then ReLU and the head weight
fold into an fp32 running sum in registers. Tiles no query of the block may see are
skipped; columns a query may not see are left unwritten (the selector never reads them).

Selector: one 512-thread block per query streams its visible scores in 512-wide tiles.
Keys are 64-bit (order-preserving float bits, then the inverted row index), unique per row,
so "larger key" is exactly the canonical order. Keys above the running threshold are
compacted into a 2048-slot shared buffer (ballot + popcount, no atomics); when it holds
more than 1536 a bitonic sort keeps the best k and raises the threshold to the k-th key.
A final sort emits the indices.

sm_80+ (cp.async, ldmatrix, mma.sync); NVRTC builds for the device's own architecture.
"""

from __future__ import annotations

import functools
import hashlib

import mlx.core as mx

DEFAULT_M_TILES = 2
SELECT_THREADS = 512
SELECT_CAPACITY = 2048
DEFAULT_WARPS = 8
SUPPORTED_DIMS = (16, 32, 64, 128)

HEADER = r"""
__device__ __forceinline__ unsigned stoke_smem(const void* p) {
  unsigned long long a;
  asm volatile("cvta.to.shared.u64 %0, %1;\n" : "=l"(a) : "l"(p));
  return static_cast<unsigned>(a);
}
__device__ __forceinline__ void stoke_cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(stoke_smem(dst)), "l"(src));
}
__device__ __forceinline__ void stoke_cp4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(stoke_smem(dst)), "l"(src));
}
__device__ __forceinline__ void stoke_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void stoke_wait_one() {
  asm volatile("cp.async.wait_group 1;\n" ::);
}
__device__ __forceinline__ void stoke_ldmatrix4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(stoke_smem(p)));
}
__device__ __forceinline__ void stoke_mma(float (&c)[4], const unsigned (&a)[4],
                                          unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Canonical key: order-preserving score bits (a zero of either sign reads as +0), then the
// inverted row index, so a larger key is a better row (score desc, index asc).
__device__ __forceinline__ unsigned long long stoke_key(float f, int s) {
  unsigned u = __float_as_uint(f == 0.0f ? 0.0f : f);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) |
         static_cast<unsigned long long>(0xFFFFFFFFu - static_cast<unsigned>(s));
}
// Sorts a[0, P) descending (P a power of two) with every thread of the block.
template <int TPB>
__device__ __forceinline__ void stoke_bitonic_desc(unsigned long long* a, int P, int tid) {
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < P; i += TPB) {
        const int j = i ^ stride;
        if (j > i) {
          const unsigned long long x = a[i];
          const unsigned long long y = a[j];
          const bool desc = (i & size) == 0;
          if (desc ? (x < y) : (x > y)) {
            a[i] = y;
            a[j] = x;
          }
        }
      }
      __syncthreads();
    }
  }
}
"""

SCORE_SOURCE = r"""
  // Template constants: D (head dim, 16..128, a power of two), WARPS (warps along rows),
  // MT (16-query mma tiles per warp: the block scores 16 * MT queries).
  constexpr int BQ = 16 * MT;
  constexpr int BS = WARPS * 32;
  constexpr int NT = WARPS * 32;
  constexpr int CPR = D / 8;                       // 16-byte chunks per Q row
  constexpr int SWZ = (CPR < 8 ? CPR : 8) - 1;     // XOR swizzle of chunks within a row
  constexpr int KSTEPS = D / 16;
  constexpr int STAGES = 3;
  __shared__ __align__(128) unsigned short q_tile[STAGES][BQ * D];  // fp16 bits
  __shared__ float w_tile[STAGES][BQ];
  __shared__ int max_visible;

  const int L = dims[0];
  const int H = dims[1];
  const int S = dims[2];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int l0 = blockIdx.y * BQ;
  const int s0 = blockIdx.x * BS;

  if (tid == 0) max_visible = 0;
  __syncthreads();
  if (tid < BQ && l0 + tid < L) atomicMax(&max_visible, nv[l0 + tid]);
  __syncthreads();
  const int n_max = max_visible;
  if (n_max <= s0) return;
  const int ws0 = s0 + warp * 32;
  const bool active = ws0 < n_max;

  // This warp's 32 rows of K, as B fragments, resident for every head.
  unsigned kb[4][KSTEPS][2];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int s = ws0 + j * 8 + (lane >> 2);
    const bool ok = active && s < S;
    const __half* krow = k + static_cast<int64_t>(ok ? s : 0) * D + (lane & 3) * 2;
#pragma unroll
    for (int t = 0; t < KSTEPS; ++t) {
      kb[j][t][0] = ok ? *reinterpret_cast<const unsigned*>(krow + t * 16) : 0u;
      kb[j][t][1] = ok ? *reinterpret_cast<const unsigned*>(krow + t * 16 + 8) : 0u;
    }
  }

  auto load_head = [&](int h, int stage) {
    for (int c = tid; c < BQ * CPR; c += NT) {
      const int r = c / CPR;
      const int ch = c % CPR;
      const int l = min(l0 + r, L - 1);
      stoke_cp16(&q_tile[stage][r * D + ((ch ^ (r & SWZ)) * 8)],
                 q + (static_cast<int64_t>(l) * H + h) * D + ch * 8);
    }
    if (tid < BQ) {
      stoke_cp4(&w_tile[stage][tid], w + static_cast<int64_t>(min(l0 + tid, L - 1)) * H + h);
    }
  };

  float acc[MT][4][4];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][j][e] = 0.0f;

  load_head(0, 0);
  stoke_commit();
  if (H > 1) load_head(1, 1);
  stoke_commit();
  for (int h = 0; h < H; ++h) {
    stoke_wait_one();          // head h has landed (h + 1 may still be in flight)
    __syncthreads();           // ... for every thread; and stage (h + 2) % 3 is free
    if (h + 2 < H) load_head(h + 2, (h + 2) % STAGES);
    stoke_commit();
    if (active) {
      const unsigned short* qt = q_tile[h % STAGES];
      float c[MT][4][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) c[mi][j][e] = 0.0f;
#pragma unroll
      for (int t = 0; t < KSTEPS; ++t) {
        unsigned a[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          const int r = mi * 16 + (lane & 15);
          const int ch = t * 2 + (lane >> 4);
          stoke_ldmatrix4(a[mi], qt + r * D + ((ch ^ (r & SWZ)) * 8));
        }
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int j = 0; j < 4; ++j) stoke_mma(c[mi][j], a[mi], kb[j][t][0], kb[j][t][1]);
      }
      const float* wt = w_tile[h % STAGES];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        const float w_lo = wt[mi * 16 + (lane >> 2)];
        const float w_hi = wt[mi * 16 + (lane >> 2) + 8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[mi][j][0] = fmaf(w_lo, fmaxf(c[mi][j][0], 0.0f), acc[mi][j][0]);
          acc[mi][j][1] = fmaf(w_lo, fmaxf(c[mi][j][1], 0.0f), acc[mi][j][1]);
          acc[mi][j][2] = fmaf(w_hi, fmaxf(c[mi][j][2], 0.0f), acc[mi][j][2]);
          acc[mi][j][3] = fmaf(w_hi, fmaxf(c[mi][j][3], 0.0f), acc[mi][j][3]);
        }
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = ws0 + j * 8 + (lane & 3) * 2;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = l0 + mi * 16 + (lane >> 2) + half * 8;
        if (row < L) {
          float* out = scores + static_cast<int64_t>(row) * S;
          if (col < S) out[col] = acc[mi][j][half * 2];
          if (col + 1 < S) out[col + 1] = acc[mi][j][half * 2 + 1];
        }
      }
    }
  }
"""

SELECT_SOURCE = r"""
  // Template constant: K (how many rows to keep, K + TPB <= CAP).
  constexpr int TPB = 512;
  constexpr int CAP = 2048;
  constexpr int NW = TPB / 32;
  __shared__ unsigned long long cand[CAP];
  __shared__ int warp_count[NW];

  const int S = dims[2];
  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int n = max(0, min(nv[row], S));
  const float* srow = scores + static_cast<int64_t>(row) * S;

  int count = 0;                     // the same in every thread
  unsigned long long thr = 0ull;     // keep keys above it; every real key is > 0
  for (int base = 0; base < n; base += TPB) {
    const int s = base + tid;
    unsigned long long key = 0ull;
    bool take = false;
    if (s < n) {
      key = stoke_key(srow[s], s);
      take = key > thr;
    }
    const unsigned ballot = __ballot_sync(0xFFFFFFFFu, take);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = 0;
    int total = 0;
#pragma unroll
    for (int i = 0; i < NW; ++i) {
      const int c = warp_count[i];
      before += (i < warp) ? c : 0;
      total += c;
    }
    if (take) cand[count + before + __popc(ballot & ((1u << lane) - 1u))] = key;
    count += total;
    __syncthreads();
    if (count > CAP - TPB) {         // room for one more tile no longer guaranteed
      for (int i = count + tid; i < CAP; i += TPB) cand[i] = 0ull;
      __syncthreads();
      stoke_bitonic_desc<TPB>(cand, CAP, tid);
      thr = cand[K - 1];
      count = K;
    }
  }
  int P = 1;
  while (P < count) P <<= 1;
  for (int i = count + tid; i < P; i += TPB) cand[i] = 0ull;
  __syncthreads();
  stoke_bitonic_desc<TPB>(cand, P, tid);
  for (int j = tid; j < K; j += TPB) {
    out[static_cast<int64_t>(row) * K + j] =
        j < count ? static_cast<int>(0xFFFFFFFFu - static_cast<unsigned>(cand[j] & 0xFFFFFFFFull))
                  : -1;
  }
"""


def available() -> bool:
    """True when MLX runs on an NVIDIA GPU (mlx-cuda), where cuda_kernel can compile."""
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available())


def unsupported(dim: int, k: int) -> str | None:
    """Why the twin cannot take this shape (None when it can)."""
    if dim not in SUPPORTED_DIMS:
        return f"head dim {dim} is not one of {SUPPORTED_DIMS}"
    if not 1 <= k <= SELECT_CAPACITY - SELECT_THREADS:
        return f"k = {k} is outside 1..{SELECT_CAPACITY - SELECT_THREADS}"
    return None


def _name(stem: str, source: str) -> str:
    # MLX caches compiled PTX on disk by kernel name: a digest of the source keeps an edited
    # kernel from loading a stale build.
    digest = hashlib.sha1((HEADER + source).encode()).hexdigest()[:12]
    return f"stoke_indexer_{stem}_{digest}"


@functools.cache
def _score_kernel():
    return mx.fast.cuda_kernel(
        name=_name("score", SCORE_SOURCE),
        input_names=["q", "w", "k", "nv", "dims"],
        output_names=["scores"],
        source=SCORE_SOURCE,
        header=HEADER,
    )


@functools.cache
def _select_kernel():
    return mx.fast.cuda_kernel(
        name=_name("select", SELECT_SOURCE),
        input_names=["scores", "nv", "dims"],
        output_names=["out"],
        source=SELECT_SOURCE,
        header=HEADER,
    )


def _dims(n_queries: int, n_heads: int, n_rows: int) -> mx.array:
    return mx.array([n_queries, n_heads, n_rows], dtype=mx.int32)


def scores(
    q16: mx.array,
    weights: mx.array,
    k16: mx.array,
    n_visible: mx.array,
    warps: int = DEFAULT_WARPS,
    m_tiles: int = DEFAULT_M_TILES,
) -> mx.array:
    """fp32 scores [L, S]; only columns s < n_visible[l] are defined. `warps` (rows of a
    block / 32) and `m_tiles` (queries of a block / 16) trade registers for occupancy."""
    n_queries, n_heads, dim = q16.shape
    n_rows = k16.shape[0]
    block = warps * 32
    row_tiles = -(-n_rows // block)
    query_tiles = -(-n_queries // (16 * m_tiles))
    return _score_kernel()(
        inputs=[
            q16,
            weights.astype(mx.float32),
            k16,
            n_visible.astype(mx.int32),
            _dims(n_queries, n_heads, n_rows),
        ],
        template=[("D", dim), ("WARPS", warps), ("MT", m_tiles)],
        grid=(block * row_tiles, query_tiles, 1),
        threadgroup=(block, 1, 1),
        output_shapes=[(n_queries, n_rows)],
        output_dtypes=[mx.float32],
    )[0]


def select(scores_: mx.array, n_visible: mx.array, k: int) -> mx.array:
    """Canonical top-k of each query's visible scores: int32 [L, k], -1 padded."""
    n_queries, n_rows = scores_.shape
    return _select_kernel()(
        inputs=[scores_, n_visible.astype(mx.int32), _dims(n_queries, 0, n_rows)],
        template=[("K", k)],
        grid=(SELECT_THREADS * n_queries, 1, 1),
        threadgroup=(SELECT_THREADS, 1, 1),
        output_shapes=[(n_queries, k)],
        output_dtypes=[mx.int32],
    )[0]
