"""The indexer's CUDA twin (mx.fast.cuda_kernel): the ds4 Metal design on NVIDIA tensor cores.

Scorer: one block scores 16 * MT queries x 32 * WARPS compressed rows (a ScorerShape).
Each warp keeps its 32 rows of K resident in registers as mma B fragments (loaded once,
before the loop over heads: the register-blocked, K-resident idea), so a head only brings in
its Q tile (16 * MT x D fp16), staged through shared memory with cp.async two or three heads
deep (XOR-swizzled rows, so ldmatrix reads are conflict-free). Per head a warp runs
D/16 x MT x 4 mma.sync m16n8k16 (fp16 in, fp32 accumulate), MG 16-query tiles at a time,
then ReLU and the head weight fold into an fp32 running sum in registers. Tiles no query of
the block may see are skipped; columns a query may not see are left unwritten (the selector
never reads them).

Selector: a radix select, one 256-thread block per query, many queries per SM. Keys are 64-bit
(order-preserving float bits, then the inverted row index), unique per row, so "larger key" is
exactly the canonical order and the k-th best key is one value with no ties. Each level
histograms the next 11 bits of the keys that share the bits fixed so far (2,048 shared-memory
bins) and fixes the bin holding the k-th; once the keys at or above the fixed prefix fit in
2,048 shared-memory slots they are compacted there (one more pass over the row) and the
remaining levels read only them. When the k-th's bin holds exactly the keys still needed,
the keys at or above the prefix are the top k: they are gathered, bitonic-sorted (k slots)
and written. Random scores take two passes over the row (one histogram, one compaction);
heavy ties cost up to six, still without a sort of the row.

sm_80+ (cp.async, ldmatrix, mma.sync); NVRTC builds for the device's own architecture.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import mlx.core as mx

SELECT_THREADS = 256
SELECT_MAX_K = 2048


@dataclass(frozen=True)
class ScorerShape:
    """A scorer block: `warps` (rows of a block / 32), `m_tiles` (queries / 16), `group`
    (16-query tiles whose per-head sums are live at once; m_tiles interleaves them all) and
    `min_blocks` (> 0: __launch_bounds__ asks ptxas to fit that many blocks an SM, capping
    its registers). They trade registers for occupancy; bench/indexer.py times them."""

    warps: int = 4
    m_tiles: int = 2
    group: int = 2
    min_blocks: int = 0

    @property
    def name(self) -> str:
        bound = f"b{self.min_blocks}" if self.min_blocks else ""
        return f"w{self.warps}m{self.m_tiles}g{self.group}{bound}"


# The fastest shape that was exact on the H200: 64-query blocks of 4 warps, two 16-query
# tiles' sums live at once (w4m4g2: scorer 2.19 ms at S = 16384, 251 TFLOP/s; w4m2g2 2.58,
# w8m2g2 2.67; bench/results/indexer-h200.md).
DEFAULT_SHAPE = ScorerShape(m_tiles=4)
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
// Waits until at most N of this thread's committed cp.async groups are still in flight.
template <int N> __device__ __forceinline__ void stoke_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
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
// The key's bits above `shift`; every key has the same (empty) prefix when shift is 64.
__device__ __forceinline__ unsigned long long stoke_high(unsigned long long key, int shift) {
  return shift >= 64 ? 0ull : key >> shift;
}
// Exclusive prefix sum of one int per thread over the block (thread order).
template <int TPB>
__device__ __forceinline__ int stoke_exclusive_sum(int v, int* warp_sum, int tid) {
  const int lane = tid & 31;
  const int warp = tid >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xFFFFFFFFu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sum[warp] = x;
  __syncthreads();
  int before = 0;
#pragma unroll
  for (int i = 0; i < TPB / 32; ++i) before += (i < warp) ? warp_sum[i] : 0;
  __syncthreads();
  return before + x - v;
}
// Calls visit(key) for every visible score of a row: coalesced, UNROLL loads in flight.
template <int TPB, int UNROLL, typename F>
__device__ __forceinline__ void stoke_visit_row(const float* srow, int n, int tid, F& visit) {
  for (int base = 0; base < n; base += TPB * UNROLL) {
    float v[UNROLL];
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const int s = base + j * TPB + tid;
      v[j] = s < n ? __ldg(srow + s) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const int s = base + j * TPB + tid;
      if (s < n) visit(stoke_key(v[j], s));
    }
  }
}
// Calls visit(key) for every key of a shared-memory buffer.
template <int TPB, typename F>
__device__ __forceinline__ void stoke_visit_keys(const unsigned long long* keys, int n, int tid,
                                                 F& visit) {
  for (int i = tid; i < n; i += TPB) visit(keys[i]);
}
"""

