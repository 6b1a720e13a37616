"""The lightning indexer's top-k op: one function, the implementation picked by device and shape.

`top_k_indices` returns, per query, the k compressed rows with the highest scores in
canonical order (score descending, index ascending), -1 where fewer are visible. The pure-MLX
reference (reference.py) defines the answer and runs everywhere; on an Apple GPU the Metal
kernels and on an NVIDIA GPU (mlx-cuda) the CUDA twin compute the same indices faster.
`STOKE_INDEXER_IMPL` or the `implementation` argument forces one (tests, benchmarks).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import mlx.core as mx

from app.engine.mlx.kernels import cuda_indexer, metal_indexer
from app.engine.mlx.kernels.reference import canonical_top_k, reference_scores, to_fp16

IMPLEMENTATION_ENV = "STOKE_INDEXER_IMPL"
IMPLEMENTATIONS = ("reference", "cuda", "metal-tiled", "metal-resident")
DEFAULT_K = 512


class IndexerParts(NamedTuple):
    """An implementation as its two stages, so benchmarks can time them apart."""

    scores: Callable[[mx.array, mx.array, mx.array, mx.array], mx.array]
    select: Callable[[mx.array, mx.array, int], mx.array]


def _reference_scores(q16: mx.array, w: mx.array, k16: mx.array, _nv: mx.array) -> mx.array:
    return reference_scores(q16, w, k16)


def _unavailable(name: str, dim: int, k: int) -> str | None:
    if name == "reference":
        return None
    if name == "cuda":
        if not cuda_indexer.available():
            return "MLX has no CUDA device here (mlx-cuda on an NVIDIA GPU is needed)"
        return cuda_indexer.unsupported(dim, k)
    if name in ("metal-tiled", "metal-resident"):
        if not metal_indexer.available():
            return "MLX has no Metal device here (an Apple GPU is needed)"
        return metal_indexer.unsupported(dim, k)
    return f"unknown implementation {name!r}; choose one of {', '.join(IMPLEMENTATIONS)}"


def parts(name: str, dim: int, k: int) -> IndexerParts:
    """The scorer and selector of one implementation; ValueError if it cannot run here."""
    reason = _unavailable(name, dim, k)
    if reason:
        raise ValueError(f"indexer implementation {name!r} cannot run: {reason}")
    if name == "cuda":
        return IndexerParts(cuda_indexer.scores, cuda_indexer.select)
    if name == "metal-tiled":
        return IndexerParts(metal_indexer.tiled_scores, metal_indexer.select)
    if name == "metal-resident":
        return IndexerParts(metal_indexer.resident_scores, metal_indexer.select)
    return IndexerParts(_reference_scores, canonical_top_k)


def choose_implementation(n_queries: int, dim: int, k: int) -> str:
    """The fastest implementation this device runs for the shape, else the reference."""
    if not _unavailable("metal-resident", dim, k):
        # The K-resident scorer works in 8-query simdgroup tiles; a decode step (a handful
        # of queries) wastes most of them, the thread-per-pair tiled scorer does not.
        return "metal-resident" if n_queries >= 8 else "metal-tiled"
    if not _unavailable("cuda", dim, k):
        return "cuda"
    return "reference"


def _check(q: mx.array, weights: mx.array, keys: mx.array, n_visible: mx.array, k: int) -> None:
    if q.ndim != 3:
        raise ValueError(f"q must be [queries, heads, dim], got shape {tuple(q.shape)}")
    n_queries, n_heads, dim = q.shape
    if n_heads < 1 or dim < 1:
        raise ValueError(f"q needs at least one head and one dimension, got {tuple(q.shape)}")
    if tuple(weights.shape) != (n_queries, n_heads):
        raise ValueError(
            f"weights must be [queries, heads] = {(n_queries, n_heads)}, got {tuple(weights.shape)}"
        )
    if keys.ndim != 2 or keys.shape[1] != dim:
        raise ValueError(f"keys must be [rows, {dim}], got shape {tuple(keys.shape)}")
    if tuple(n_visible.shape) != (n_queries,) or not mx.issubdtype(n_visible.dtype, mx.integer):
        raise ValueError(
            f"n_visible must be integers of shape ({n_queries},), got "
            f"{n_visible.dtype} {tuple(n_visible.shape)}"
        )
    for name, array in (("q", q), ("weights", weights), ("keys", keys)):
        if not mx.issubdtype(array.dtype, mx.floating):
            raise ValueError(f"{name} must be floating point, got {array.dtype}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")


def top_k_indices(
    q: mx.array,
    weights: mx.array,
    keys: mx.array,
    n_visible: mx.array,
    k: int = DEFAULT_K,
    implementation: str | None = None,
) -> mx.array:
    """Top-k compressed rows per query: int32 [L, k] in canonical order, -1 padded.

    q [L, H, D], weights [L, H], keys [S, D], n_visible [L] (query l sees rows
    s < n_visible[l]; `causal_n_visible` builds it for a prefill chunk). Q and K are read as
    fp16, weights as fp32; see reference.py for the precision contract.
    """
    _check(q, weights, keys, n_visible, k)
    n_queries, _, dim = q.shape
    name = (
        implementation
        or os.environ.get(IMPLEMENTATION_ENV)
        or choose_implementation(n_queries, dim, k)
    )
    chosen = parts(name, dim, k)
    if n_queries == 0 or keys.shape[0] == 0:
        return mx.full((n_queries, k), -1, mx.int32)
    nv = n_visible.astype(mx.int32)
    return chosen.select(chosen.scores(to_fp16(q), weights, to_fp16(keys), nv), nv, k)
