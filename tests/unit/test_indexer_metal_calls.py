"""How metal_indexer.py calls mx.fast.metal_kernel, read against MLX 0.32's implementation,
for every shape the dispatcher can send it.

What MLX does with the arguments (mlx/backend/common/metal_kernel.cpp and
mlx/backend/metal/custom_kernel.cpp, v0.32): `grid` counts threads and `threadgroup` is the
group's size in threads (dispatchThreads, the group shrunk to min(threadgroup, grid) per
axis); more than the pipeline's maxTotalThreadsPerThreadgroup (at most 1024) is refused;
`template` becomes the kernel's template arguments (ints here); outputs are allocated with
the given shapes and dtypes and left uninitialized unless `init_value` is given;
ensure_row_contiguous (default True) copies strided inputs, so the kernels may index row-major;
an input with fewer than 8 elements is passed in the `constant` address space (see
test_indexer_metal_emulated.py). A recording stand-in for metal_kernel takes each launch
here; the kernels' threadgroup memory is measured from MLX's generated text compiled with the
emulation header (the arrays as the compiler lays them out) and must fit Apple GPUs' 32 KiB.
"""

from __future__ import annotations

from typing import ClassVar

import mlx.core as mx
import numpy as np
import pytest

from app.engine.mlx.kernels import choose_implementation, metal_indexer, top_k_indices
from tests.unit import metal_on_cpu

THREADGROUP_MEMORY = 32 * 1024
MAX_THREADS = 1024
DIMS = range(8, 129, 8)  # every head dim metal_indexer.unsupported() accepts
QUERIES = (1, 7, 8, 9, 2048)
ROWS = (1, 7, 8, 33, 129, 16387)
KS = (1, 512, metal_indexer.SELECT_CAPACITY - metal_indexer.SELECT_THREADS)


class Recorder:
    """Stands in for mx.fast.metal_kernel: keeps each launch's arguments, returns zeros."""

    launches: ClassVar[list[dict]] = []

    def __init__(self, **kwargs: object) -> None:
        self.kernel = {"ensure_row_contiguous": True, "atomic_outputs": False, **kwargs}

    def __call__(self, **call: object) -> list[mx.array]:
        Recorder.launches.append({"kernel": self.kernel, **call})
        shapes, dtypes = call["output_shapes"], call["output_dtypes"]
        return [mx.zeros(s, d) for s, d in zip(shapes, dtypes, strict=True)]


@pytest.fixture(scope="module")
def sweep() -> list[tuple[tuple[int, int, int, int], str, dict, dict]]:
    """Every (queries, rows, head dim, k) of the grid through top_k_indices as on a Mac:
    the shape, the implementation the dispatcher chose, its scorer's and selector's launch."""
    runs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metal_indexer, "available", lambda: True)
        mp.setattr(mx.fast, "metal_kernel", Recorder)
        metal_indexer._kernel.cache_clear()
        for dim in DIMS:
            for n_queries in QUERIES:
                for n_rows in ROWS:
                    q = mx.zeros((n_queries, 1, dim), mx.float16)
                    w, nv = mx.ones((n_queries, 1)), mx.full((n_queries,), n_rows, mx.int32)
                    keys = mx.zeros((n_rows, dim), mx.float16)
                    for k in KS:
                        Recorder.launches = []
                        top_k_indices(q, w, keys, nv, k=k)
                        chosen = choose_implementation(n_queries, dim, k)
                        runs.append(((n_queries, n_rows, dim, k), chosen, *Recorder.launches))
    metal_indexer._kernel.cache_clear()
    return runs


