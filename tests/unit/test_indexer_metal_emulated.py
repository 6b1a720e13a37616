"""The Metal kernels' own source text, compiled as C++ and run on a CPU thread, against the
reference.

test_indexer_metal.py needs an Apple GPU and the NumPy model (test_indexer_metal_model.py)
only re-derives the index formulas; this runs metal_indexer.py itself, unchanged, with
`mx.fast.metal_kernel` replaced by metal_on_cpu.EmulatedKernel: MLX's own metal_kernel
writes the kernel text (the header, a signature built from the inputs' dtypes and sizes and
the attributes the body names, the body, the template instantiation), and that exact text
is compiled with metal_on_cpu.h and launched with the grid and threadgroup metal_indexer.py
passes, read as MLX reads them (dispatchThreads: the grid counts threads). So a typo, a
missing barrier that ends in a divergent return, a wrong tile index, a thread_elements
coordinate that differs from the scorer's epilogue, or an input MLX puts in the `constant`
address space (fewer than 8 elements) being read through a `device` pointer fails in CI.

What the emulation cannot show (run test_indexer_metal.py on a Mac for these):
- Memory ordering and races: the threads of a group are fibers on one CPU thread, switched
  only at barriers, so all memory is ordered; a GPU-only race or a barrier with the wrong
  mem_flags passes here (a read of what another thread writes with no barrier between them
  reads it unwritten, and fails).
- simdgroup_matrix's lane layout is MLX's BaseMMAFrag::get_coord (the layout MLX's own GEMMs
  rely on), not measured on hardware; the kernels use the same formula, so a mismatch
  between them fails here, a mismatch between MLX and the hardware would not.
- Rounding: simdgroup_multiply_accumulate sums in fp32 in a fixed order, simd_sum adds lanes
  in order, and `half` arithmetic is GCC's _Float16; only conversions and fp32 sums occur in
  these kernels, which is why integer inputs must match exactly and random fp16 only within
  the measured difference (acceptance.set_agreement).
- Resource limits the Metal compiler decides (registers, maxTotalThreadsPerThreadgroup of the
  pipeline) and the GPU's speed. Threadgroup memory is checked in test_indexer_metal_calls.py.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from app.engine.mlx.kernels import (
    canonical_top_k,
    choose_implementation,
    metal_indexer,
    parts,
    reference_scores,
    reference_top_k,
    selection_tolerance,
    top_k_indices,
)
from app.engine.mlx.kernels.acceptance import (
    VISIBILITIES,
    integer_inputs,
    random_inputs,
    set_agreement,
)
from tests.unit import metal_on_cpu

K = 64


@pytest.fixture(scope="module", autouse=True)
def on_cpu():
    """metal_indexer as on a Mac, its metal_kernel calls run by the emulation."""
    if metal_on_cpu.compiler() is None:
        pytest.skip("no C++20 compiler with <barrier>")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metal_indexer, "available", lambda: True)
        mp.setattr(mx.fast, "metal_kernel", metal_on_cpu.EmulatedKernel)
        metal_indexer._kernel.cache_clear()
        yield
    metal_indexer._kernel.cache_clear()


# (scorer, head dim, queries, rows): decode (one query: its weights and visibility go in the
# constant address space), partial tiles of queries and rows, the smallest head dim.
SCORE_CASES = [
    ("metal-tiled", 128, 1, 301),
    ("metal-tiled", 128, 21, 173),
    ("metal-tiled", 32, 9, 45),
    ("metal-tiled", 8, 3, 130),
    ("metal-resident", 128, 21, 301),
    ("metal-resident", 64, 8, 129),
    ("metal-resident", 16, 13, 45),
    ("metal-resident", 8, 9, 7),
]


@pytest.mark.parametrize(("name", "dim", "n_queries", "n_rows"), SCORE_CASES)
def test_kernel_source_scores_and_selects_exactly(
    name: str, dim: int, n_queries: int, n_rows: int
) -> None:
    """Integer inputs: any fp32 summation order is exact, so the visible scores must equal
    the reference bit for bit, and the indices too, ties included."""
    rng = np.random.default_rng(dim * 1000 + n_queries)
    for kind in VISIBILITIES:
        inputs = integer_inputs(rng, n_queries, n_rows, 3, dim, kind)
        q, w, keys, nv = inputs.args()
        scores = np.array(parts(name, q.shape[2], K).scores(q, w, keys, nv))
        want = np.array(reference_scores(q, w, keys))
        visible = np.arange(n_rows)[None, :] < np.array(nv)[:, None]
        assert np.array_equal(scores[visible], want[visible]), kind
        got = top_k_indices(q, w, keys, nv, k=K, implementation=name)
        assert mx.array_equal(got, reference_top_k(q, w, keys, nv, K)), kind


def test_the_dispatcher_picks_each_scorer() -> None:
    assert choose_implementation(2048, 128, 512) == "metal-resident"
    assert choose_implementation(7, 128, 512) == "metal-tiled"


# k: the model's 512, the largest the 2,048-slot buffer takes, one, an odd one.
@pytest.mark.parametrize("k", [512, 1536, 1, 100])
def test_kernel_source_selects_canonically(k: int) -> None:
    """The CUDA twin's selector rows (ties, signed zeros, -inf, one crowded bin), past the
    2,048-slot buffer so the re-sort path runs, with every visibility edge."""
    rng = np.random.default_rng(k)
    n_rows = 3 * 2048 + 3001
    rows = [
        np.arange(n_rows, dtype=np.float32),
        -np.arange(n_rows, dtype=np.float32),
        np.zeros(n_rows, np.float32),
        rng.integers(-3, 4, n_rows).astype(np.float32),
        rng.standard_normal(n_rows).astype(np.float32),
        (5.0 + 1e-3 * rng.standard_normal(n_rows)).astype(np.float32),
        np.where(rng.random(n_rows) < 0.5, -0.0, 0.0).astype(np.float32),
        np.full(n_rows, -np.inf, np.float32),
        rng.integers(-3000, 3000, n_rows).astype(np.float32),
    ]
    scores = mx.array(np.concatenate([rows, rows]))
    edges = [0, 1, k - 1, k, k + 1, 2047, 2049, 5000, n_rows - 1]
    nv = mx.array(np.array([n_rows] * len(rows) + edges, np.int32))
    got = metal_indexer.select(scores, nv, k)
    want = canonical_top_k(scores, nv, k)
    assert mx.array_equal(got, want), np.flatnonzero(np.array((got != want).any(axis=1)))


@pytest.mark.parametrize(
    ("name", "n_queries", "n_rows", "heads"),
    [("metal-tiled", 37, 1500, 8), ("metal-resident", 16, 600, 4)],
)
def test_random_fp16_sets_agree_outside_the_measured_difference(
    name: str, n_queries: int, n_rows: int, heads: int
) -> None:
    inputs = random_inputs(np.random.default_rng(9), n_queries, n_rows, heads, 128, "resumed")
    q, w, keys, nv = inputs.args()
    ref = np.array(reference_scores(q, w, keys))
    want = np.array(reference_top_k(q, w, keys, nv, K))
    got_scores = np.array(parts(name, q.shape[2], K).scores(q, w, keys, nv))
    got = np.array(top_k_indices(q, w, keys, nv, k=K, implementation=name))
    result = set_agreement(ref, got_scores, want, got, np.array(nv), K)
    assert result["differing_sets"] == 0, result
    assert result["checked"] >= 0.9 * result["rows"], result
    tolerance = np.array(selection_tolerance(q, w, keys))
    assert result["max_score_difference"] <= tolerance.min() / 2


@pytest.mark.parametrize(("n_queries", "n_rows"), [(1, 5), (2, 3), (1, 1)])
def test_inputs_in_the_constant_address_space(n_queries: int, n_rows: int) -> None:
    """MLX passes an input of fewer than 8 elements in the `constant` address space; early in
    a conversation (a few compressed rows) the selector's scores are one."""
    inputs = integer_inputs(np.random.default_rng(n_rows), n_queries, n_rows, 1, 8, "all")
    for name in ("metal-tiled", "metal-resident"):
        got = top_k_indices(*inputs.args(), k=4, implementation=name)
        assert mx.array_equal(got, reference_top_k(*inputs.args(), 4)), name
