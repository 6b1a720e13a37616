"""Custom MLX kernels: the DeepSeek V4 lightning indexer's top-k (reference, Metal, CUDA)."""

from app.engine.mlx.kernels.indexer import (
    DEFAULT_K,
    IMPLEMENTATION_ENV,
    IMPLEMENTATIONS,
    choose_implementation,
    parts,
    top_k_indices,
)
from app.engine.mlx.kernels.reference import (
    canonical_top_k,
    causal_n_visible,
    reference_scores,
    reference_top_k,
    selection_tolerance,
)

__all__ = [
    "DEFAULT_K",
    "IMPLEMENTATIONS",
    "IMPLEMENTATION_ENV",
    "canonical_top_k",
    "causal_n_visible",
    "choose_implementation",
    "parts",
    "reference_scores",
    "reference_top_k",
    "selection_tolerance",
    "top_k_indices",
]
