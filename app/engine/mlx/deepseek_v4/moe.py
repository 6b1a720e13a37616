"""The mixture of experts: sqrt(softplus) routing (or a token-id table in the hash layers),
SwitchGLU experts with llama.cpp's clamped SwiGLU, plus a shared expert."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import SwitchGLU

from app.engine.mlx.deepseek_v4.args import ModelArgs

_WEIGHT_SUM_FLOOR = 6.103515625e-5  # llama.cpp's floor for the sum of the routing weights


class ClampedSwiGLU(nn.Module):
    """silu(min(gate, limit)) * clip(up, -limit, limit): llama.cpp's swiglu_clamp."""

    def __init__(self, limit: float) -> None:
        super().__init__()
        self.limit = limit

    def __call__(self, up: mx.array, gate: mx.array) -> mx.array:
        return _clamped_swiglu(up, gate, self.limit)


@mx.compile
def _clamped_swiglu(up: mx.array, gate: mx.array, limit: float) -> mx.array:
    if limit <= 1e-6:
        return nn.silu(gate) * up
    return nn.silu(mx.minimum(gate, limit)) * mx.clip(up, -limit, limit)


class SharedExpert(nn.Module):
    def __init__(self, hidden: int, ff: int, limit: float) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ff, bias=False)
        self.w2 = nn.Linear(ff, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ff, bias=False)
        self._act = ClampedSwiGLU(limit)

    def __call__(self, x: mx.array) -> mx.array:
        return self.w2(self._act(self.w3(x), self.w1(x)))


class Gate(nn.Module):
    """The router: a score per expert; hash layers also carry the token -> experts table."""

    def __init__(self, args: ModelArgs, hashed: bool) -> None:
        super().__init__()
        self.weight = mx.zeros((args.n_routed_experts, args.hidden_size))
        if hashed:
            self.tid2eid = mx.zeros((args.vocab_size, args.num_experts_per_tok), mx.int32)
        else:
            self.bias = mx.zeros((args.n_routed_experts,))


class MoE(nn.Module):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.top_k, self.scale, self.normalise = (
            args.num_experts_per_tok,
            args.routed_scaling_factor,
            args.norm_topk_prob,
        )
        self.hashed = layer < args.num_hash_layers
        self.gate = Gate(args, self.hashed)
        self.switch_mlp = SwitchGLU(
            args.hidden_size,
            args.moe_intermediate_size,
            args.n_routed_experts,
            activation=ClampedSwiGLU(args.swiglu_limit),
        )
        self.shared_experts = SharedExpert(
            args.hidden_size, args.moe_intermediate_size * args.n_shared_experts, args.swiglu_limit
        )

    def __call__(self, x: mx.array, tokens: mx.array) -> mx.array:
        logits = x.astype(mx.float32) @ self.gate.weight.astype(mx.float32).T
        if self.hashed:
            experts, weights = _hashed_route(
                logits, self.gate.tid2eid[tokens], self.normalise, self.scale
            )
        else:
            experts, weights = _route(
                logits, self.gate.bias, self.top_k, self.normalise, self.scale
            )
        routed = self.switch_mlp(x, experts)
        return _weighted_sum(routed, weights) + self.shared_experts(x)


# The router's element-wise steps compiled into a few kernels: decode launched them one by one.
def _weights(probs: mx.array, experts: mx.array, normalise: bool, scale: float) -> mx.array:
    weights = mx.take_along_axis(probs, experts, axis=-1)
    if normalise:
        weights = weights / mx.maximum(weights.sum(-1, keepdims=True), _WEIGHT_SUM_FLOOR)
    return weights * scale


@mx.compile
def _route(
    logits: mx.array, bias: mx.array, top_k: int, normalise: bool, scale: float
) -> tuple[mx.array, mx.array]:
    """sqrt(softplus) scores; the top k by score plus bias; their scores as weights."""
    probs = mx.sqrt(mx.logaddexp(logits, 0.0))
    biased = probs + bias.astype(mx.float32)
    experts = mx.argpartition(-biased, kth=top_k - 1, axis=-1)[:, :top_k]
    return experts, _weights(probs, experts, normalise, scale)


@mx.compile
def _hashed_route(
    logits: mx.array, experts: mx.array, normalise: bool, scale: float
) -> tuple[mx.array, mx.array]:
    """The hash layers' table picks the experts; the scores still weigh them."""
    probs = mx.sqrt(mx.logaddexp(logits, 0.0))
    return experts, _weights(probs, experts, normalise, scale)


@mx.compile
def _weighted_sum(routed: mx.array, weights: mx.array) -> mx.array:
    return (routed * weights[..., None].astype(routed.dtype)).sum(axis=-2)
