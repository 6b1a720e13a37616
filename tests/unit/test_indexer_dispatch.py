"""The indexer's one entry point: it picks what the device runs and says why it cannot."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from app.engine.mlx.kernels import (
    IMPLEMENTATION_ENV,
    choose_implementation,
    reference_top_k,
    top_k_indices,
)
from app.engine.mlx.kernels.acceptance import integer_inputs


def test_cpu_runs_the_reference() -> None:
    assert choose_implementation(2048, 128, 512) == "reference"
    inputs = integer_inputs(np.random.default_rng(2), 9, 700, 3, 16, "resumed")
    got = top_k_indices(*inputs.args())
    assert got.dtype == mx.int32 and got.shape == (9, 512)
    assert mx.array_equal(got, reference_top_k(*inputs.args(), 512))


def test_small_k_and_empty_inputs() -> None:
    inputs = integer_inputs(np.random.default_rng(4), 3, 20, 2, 8, "all")
    got = np.array(top_k_indices(*inputs.args(), k=5))
    assert got.shape == (3, 5) and (got >= 0).all()
    none = top_k_indices(inputs.q, inputs.weights, inputs.keys[:0], inputs.n_visible, k=4)
    assert np.array(none).tolist() == [[-1] * 4] * 3


@pytest.mark.parametrize("name", ["cuda", "metal-tiled", "metal-resident", "magic"])
def test_forcing_an_implementation_the_device_lacks_says_why(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = integer_inputs(np.random.default_rng(5), 2, 10, 1, 16, "all")
    if name != "magic" and (mx.metal.is_available() or mx.cuda.is_available()):
        pytest.skip("this device runs GPU kernels")
    with pytest.raises(ValueError, match=f"{name!r} cannot run: "):
        top_k_indices(*inputs.args(), implementation=name)
    monkeypatch.setenv(IMPLEMENTATION_ENV, name)
    with pytest.raises(ValueError, match="cannot run"):
        top_k_indices(*inputs.args())


def test_bad_shapes_are_explained() -> None:
    inputs = integer_inputs(np.random.default_rng(6), 4, 10, 2, 16, "all")
    q, w, keys, nv = inputs.args()
    with pytest.raises(ValueError, match=r"q must be \[queries, heads, dim\]"):
        top_k_indices(q[0], w, keys, nv)
    with pytest.raises(ValueError, match="weights must be"):
        top_k_indices(q, w[:, :1], keys, nv)
    with pytest.raises(ValueError, match=r"keys must be \[rows, 16\]"):
        top_k_indices(q, w, keys[:, :8], nv)
    with pytest.raises(ValueError, match="n_visible must be integers"):
        top_k_indices(q, w, keys, nv.astype(mx.float32))
    with pytest.raises(ValueError, match="k must be at least 1"):
        top_k_indices(q, w, keys, nv, k=0)
