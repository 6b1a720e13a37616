"""The Metal emulation itself (metal_on_cpu.h): each SIMD-group function and simdgroup_matrix
operation against NumPy, MLX's dispatch semantics, and the checks that make a kernel fail
here the way it would fail on a GPU (a divergent barrier, a constant buffer read through a
device pointer). Small kernels, written for this, run through MLX's own metal_kernel text."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.unit import metal_on_cpu

pytestmark = pytest.mark.skipif(
    metal_on_cpu.compiler() is None, reason="no C++20 compiler with ucontext"
)

SIMD = """
  const uint i = thread_position_in_grid.x;
  const ushort lane = ushort(thread_index_in_simdgroup);
  const float v = x[i];
  device float* o = out + i * 10;
  o[0] = simd_sum(v);
  o[1] = simd_max(v);
  o[2] = simd_min(v);
  o[3] = simd_prefix_exclusive_sum(v);
  o[4] = simd_prefix_inclusive_sum(v);
  o[5] = simd_shuffle(v, ushort((lane * 7) % 32));
  o[6] = simd_shuffle_xor(v, ushort(5));
  o[7] = simd_shuffle_down(v, ushort(3));
  o[8] = simd_shuffle_up(v, ushort(3));
  o[9] = simd_broadcast(v, ushort(2));
"""


def launch(
    source: str,
    inputs: list[mx.array],
    shapes: list[tuple[int, ...]],
    dtypes: list[mx.Dtype],
    grid: tuple[int, int, int],
    group: tuple[int, int, int],
    **kwargs: list[str],
) -> list[mx.array]:
    """Runs `source` as MLX would wrap it (inputs named x unless told), on a CPU thread."""
    kernel = metal_on_cpu.EmulatedKernel(
        name="probe",
        input_names=kwargs.pop("input_names", ["x"]),
        output_names=kwargs.pop("output_names", ["out"]),
        source=source,
    )
    return kernel(
        inputs=inputs,
        output_shapes=shapes,
        output_dtypes=dtypes,
        grid=grid,
        threadgroup=group,
        **kwargs,
    )


def test_simd_group_functions() -> None:
    x = np.random.default_rng(1).integers(-50, 50, 64).astype(np.float32)
    (out,) = launch(SIMD, [mx.array(x)], [(64, 10)], [mx.float32], (64, 1, 1), (64, 1, 1))
    got = np.array(out)
    lane = np.arange(32)
    for sg in range(2):
        v = x[32 * sg : 32 * sg + 32]
        want = np.stack(
            [
                np.full(32, v.sum()),
                np.full(32, v.max()),
                np.full(32, v.min()),
                np.cumsum(v) - v,
                np.cumsum(v),
                v[(lane * 7) % 32],
                v[lane ^ 5],
                np.where(lane + 3 < 32, v[np.minimum(lane + 3, 31)], v),
                np.where(lane >= 3, v[np.maximum(lane - 3, 0)], v),
                np.full(32, v[2]),
            ],
            axis=1,
        )
        assert np.array_equal(got[32 * sg : 32 * sg + 32], want), sg


MATRIX = """
  simdgroup_matrix<half, 8, 8> ma;
  simdgroup_matrix<half, 8, 8> mb;
  simdgroup_load(ma, a, 8);
  simdgroup_load(mb, b, 8, ulong2(0, 0), true);
  simdgroup_matrix<float, 8, 8> mc = make_filled_simdgroup_matrix<float, 8, 8>(1.0f);
  simdgroup_multiply_accumulate(mc, ma, mb, mc);
  simdgroup_store(mc, out, 8);
  simdgroup_store(mc, out + 64, 8, ulong2(0, 0), true);
  const float2 e = mc.thread_elements();
  const ushort lane = ushort(thread_index_in_simdgroup);
  const short qid = lane / 4;
  const short fm = (qid & 4) + ((lane / 2) % 4);
  const short fn = (qid & 2) * 2 + (lane % 2) * 2;
  out[128 + fm * 8 + fn] = e.x;
  out[128 + fm * 8 + fn + 1] = e.y;
  simdgroup_store(ma, copy, 8);
