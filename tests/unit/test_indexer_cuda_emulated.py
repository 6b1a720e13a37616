"""The CUDA selector's own source text, compiled as C++ and run on CPU threads, against the
reference.

The NumPy model (test_indexer_cuda_model.py) proves the algorithm; this runs the kernel's
literal SELECT_SOURCE, so a typo, a missing __syncthreads or an index formula that differs
from the model fails in CI rather than on the GPU. A small shim maps CUDA onto the host: one
std::thread per CUDA thread, std::barrier for __syncthreads and for a warp's shuffles,
function-local statics for __shared__ (blocks run one after another), GCC atomics.
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

from app.engine.mlx.kernels import canonical_top_k
from app.engine.mlx.kernels.cuda_indexer import HEADER, SELECT_SOURCE, sort_size

SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct Dim3 { int x = 0; };
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


def host_source() -> str:
    """The shim, the header's helpers without the scorer's PTX, the kernel, a main."""
    pieces = re.split(r"(?=^__device__|^template|^//)", HEADER, flags=re.M)
    header = "".join(piece for piece in pieces if "asm volatile" not in piece)
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
def selector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    root = tmp_path_factory.mktemp("cuda_select")
    probe = root / "probe.cpp"
    probe.write_text("#include <barrier>\nint main() { std::barrier<> b(1); }\n")
    flags = ["-std=c++20", "-pthread"]
    if subprocess.run([compiler, *flags, str(probe), "-o", str(root / "probe")]).returncode:
        pytest.skip("the C++ compiler lacks C++20 <barrier>")
    source = root / "select.cpp"
    source.write_text(host_source())
    binary = root / "select"
    build = subprocess.run(
        [compiler, *flags, "-O1", "-w", str(source), "-o", str(binary)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    return binary


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
