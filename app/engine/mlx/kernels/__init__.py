"""Custom MLX kernels: the DeepSeek V4 lightning indexer's top-k (reference, Metal, CUDA)."""

from app.engine.mlx.kernels.reference import (
    canonical_top_k,
    causal_n_visible,
    reference_scores,
    reference_top_k,
    selection_tolerance,
)

__all__ = [
    "canonical_top_k",
    "causal_n_visible",
    "reference_scores",
    "reference_top_k",
    "selection_tolerance",
]