"""


def test_simdgroup_matrix_load_multiply_store() -> None:
    """C = A B^T + 1 (B loaded transposed), stored plain and transposed, read back through
    thread_elements at MLX's fragment coordinates, and A stored as loaded."""
    rng = np.random.default_rng(2)
    a, b = (rng.integers(-4, 5, (8, 8)).astype(np.float16) for _ in range(2))
    out, copy = launch(
        MATRIX,
        [mx.array(a), mx.array(b)],
        [(3, 8, 8), (8, 8)],
        [mx.float32, mx.float16],
        (32, 1, 1),
        (32, 1, 1),
        input_names=["a", "b"],
        output_names=["out", "copy"],
    )
    want = a.astype(np.float32) @ b.astype(np.float32).T + 1
    got = np.array(out)
    assert np.array_equal(got[0], want)
    assert np.array_equal(got[1], want.T)
    assert np.array_equal(got[2], want)
    assert np.array_equal(np.array(copy), a)


GRID = """
  const uint i = thread_position_in_grid.x;
  out[2 * i] = int(threadgroup_position_in_grid.x);
  out[2 * i + 1] = int(thread_index_in_threadgroup);
  (void)x;
"""


@pytest.mark.parametrize(("n", "group"), [(37, 16), (5, 16)])
def test_the_grid_counts_threads(n: int, group: int) -> None:
    """MLX dispatches threads (dispatchThreads): the last group is partial, and a group
    larger than the grid shrinks to it."""
    (out,) = launch(GRID, [mx.zeros(8)], [(n, 2)], [mx.int32], (n, 1, 1), (group, 1, 1))
    i = np.arange(n)
    assert np.array_equal(np.array(out), np.stack([i // group, i % group], axis=1))


def test_a_divergent_threadgroup_barrier_stops_the_kernel() -> None:
    source = """
  if (thread_index_in_threadgroup >= 32) return;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[thread_index_in_threadgroup] = x[0];
"""
    with pytest.raises(metal_on_cpu.EmulationError, match="threadgroup_barrier was reached"):
        launch(source, [mx.zeros(8)], [(64,)], [mx.float32], (64, 1, 1), (64, 1, 1))


def test_a_simd_function_after_some_lanes_returned_stops_the_kernel() -> None:
    source = """
  if (thread_index_in_simdgroup >= 16) return;
  out[thread_index_in_simdgroup] = simd_sum(x[0]);
"""
    with pytest.raises(metal_on_cpu.EmulationError, match="SIMD-group function was reached"):
        launch(source, [mx.zeros(8)], [(32,)], [mx.float32], (32, 1, 1), (32, 1, 1))


def test_threads_waiting_at_different_barriers_stop_the_kernel() -> None:
    """A hang on a GPU: half of the second SIMD-group waits at a SIMD exchange, the rest of the
    group at a threadgroup barrier, and neither barrier can complete."""
    source = """
  if (thread_index_in_threadgroup < 48) threadgroup_barrier(mem_flags::mem_threadgroup);
  else out[thread_index_in_threadgroup] = simd_sum(x[0]);
"""
    with pytest.raises(metal_on_cpu.EmulationError, match="wait at different barriers"):
        launch(source, [mx.zeros(8)], [(64,)], [mx.float32], (64, 1, 1), (64, 1, 1))


def test_a_constant_buffer_does_not_bind_to_a_device_pointer() -> None:
    """MLX passes inputs of fewer than 8 elements as `const constant T*`; Metal will not
    convert that to a device pointer, nor will the emulation."""
    source = """
  const device float* p = x;
  out[thread_position_in_grid.x] = p[thread_position_in_grid.x];
"""
    (out,) = launch(
        source, [mx.arange(8, dtype=mx.float32)], [(8,)], [mx.float32], (8, 1, 1), (8, 1, 1)
    )
    assert np.array_equal(np.array(out), np.arange(8))
    with pytest.raises(metal_on_cpu.EmulationError, match="did not compile"):
        launch(source, [mx.arange(5, dtype=mx.float32)], [(5,)], [mx.float32], (5, 1, 1), (5, 1, 1))
