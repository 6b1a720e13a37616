"""The CUDA kernels' own source text, compiled as C++ and run on CPU threads, against the
reference.

The NumPy model (test_indexer_cuda_model.py) proves the algorithms; this runs the kernels'
literal SELECT_SOURCE and SCORE_SOURCE, so a typo, a missing __syncthreads, a wrong
cp.async wait depth or an index formula that differs from the model fails in CI rather than
on the GPU. A small shim maps CUDA onto the host: one std::thread per CUDA thread,
std::barrier for __syncthreads and for a warp's collectives, function-local statics for
__shared__ (blocks run one after another), GCC atomics. The scorer's PTX gets host twins
written from the PTX ISA's definitions: cp.async copies land only when a wait_group lets
them (so a stage read too early holds stale data), ldmatrix hands out the rows the lanes
point at, mma.sync gathers the warp's A and B fragments and sums in fp32.
Skipped only where no C++20 compiler with <barrier> exists.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from app.engine.mlx.kernels import canonical_top_k, reference_scores
from app.engine.mlx.kernels.acceptance import integer_inputs
from app.engine.mlx.kernels.cuda_indexer import (
    HEADER,
    SCORE_SOURCE,
    SELECT_SOURCE,
    ScorerShape,
    sort_size,
)

SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct Dim3 { int x = 0, y = 0; };
thread_local Dim3 threadIdx, blockIdx;
std::barrier<>* block_barrier;
std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
int shuffle_slots[1024];
void __syncthreads() { block_barrier->arrive_and_wait(); }
int __shfl_up_sync(unsigned, int x, int offset) {
  const int t = threadIdx.x;
  std::barrier<>& warp = *warp_barriers[t >> 5];
  shuffle_slots[t] = x;
  warp.arrive_and_wait();
  const int y = (t & 31) >= offset ? shuffle_slots[t - offset] : x;
  warp.arrive_and_wait();
  return y;
}
int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
float __ldg(const float* p) { return *p; }
unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
using std::max;
using std::min;
"""

MAIN = r"""
template <int K, int KP, int TPB>
void launch(const float* scores, const int32_t* nv, const int32_t* dims, int32_t* out) {
  for (int b = 0; b < dims[0]; ++b) {
    std::barrier<> block(TPB);
    block_barrier = &block;
    warp_barriers.clear();
    for (int w = 0; w < TPB / 32; ++w) warp_barriers.emplace_back(new std::barrier<>(32));
    std::vector<std::thread> threads;
    for (int t = 0; t < TPB; ++t) {
      threads.emplace_back([=] {
        threadIdx.x = t;
        blockIdx.x = b;
        select_kernel<K, KP, TPB>(scores, nv, dims, out);
      });
    }
    for (std::thread& thread : threads) thread.join();
  }
}
// stdin: L, S, K, TPB, nv[L], scores[L * S] (int32 / float32); stdout: out[L * K] (int32).
int main() {
  int32_t head[4];
  if (fread(head, 4, 4, stdin) != 4) return 1;
  const int L = head[0], S = head[1], K = head[2], TPB = head[3];
  std::vector<int32_t> nv(L), out(size_t(L) * K);
  std::vector<float> scores(size_t(L) * S);
  if (fread(nv.data(), 4, L, stdin) != size_t(L)) return 1;
  if (fread(scores.data(), 4, scores.size(), stdin) != scores.size()) return 1;
  const int32_t dims[3] = {L, 0, S};
  INSTANCES
  else return 2;
  fwrite(out.data(), 4, out.size(), stdout);
  return 0;
}
"""

# (k, threads per block): the GPU's shape, a one-warp block, a k of one, an odd k.
SHAPES = [(512, 256), (512, 32), (1, 64), (100, 128)]


def host_header() -> str:
    """HEADER's helpers without the ones written in PTX (the shims stand in for them)."""
    pieces = re.split(r"(?=^__device__|^template|^//)", HEADER, flags=re.M)
    return "".join(piece for piece in pieces if "asm volatile" not in piece)