def check_scorer(launch: dict, n_queries: int, n_rows: int, dim: int) -> None:
    rows_per_group = {"stoke_indexer_tiled": 64, "stoke_indexer_resident": 128}
    rows_per_group = rows_per_group[launch["kernel"]["name"]]
    q, w, k, nv, dims = launch["inputs"]
    assert (q.dtype, w.dtype, k.dtype, nv.dtype, dims.dtype) == (
        mx.float16,
        mx.float32,
        mx.float16,
        mx.int32,
        mx.int32,
    )
    padded = q.shape[0]
    assert q.shape[1:] == (1, dim) and padded >= n_queries
    assert w.shape == (padded, 1) and nv.shape == (padded,) and k.shape[1] == dim
    assert np.array(dims).tolist() == [n_queries, 1, n_rows]
    assert launch["template"] == [("D", dim)]
    assert launch["output_shapes"] == [(n_queries, n_rows)]
    assert launch["output_dtypes"] == [mx.float32]
    gx, gy, gz = launch["grid"]
    tx, ty, tz = launch["threadgroup"]
    assert gx % tx == 0 and gy % ty == 0 and gz == tz == 1  # whole groups only
    assert (gx // tx) * rows_per_group >= n_rows and (gy // ty) * 8 >= n_queries
    if launch["kernel"]["name"] == "stoke_indexer_resident":  # a simdgroup loads 32 whole rows
        assert k.shape[0] % 32 == 0 and k.shape[0] >= n_rows and padded == gy * 8


def test_every_dispatched_launch_fits_mlx_and_the_gpu(sweep) -> None:
    assert len(sweep) == len(DIMS) * len(QUERIES) * len(ROWS) * len(KS)
    for (n_queries, n_rows, dim, k), chosen, scorer, selector in sweep:
        assert chosen == ("metal-resident" if n_queries >= 8 else "metal-tiled")
        assert scorer["kernel"]["name"] == f"stoke_indexer_{chosen.removeprefix('metal-')}"
        check_scorer(scorer, n_queries, n_rows, dim)
        assert selector["kernel"]["name"] == "stoke_indexer_select"
        assert selector["template"] == [("K", k)]
        assert selector["output_shapes"] == [(n_queries, k)]
        assert selector["output_dtypes"] == [mx.int32]
        assert selector["grid"] == (metal_indexer.SELECT_THREADS * n_queries, 1, 1)
        assert selector["threadgroup"] == (metal_indexer.SELECT_THREADS, 1, 1)
        assert selector["inputs"][0].shape == (n_queries, n_rows)
        assert k + metal_indexer.SELECT_THREADS <= metal_indexer.SELECT_CAPACITY
        for launch in (scorer, selector):
            tx, ty, tz = launch["threadgroup"]
            assert tx * ty * tz <= MAX_THREADS
            assert max(launch["grid"]) < 2**31  # MLX takes the grid as ints
            assert launch["kernel"]["ensure_row_contiguous"]
            assert not launch["kernel"]["atomic_outputs"]
            assert launch.get("init_value") is None  # only visible scores are ever read


def test_threadgroup_memory_fits_for_every_template(sweep) -> None:
    """Each (kernel, template) the sweep launched, measured from MLX's own text for it."""
    cxx = metal_on_cpu.compiler()
    if cxx is None:
        pytest.skip("no C++20 compiler with <barrier>")
    distinct = {}
    for _, _, *launches in sweep:
        for launch in launches:
            key = (launch["kernel"]["name"].removeprefix("stoke_indexer_"), *launch["template"][0])
            distinct.setdefault(key, launch)
    texts = []
    for launch in distinct.values():
        kernel = metal_on_cpu.MLX_METAL_KERNEL(**launch["kernel"])
        call = {k: v for k, v in launch.items() if k not in ("kernel", "inputs")}
        text = metal_on_cpu.mlx_kernel_source(kernel, launch["inputs"], **call)
        texts.append((text, launch["kernel"]["header"]))
    sizes = dict(zip(distinct, metal_on_cpu.threadgroup_bytes(texts, cxx), strict=True))
    assert len(sizes) == 2 * len(DIMS) + len(KS)
    # By hand: K tile 64 rows x (D/4 + 1) half4, Q tile 8 x D/4 half4, 8 weights, one int.
    assert sizes[("tiled", "D", 128)] == 64 * 33 * 8 + 8 * 32 * 8 + 8 * 4 + 4
    assert sizes[("select", "K", 512)] == 2048 * 8 + 16 * 4
    assert sizes[("resident", "D", 128)] == 0  # registers only
    over = {key: size for key, size in sizes.items() if size > THREADGROUP_MEMORY}
    assert not over, over