SCORE_SOURCE = r"""
  // Template constants: D (head dim, 16..128, a power of two), WARPS (warps along rows),
  // MT (16-query mma tiles per warp: the block scores 16 * MT queries), MG (tiles whose
  // per-head sums are live at once: MT interleaves every tile's mma chains, fewer cuts the
  // registers a head needs).
  constexpr int BQ = 16 * MT;
  constexpr int BS = WARPS * 32;
  constexpr int NT = WARPS * 32;
  constexpr int CPR = D / 8;                       // 16-byte chunks per Q row
  constexpr int SWZ = (CPR < 8 ? CPR : 8) - 1;     // XOR swizzle of chunks within a row
  constexpr int KSTEPS = D / 16;
  // Heads in flight: three stages while they fit the 48 KB of static shared memory.
  constexpr int STAGES = 3 * BQ * D * 2 <= 32768 ? 3 : 2;
  constexpr int AHEAD = STAGES - 1;
  static_assert(MT % MG == 0, "MG divides MT");
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

#pragma unroll
  for (int p = 0; p < AHEAD; ++p) {
    if (p < H) load_head(p, p);
    stoke_commit();
  }
  for (int h = 0; h < H; ++h) {
    stoke_wait<AHEAD - 1>();   // head h has landed (later ones may still be in flight)
    __syncthreads();           // ... for every thread; and stage (h + AHEAD) % STAGES is free
    if (h + AHEAD < H) load_head(h + AHEAD, (h + AHEAD) % STAGES);
    stoke_commit();
    if (active) {
      const unsigned short* qt = q_tile[h % STAGES];
      const float* wt = w_tile[h % STAGES];
#pragma unroll
      for (int g = 0; g < MT; g += MG) {
        float c[MG][4][4];
#pragma unroll
        for (int gi = 0; gi < MG; ++gi)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) c[gi][j][e] = 0.0f;
#pragma unroll
        for (int t = 0; t < KSTEPS; ++t) {
          unsigned a[MG][4];
#pragma unroll
          for (int gi = 0; gi < MG; ++gi) {
            const int r = (g + gi) * 16 + (lane & 15);
            const int ch = t * 2 + (lane >> 4);
            stoke_ldmatrix4(a[gi], qt + r * D + ((ch ^ (r & SWZ)) * 8));
          }
#pragma unroll
          for (int gi = 0; gi < MG; ++gi)
#pragma unroll
            for (int j = 0; j < 4; ++j) stoke_mma(c[gi][j], a[gi], kb[j][t][0], kb[j][t][1]);
        }
#pragma unroll
        for (int gi = 0; gi < MG; ++gi) {
          const int mi = g + gi;
          const float w_lo = wt[mi * 16 + (lane >> 2)];
          const float w_hi = wt[mi * 16 + (lane >> 2) + 8];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            acc[mi][j][0] = fmaf(w_lo, fmaxf(c[gi][j][0], 0.0f), acc[mi][j][0]);
            acc[mi][j][1] = fmaf(w_lo, fmaxf(c[gi][j][1], 0.0f), acc[mi][j][1]);
            acc[mi][j][2] = fmaf(w_hi, fmaxf(c[gi][j][2], 0.0f), acc[mi][j][2]);
            acc[mi][j][3] = fmaf(w_hi, fmaxf(c[gi][j][3], 0.0f), acc[mi][j][3]);
          }
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
  // Template constants: K (rows to keep), KP (a power of two >= K, the final sort's size),
  // TPB (threads per block, dividing BINS).
  constexpr int CAP = 2048;       // candidate keys a block holds in shared memory
  constexpr int RADIX = 11;       // key bits fixed per level
  constexpr int BINS = 1 << RADIX;
  constexpr int PER = BINS / TPB; // bins per thread when locating the k-th key
  constexpr int UNROLL = 8;       // loads in flight per thread on a pass over the row
  __shared__ unsigned long long cand[CAP];
  __shared__ unsigned long long best[KP];
  __shared__ int hist[BINS];
  __shared__ int warp_sum[TPB / 32];
  __shared__ int n_cand;
  __shared__ int n_best;
  __shared__ int found_bin;
  __shared__ int found_above;

  const int S = dims[2];
  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  const int n = max(0, min(nv[row], S));
  const float* srow = scores + static_cast<int64_t>(row) * S;
  if (tid == 0) {
    n_cand = 0;
    n_best = 0;
  }
  __syncthreads();

  // Invariant: the K-th best key's bits above `shift` are `prefix`; K - need keys have higher
  // bits above `shift` and `match` keys the same ones. Once match <= need, the keys whose bits
  // above `shift` are >= prefix are exactly the top min(n, K). Keys are unique, so match
  // reaches need by shift 0 at the latest. Every thread holds the same state.
  int shift = 64;
  unsigned long long prefix = 0ull;
  int need = K;
  int match = n;
  bool in_cand = false;
  int kept = 0;
  auto keep = [&](unsigned long long key) {
    if (stoke_high(key, shift) >= prefix) cand[atomicAdd(&n_cand, 1)] = key;
  };
  while (match > need) {
    if (!in_cand && K - need + match <= CAP) {
      stoke_visit_row<TPB, UNROLL>(srow, n, tid, keep);
      __syncthreads();
      kept = n_cand;
      in_cand = true;
    }
    const int width = min(RADIX, shift);
    const int next = shift - width;
    const unsigned long long digit = (1ull << width) - 1ull;
    for (int i = tid; i < BINS; i += TPB) hist[i] = 0;
    __syncthreads();
    auto count = [&](unsigned long long key) {
      if (stoke_high(key, shift) == prefix) atomicAdd(&hist[(key >> next) & digit], 1);
    };
    if (in_cand) {
      stoke_visit_keys<TPB>(cand, kept, tid, count);
    } else {
      stoke_visit_row<TPB, UNROLL>(srow, n, tid, count);
    }
    __syncthreads();
    // Thread t sums bins [BINS - PER (t + 1), BINS - PER t): thread 0 holds the highest, so
    // the exclusive sum is the number of keys in bins above a thread's own.
    const int top = BINS - PER * tid;
    int mine = 0;
#pragma unroll
    for (int j = 1; j <= PER; ++j) mine += hist[top - j];
    int above = stoke_exclusive_sum<TPB>(mine, warp_sum, tid);
    if (above < need && above + mine >= need) {
      for (int j = 1; j <= PER; ++j) {
        const int c = hist[top - j];
        if (above + c >= need) {
          found_bin = top - j;
          found_above = above;
          break;
        }
        above += c;
      }
    }
    __syncthreads();
    need -= found_above;
    match = hist[found_bin];
    prefix = (prefix << width) | static_cast<unsigned long long>(found_bin);
    shift = next;
    __syncthreads();  // the next level rewrites hist and found_*
  }

  auto take = [&](unsigned long long key) {
    if (stoke_high(key, shift) >= prefix) best[atomicAdd(&n_best, 1)] = key;
  };
  if (in_cand) {
    stoke_visit_keys<TPB>(cand, kept, tid, take);
  } else {
    stoke_visit_row<TPB, UNROLL>(srow, n, tid, take);
  }
  __syncthreads();
  const int taken = n_best;
  for (int i = taken + tid; i < KP; i += TPB) best[i] = 0ull;
  __syncthreads();
  stoke_bitonic_desc<TPB>(best, KP, tid);
  for (int j = tid; j < K; j += TPB) {
    out[static_cast<int64_t>(row) * K + j] =
        j < taken ? static_cast<int>(0xFFFFFFFFu - static_cast<unsigned>(best[j] & 0xFFFFFFFFull))
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
    if not 1 <= k <= SELECT_MAX_K:
        return f"k = {k} is outside 1..{SELECT_MAX_K}"
    return None


def sort_size(k: int) -> int:
    """The selector's final bitonic sort size: the power of two at or above k."""
    return 1 << max(0, k - 1).bit_length()