def host_source() -> str:
    """The shim, the header's helpers without the scorer's PTX, the kernel, a main."""
    header = host_header()
    kernel = (
        "template <int K, int KP, int TPB>\n"
        "void select_kernel(const float* scores, const int32_t* nv, const int32_t* dims,"
        " int32_t* out) {\n" + SELECT_SOURCE + "}\n"
    )
    instances = "\n  else ".join(
        f"if (K == {k} && TPB == {tpb}) "
        f"launch<{k}, {sort_size(k)}, {tpb}>(scores.data(), nv.data(), dims, out.data());"
        for k, tpb in SHAPES
    )
    return SHIM + header + kernel + MAIN.replace("INSTANCES", instances)


@pytest.fixture(scope="module")
def compile_host(tmp_path_factory: pytest.TempPathFactory):
    """Builds a host program from C++ text; skips where no C++20 <barrier> compiler exists."""
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    root = tmp_path_factory.mktemp("cuda_host")
    probe = root / "probe.cpp"
    probe.write_text("#include <barrier>\nint main() { std::barrier<> b(1); }\n")
    flags = ["-std=c++20", "-pthread"]
    if subprocess.run([compiler, *flags, str(probe), "-o", str(root / "probe")]).returncode:
        pytest.skip("the C++ compiler lacks C++20 <barrier>")

    def build(name: str, text: str) -> Path:
        source = root / f"{name}.cpp"
        source.write_text(text)
        binary = root / name
        done = subprocess.run(
            [compiler, *flags, "-O1", "-w", str(source), "-o", str(binary)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return binary

    return build


@pytest.fixture(scope="module")
def selector(compile_host) -> Path:
    return compile_host("select", host_source())


def run_selector(binary: Path, scores: np.ndarray, nv: np.ndarray, k: int, tpb: int) -> np.ndarray:
    n_queries, n_rows = scores.shape
    payload = (
        np.array([n_queries, n_rows, k, tpb], np.int32).tobytes()
        + nv.astype(np.int32).tobytes()
        + scores.astype(np.float32).tobytes()
    )
    done = subprocess.run([str(binary)], input=payload, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return np.frombuffer(done.stdout, np.int32).reshape(n_queries, k)


@pytest.mark.parametrize(("k", "tpb"), SHAPES)
def test_kernel_source_selects_canonically(selector: Path, k: int, tpb: int) -> None:
    rng = np.random.default_rng(k + tpb)
    n_rows = 3 * 2048 + 3001  # past the 2,048-slot buffer, so both paths run
    rows = [
        np.arange(n_rows, dtype=np.float32),
        -np.arange(n_rows, dtype=np.float32),
        np.zeros(n_rows, np.float32),  # all tied: the index bits decide
        rng.integers(-3, 4, n_rows).astype(np.float32),
        rng.standard_normal(n_rows).astype(np.float32),
        (5.0 + 1e-3 * rng.standard_normal(n_rows)).astype(np.float32),  # one crowded bin
        np.where(rng.random(n_rows) < 0.5, -0.0, 0.0).astype(np.float32),
        np.full(n_rows, -np.inf, np.float32),
        rng.integers(-3000, 3000, n_rows).astype(np.float32),
    ]
    scores = np.stack(rows)
    for nv in (
        np.full(len(rows), n_rows),
        np.array([0, 1, k - 1, k, k + 1, 2047, 2049, 5000, n_rows - 1]),
    ):
        got = run_selector(selector, scores, nv, k, tpb)
        want = np.array(canonical_top_k(mx.array(scores), mx.array(nv.astype(np.int32)), k))
        assert np.array_equal(got, want), np.flatnonzero((got != want).any(axis=1))


SCORE_SHIM = r"""
#define __align__(n) __attribute__((aligned(n)))
struct __half { unsigned short bits; };
int atomicMax(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                 __ATOMIC_SEQ_CST)) {
  }
  return old;
}
// cp.async: a thread's copies wait in its open group until committed, and land only when a
// wait_group lets no more than N groups stay in flight.
struct Copy { void* dst; const void* src; int bytes; };
thread_local std::vector<Copy> open_group;
thread_local std::vector<std::vector<Copy>> in_flight;
void stoke_cp16(void* dst, const void* src) { open_group.push_back({dst, src, 16}); }
void stoke_cp4(void* dst, const void* src) { open_group.push_back({dst, src, 4}); }
void stoke_commit() { in_flight.push_back(std::move(open_group)); open_group.clear(); }
template <int N>
void stoke_wait() {
  while (in_flight.size() > size_t(N)) {
    for (const Copy& c : in_flight.front()) std::memcpy(c.dst, c.src, c.bytes);
    in_flight.erase(in_flight.begin());
  }
}
const void* row_slots[1024];
unsigned a_slots[1024][4];
unsigned b_slots[1024][2];
// ldmatrix .x4: lane i points at row i % 8 of matrix i / 8; lane T receives, of each matrix,
// the 32-bit pair at row T / 4, column pair T % 4.
void stoke_ldmatrix4(unsigned (&r)[4], const void* p) {
  const int t = threadIdx.x, lane = t & 31, base = t - lane;
  std::barrier<>& warp = *warp_barriers[t >> 5];
  row_slots[t] = p;
  warp.arrive_and_wait();
  for (int m = 0; m < 4; ++m) {
    const char* row = static_cast<const char*>(row_slots[base + m * 8 + lane / 4]);
    std::memcpy(&r[m], row + (lane % 4) * 4, 4);
  }
  warp.arrive_and_wait();
}
float half_at(unsigned reg, int which) {
  const unsigned short bits = which ? reg >> 16 : reg & 0xFFFFu;
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}
// mma.m16n8k16 row.col, PTX ISA fragment layouts: A(r, k) sits in lane (r % 8) * 4 +
// (k % 8) / 2, register (r / 8) + 2 (k / 8), half k % 2; B(k, n) in lane n * 4 + (k % 8) / 2,
// register k / 8, half k % 2; C(r, n) in lane (r % 8) * 4 + (n / 2), register 2 (r / 8) + n % 2.
void stoke_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  const int t = threadIdx.x, lane = t & 31, base = t - lane;
  std::barrier<>& warp = *warp_barriers[t >> 5];
  for (int i = 0; i < 4; ++i) a_slots[t][i] = a[i];
  b_slots[t][0] = b0;
  b_slots[t][1] = b1;
  warp.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    const int r = lane / 4 + 8 * (i / 2);
    const int n = (lane % 4) * 2 + i % 2;
    float sum = 0.0f;
    for (int kk = 0; kk < 16; ++kk) {
      const float x = half_at(a_slots[base + (r % 8) * 4 + (kk % 8) / 2][r / 8 + 2 * (kk / 8)],
                              kk % 2);
      const float y = half_at(b_slots[base + n * 4 + (kk % 8) / 2][kk / 8], kk % 2);
      sum += x * y;
    }
    c[i] += sum;
  }
  warp.arrive_and_wait();
}
"""

SCORE_MAIN = r"""
template <int D, int WARPS, int MT, int MG>
void launch(const __half* q, const float* w, const __half* k, const int32_t* nv,
            const int32_t* dims, float* scores) {
  constexpr int NT = WARPS * 32;
  const int col_blocks = (dims[2] + NT - 1) / NT;
  const int row_blocks = (dims[0] + 16 * MT - 1) / (16 * MT);
  for (int by = 0; by < row_blocks; ++by) {
    for (int bx = 0; bx < col_blocks; ++bx) {
      std::barrier<> block(NT);
      block_barrier = &block;
      warp_barriers.clear();
      for (int i = 0; i < WARPS; ++i) warp_barriers.emplace_back(new std::barrier<>(32));
      std::vector<std::thread> threads;
      for (int t = 0; t < NT; ++t) {
        threads.emplace_back([=] {
          threadIdx.x = t;
          blockIdx.x = bx;
          blockIdx.y = by;
          score_kernel<D, WARPS, MT, MG>(q, w, k, nv, dims, scores);
        });
      }
      for (std::thread& thread : threads) thread.join();
    }
  }
}
// stdin: L, H, S, D, WARPS, MT, MG (int32), nv[L] (int32), q[L * H * D] (fp16 bits),
// w[L * H] (float32), k[S * D] (fp16 bits); stdout: scores[L * S] (float32, NaN unwritten).
int main() {
  int32_t head[7];
  if (fread(head, 4, 7, stdin) != 7) return 1;
  const int L = head[0], H = head[1], S = head[2], D = head[3];
  const int WARPS = head[4], MT = head[5], MG = head[6];
  std::vector<int32_t> nv(L);
  std::vector<__half> q(size_t(L) * H * D), k(size_t(S) * D);
  std::vector<float> w(size_t(L) * H), scores(size_t(L) * S, NAN);
  if (fread(nv.data(), 4, L, stdin) != size_t(L)) return 1;
  if (fread(q.data(), 2, q.size(), stdin) != q.size()) return 1;
  if (fread(w.data(), 4, w.size(), stdin) != w.size()) return 1;
  if (fread(k.data(), 2, k.size(), stdin) != k.size()) return 1;
  const int32_t dims[3] = {L, H, S};
  INSTANCES
  else return 2;
  fwrite(scores.data(), 4, scores.size(), stdout);
  return 0;
}
"""

# (head dim, scorer shape): the bench's variants at the model's D = 128 (three cp.async stages
# for 32-query blocks, two for 64), an 8-warp block, and small dims with both stage counts.
SCORE_CASES = [
    (128, ScorerShape(4, 2, 2)),
    (128, ScorerShape(4, 2, 1)),
    (128, ScorerShape(4, 4, 1)),
    (128, ScorerShape(4, 4, 2)),
    (32, ScorerShape(8, 2, 2)),
    (16, ScorerShape(4, 4, 1)),
    (64, ScorerShape(4, 4, 4)),
]


def score_source() -> str:
    kernel = (
        "template <int D, int WARPS, int MT, int MG>\n"
        "void score_kernel(const __half* q, const float* w, const __half* k, const int32_t* nv,"
        " const int32_t* dims, float* scores) {\n" + SCORE_SOURCE + "}\n"
    )
    instances = "\n  else ".join(
        f"if (D == {dim} && WARPS == {s.warps} && MT == {s.m_tiles} && MG == {s.group}) "
        f"launch<{dim}, {s.warps}, {s.m_tiles}, {s.group}>"
        "(q.data(), w.data(), k.data(), nv.data(), dims, scores.data());"
        for dim, s in SCORE_CASES
    )
    return SHIM + SCORE_SHIM + host_header() + kernel + SCORE_MAIN.replace("INSTANCES", instances)


@pytest.fixture(scope="module")
def scorer(compile_host) -> Path:
    return compile_host("score", score_source())


@pytest.mark.parametrize(("dim", "shape"), SCORE_CASES, ids=lambda v: getattr(v, "name", v))
def test_kernel_source_scores_exactly(scorer: Path, dim: int, shape: ScorerShape) -> None:
    """Integer inputs, so any fp32 summation order is exact: the visible columns must equal
    the reference bit for bit (partial last blocks of rows and queries, a resumed chunk)."""
    n_queries, n_rows, heads = 16 * shape.m_tiles + 5, 32 * shape.warps + 45, 3
    inputs = integer_inputs(np.random.default_rng(dim), n_queries, n_rows, heads, dim, "resumed")
    nv = np.array(inputs.n_visible)
    payload = (
        np.array(
            [n_queries, heads, n_rows, dim, shape.warps, shape.m_tiles, shape.group], np.int32
        ).tobytes()
        + nv.astype(np.int32).tobytes()
        + np.array(inputs.q).astype(np.float16).tobytes()
        + np.array(inputs.weights).astype(np.float32).tobytes()
        + np.array(inputs.keys).astype(np.float16).tobytes()
    )
    done = subprocess.run([str(scorer)], input=payload, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.frombuffer(done.stdout, np.float32).reshape(n_queries, n_rows)
    want = np.array(reference_scores(inputs.q, inputs.weights, inputs.keys))
    visible = np.arange(n_rows)[None, :] < nv[:, None]
    assert np.array_equal(got[visible], want[visible])
