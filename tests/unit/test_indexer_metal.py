"""The Metal indexer kernels against the reference, on an Apple GPU only.

CI runs on Linux, where MLX has no Metal device: these tests are skipped there and have not
been run by this project's CI. Run them on a Mac with `pytest tests/unit/test_indexer_metal.py`.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from app.engine.mlx.kernels import (
    choose_implementation,
    parts,
    reference_scores,
    reference_top_k,
    selection_tolerance,
    top_k_indices,
)
from app.engine.mlx.kernels.acceptance import (
    QUERY_COUNTS,
    ROW_COUNTS,
    VISIBILITIES,
    integer_inputs,
    random_inputs,
    set_agreement,
)

pytestmark = pytest.mark.skipif(
    not mx.metal.is_available(), reason="the Metal kernels need an Apple GPU (macOS)"
)

K = 512
SCORERS = ("metal-tiled", "metal-resident")


@pytest.mark.parametrize("name", SCORERS)
@pytest.mark.parametrize("n_rows", ROW_COUNTS)
@pytest.mark.parametrize("n_queries", QUERY_COUNTS)
def test_integer_inputs_give_the_reference_indices(name: str, n_queries: int, n_rows: int) -> None:
    rng = np.random.default_rng(n_queries * 31 + n_rows)
    for kind in VISIBILITIES:
        inputs = integer_inputs(rng, n_queries, n_rows, 64, 128, kind)
        q, w, keys, nv = inputs.args()
        want = reference_top_k(q, w, keys, nv, K)
        stages = parts(name, 128, K)
        scores = stages.scores(q, w, keys, nv)
        visible = mx.arange(n_rows)[None, :] < nv[:, None]
        ref = reference_scores(q, w, keys)
        assert mx.array_equal(mx.where(visible, scores, 0), mx.where(visible, ref, 0)), kind
        assert mx.array_equal(stages.select(ref, nv, K), want), f"{kind}: selector"
        assert mx.array_equal(top_k_indices(q, w, keys, nv, implementation=name), want), kind


@pytest.mark.parametrize("name", SCORERS)
@pytest.mark.parametrize("dim", [8, 32, 64])
def test_other_head_dims(name: str, dim: int) -> None:
    inputs = integer_inputs(np.random.default_rng(dim), 19, 1500, 5, dim, "resumed")
    want = reference_top_k(*inputs.args(), K)
    assert mx.array_equal(top_k_indices(*inputs.args(), implementation=name), want)


@pytest.mark.parametrize("name", SCORERS)
def test_random_fp16_sets_agree_outside_the_measured_difference(name: str) -> None:
    inputs = random_inputs(np.random.default_rng(9), 256, 16384, 64, 128, "resumed")
    q, w, keys, nv = inputs.args()
    ref = np.array(reference_scores(q, w, keys))
    want = np.array(reference_top_k(q, w, keys, nv, K))
    got_scores = np.array(parts(name, 128, K).scores(q, w, keys, nv))
    got = np.array(top_k_indices(q, w, keys, nv, implementation=name))
    result = set_agreement(ref, got_scores, want, got, np.array(nv), K)
    assert result["differing_sets"] == 0, result
    assert result["checked"] >= 0.9 * result["rows"], result
    tolerance = np.array(selection_tolerance(q, w, keys))
    assert result["max_score_difference"] <= tolerance.min() / 2


def test_the_dispatcher_picks_metal() -> None:
    assert choose_implementation(2048, 128, K) == "metal-resident"
    assert choose_implementation(1, 128, K) == "metal-tiled"
