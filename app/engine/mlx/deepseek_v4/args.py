"""DeepSeek V4's configuration: config.json's fields as mlx-lm's `ModelArgs`, and the two
compression ratios every other part of the model keys on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlx_lm.models.base import BaseModelArgs

CSA_RATIO = 4  # compressed 4:1, overlapping blocks, picked by the lightning indexer
HCA_RATIO = 128  # compressed 128:1, every row visible


@dataclass
class ModelArgs(BaseModelArgs):
    """DeepSeek V4's config.json fields (defaults: DeepSeek-V4-Flash)."""

    model_type: str = "deepseek_v4"
    vocab_size: int = 129_280
    hidden_size: int = 4096
    num_hidden_layers: int = 43
    num_attention_heads: int = 64
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    sliding_window: int = 128
    compress_ratios: list[int] = field(default_factory=list)
    compress_rope_theta: float = 160_000.0
    rope_theta: float = 10_000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 1_048_576
    rms_norm_eps: float = 1e-6
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    n_routed_experts: int = 256
    num_experts_per_tok: int = 6
    n_shared_experts: int = 1
    moe_intermediate_size: int = 2048
    num_hash_layers: int = 3
    routed_scaling_factor: float = 1.5
    norm_topk_prob: bool = True
    swiglu_limit: float = 10.0
    scoring_func: str = "sqrtsoftplus"
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    mtp_layers: int = 0  # NextN blocks after the layers (a GGUF's; Hugging Face MTP is dropped)

    def __post_init__(self) -> None:
        if not self.compress_ratios:
            self.compress_ratios = [
                0 if i < 2 else (CSA_RATIO if i % 2 == 0 else HCA_RATIO)
                for i in range(self.num_hidden_layers)
            ]
        if len(self.compress_ratios) < self.num_hidden_layers:
            raise ValueError("compress_ratios is shorter than num_hidden_layers")
        bad = set(self.compress_ratios[: self.num_hidden_layers]) - {0, CSA_RATIO, HCA_RATIO}
        if bad:
            raise ValueError(f"compress ratios must be 0, 4 or 128, not {sorted(bad)}")
        if self.scoring_func != "sqrtsoftplus":
            raise ValueError(f"DeepSeek V4 routes with sqrtsoftplus, not {self.scoring_func}")
        if self.num_attention_heads % self.o_groups:
            raise ValueError("num_attention_heads must be a multiple of o_groups")