def _name(stem: str, source: str) -> str:
    # MLX caches compiled PTX on disk by kernel name: a digest of the source keeps an edited
    # kernel from loading a stale build.
    digest = hashlib.sha1((HEADER + source).encode()).hexdigest()[:12]
    return f"stoke_indexer_{stem}_{digest}"


@functools.cache
def _score_kernel(threads: int, min_blocks: int):
    # MLX writes the __global__ line itself: a bounded kernel redefines the keyword (as
    # NVRTC's host_defines.h spells it) so the declaration after the header carries the bound.
    header = HEADER
    if min_blocks:
        header += (
            "#undef __global__\n#define __global__ __location__(global)"
            f" __launch_bounds__({threads}, {min_blocks})\n"
        )
    return mx.fast.cuda_kernel(
        name=_name(f"score_b{min_blocks}", header + SCORE_SOURCE),
        input_names=["q", "w", "k", "nv", "dims"],
        output_names=["scores"],
        source=SCORE_SOURCE,
        header=header,
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
    shape: ScorerShape = DEFAULT_SHAPE,
) -> mx.array:
    """fp32 scores [L, S]; only columns s < n_visible[l] are defined."""
    n_queries, n_heads, dim = q16.shape
    n_rows = k16.shape[0]
    block = shape.warps * 32
    row_tiles = -(-n_rows // block)
    query_tiles = -(-n_queries // (16 * shape.m_tiles))
    kernel = _score_kernel(block if shape.min_blocks else 0, shape.min_blocks)
    return kernel(
        inputs=[
            q16,
            weights.astype(mx.float32),
            k16,
            n_visible.astype(mx.int32),
            _dims(n_queries, n_heads, n_rows),
        ],
        template=[("D", dim), ("WARPS", shape.warps), ("MT", shape.m_tiles), ("MG", shape.group)],
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
        template=[("K", k), ("KP", sort_size(k)), ("TPB", SELECT_THREADS)],
        grid=(SELECT_THREADS * n_queries, 1, 1),
        threadgroup=(SELECT_THREADS, 1, 1),
        output_shapes=[(n_queries, k)],
        output_dtypes=[mx.int32],
    )[0]
