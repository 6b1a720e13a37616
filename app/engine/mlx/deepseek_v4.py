"""DeepSeek V4 Flash on MLX, written after llama.cpp's `deepseek4` graph (its executable spec).

One file in mlx-lm's style: a `ModelArgs` dataclass, small modules, a `Model` whose
`__call__(inputs, cache)` returns logits, `sanitize` for Hugging Face checkpoints and
`make_cache` for its own cache. What each layer does (FIELD_NOTES.md has the sizes):

- **Hyper-connections**: the residual is `hc_mult` streams; before each sublayer a learned
  mix (sigmoid weights) collapses them into one input, after it the output is spread back
  with per-stream gains plus a stream-to-stream mix made doubly stochastic by Sinkhorn.
- **Attention**: Q through a low-rank bottleneck, one shared K=V row per token (RMS-normed,
  RoPE on the last `qk_rope_head_dim` channels), a learned sink logit per head, the output
  de-rotated and projected through grouped low-rank matrices. Every layer sees a raw
  sliding window of `sliding_window` tokens; layers with a compress ratio also see
  *compressed* rows, each a softmax-gated sum of a block of tokens' projections: 4:1 blocks
  that overlap the previous block (the "CSA" layers, whose rows a lightning indexer picks
  the top `index_topk` of per query) and 128:1 blocks (the "HCA" layers, all rows visible).
- **MoE**: sqrt(softplus) router scores, top-k by score plus a bias (or, in the first
  `num_hash_layers` layers, a token-id -> experts table), weights normalised then scaled,
  SwitchGLU gathers with a clamped SwiGLU, plus a shared expert.

The cache (`DeepseekV4Cache`, one per layer) holds per layer: every raw K row (any position
can be returned to), the compressed rows, and for each compressor the projections of the
tokens that its next block still needs. That last part is state carried across chunks, like
llama.cpp's recurrent "compressor state", so chunked prefill and decode compute exactly what
one pass over the whole prompt computes.

What trimming can and cannot do. A compressor's next row depends on the projections of the
tokens since the start of its (previous, for 4:1) block; those are not kept for every
position. So the cache trims *exactly* to any position within the last `history` tokens (it
keeps enough projections for that), and to any multiple of `checkpoint_every` (128 by
default; at a multiple of 128 the 128:1 compressors have nothing pending and the 4:1 ones
need only the last 4 tokens' projections, which each checkpoint keeps). For any other
position `trim(n)` goes back to the checkpoint at or before it and returns the larger count
it removed: the engine then re-feeds the tokens between that checkpoint and its target
(at most `checkpoint_every - 1` of them). Every layer applies the same rule, so they always
agree. llama.cpp, by contrast, can only roll its compressor state back to `n_rs_seq`
snapshots. `snapshot()`/`restore()` capture the whole state in O(1) (MLX arrays are
immutable values; later writes copy on write).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models.base import BaseModelArgs
from mlx_lm.models.switch_layers import SwitchGLU, SwitchLinear
from mlx_lm.utils import infer_quant_config

from app.engine.mlx.kernels import top_k_indices

CSA_RATIO = 4  # compressed 4:1, overlapping blocks, picked by the lightning indexer
HCA_RATIO = 128  # compressed 128:1, every row visible
_WEIGHT_SUM_FLOOR = 6.103515625e-5  # llama.cpp's floor for the sum of the routing weights


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


# --- RoPE -----------------------------------------------------------------------------------


class RoPE:
    """ggml's NORM-mode RoPE (adjacent pairs) on the last `dims` channels, with YaRN.

    Same frequencies, ramp and magnitude as `ggml_rope_ext` (ggml-cpu/ops.cpp `rope_yarn`):
    llama.cpp's numbers are the reference, so its formula is used rather than mlx-lm's YaRN.
    """

    def __init__(self, dims: int, base: float, yarn: dict[str, Any] | None) -> None:
        self.dims = dims
        pair = np.arange(dims // 2, dtype=np.float32)
        theta = np.float32(base) ** (-2.0 * pair / dims)
        self.mscale = 1.0
        if yarn is not None:
            freq_scale = np.float32(1.0 / yarn["factor"])
            corr = [
                dims
                * math.log(yarn["original_max_position_embeddings"] / (beta * 2 * math.pi))
                / (2 * math.log(base))
                for beta in (yarn["beta_fast"], yarn["beta_slow"])
            ]
            low, high = max(0.0, math.floor(corr[0])), min(dims - 1.0, math.ceil(corr[1]))
            ramp = 1 - np.clip((pair - low) / max(0.001, high - low), 0, 1)
            theta = theta * (freq_scale * (1 - ramp) + ramp)
            # DeepSeek V4 passes attn_factor = 1 / (1 + 0.1 ln(1/s)); YaRN multiplies it back.
            gain = np.float32(1.0) + np.float32(0.1) * np.log(np.float32(1.0) / freq_scale)
            self.mscale = float(np.float32(np.float32(1.0) / gain) * gain)
        self._wavelengths = mx.array(1.0 / theta.astype(np.float32))

    def __call__(
        self, x: mx.array, offset: int, stride: int = 1, inverse: bool = False
    ) -> mx.array:
        """Rotate `x[..., T, D]` as if its T rows sat at offset, offset+stride, ...; `inverse`
        undoes a rotation (ggml_rope_ext_back)."""
        nope, rot = x[..., : -self.dims], x[..., -self.dims :]
        freqs = -self._wavelengths if inverse else self._wavelengths
        rot = mx.fast.rope(
            rot,
            self.dims,
            traditional=True,
            base=None,
            scale=float(stride),
            offset=offset // stride,
            freqs=freqs,
        )
        if self.mscale != 1.0:
            rot = rot * self.mscale
        return mx.concatenate([nope, rot.astype(x.dtype)], axis=-1)


def _yarn(args: ModelArgs) -> dict[str, Any] | None:
    scaling = args.rope_scaling or {}
    if scaling.get("type", scaling.get("rope_type")) != "yarn":
        return None
    return {
        "factor": float(scaling["factor"]),
        "original_max_position_embeddings": int(scaling["original_max_position_embeddings"]),
        "beta_fast": float(scaling.get("beta_fast", 32.0)),
        "beta_slow": float(scaling.get("beta_slow", 1.0)),
    }


# --- the cache ------------------------------------------------------------------------------


class _Rows:
    """An append-only 2-D buffer grown in steps (like mlx-lm's KVCache), trimmable."""

    step = 256

    def __init__(self) -> None:
        self.buf: mx.array | None = None
        self.n = 0

    def append(self, rows: mx.array) -> None:
        end = self.n + rows.shape[0]
        if self.buf is None or end > self.buf.shape[0]:
            grow = ((end - self.n + self.step - 1) // self.step) * self.step
            fresh = mx.zeros((grow, rows.shape[1]), rows.dtype)
            kept = self.buf[: self.n] if self.buf is not None else None
            self.buf = fresh if kept is None else mx.concatenate([kept, fresh])
        self.buf[self.n : end] = rows
        self.n = end

    def view(self, start: int = 0, end: int | None = None) -> mx.array:
        assert self.buf is not None
        return self.buf[start : self.n if end is None else end]

    def copy(self) -> _Rows:
        out = _Rows()
        out.buf, out.n = (self.buf[: self.n] if self.buf is not None else None), self.n
        return out


@dataclass
class _Pending:
    """A compressor's per-token projections (kv, gate score) of positions start.. ."""

    kv: mx.array
    score: mx.array
    start: int


class _CompressorState:
    """One compressor's memory: its compressed rows, pending projections, checkpoints."""

    def __init__(self, ratio: int, width: int) -> None:
        self.ratio = ratio
        self.overlap = ratio == CSA_RATIO
        self.rows = _Rows()
        empty = mx.zeros((0, width), mx.float32)
        self.pending = _Pending(empty, empty, 0)
        self.checkpoints: dict[int, _Pending] = {}

    def needed_from(self, position: int) -> int:
        """First position whose projections the next block after `position` reads."""
        return max(0, (position // self.ratio - int(self.overlap)) * self.ratio)

    def copy(self) -> _CompressorState:
        out = _CompressorState.__new__(_CompressorState)
        out.ratio, out.overlap = self.ratio, self.overlap
        out.rows, out.pending, out.checkpoints = (
            self.rows.copy(),
            self.pending,
            dict(self.checkpoints),
        )
        return out


class DeepseekV4Cache:
    """One layer's cache: raw K rows, and for compressed layers the compressor states.

    See the module docstring for what `trim` can reach. `history` and `checkpoint_every`
    must be the same for every layer of a model (`Model.make_cache` sees to it).
    """

    def __init__(self, ratio: int, history: int = 256, checkpoint_every: int = HCA_RATIO) -> None:
        if checkpoint_every % HCA_RATIO:
            raise ValueError("checkpoint_every must be a multiple of 128")
        self.ratio = ratio
        self.history = history
        self.checkpoint_every = checkpoint_every
        self.offset = 0
        self.floor = 0  # the earliest position trim() reaches exactly
        self.raw = _Rows()
        self.compressors: dict[str, _CompressorState] = {}

    def compressor(self, name: str, ratio: int, width: int) -> _CompressorState:
        if name not in self.compressors:
            self.compressors[name] = _CompressorState(ratio, width)
        return self.compressors[name]

    def advance(self, n_tokens: int) -> None:
        """Called once the layer has written a chunk: moves offset and the exact-trim floor."""
        self.offset += n_tokens
        self.floor = max(self.floor, self.offset - self.history, 0)

    # mlx-lm's cache protocol

    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.offset == 0

    def is_trimmable(self) -> bool:
        return True

    def reachable(self, position: int) -> int:
        """The position trim() lands on when asked for `position`."""
        position = max(0, min(position, self.offset))
        if position >= self.floor:
            return position
        return (position // self.checkpoint_every) * self.checkpoint_every

    def trim(self, n: int) -> int:
        """Remove the last n tokens, or more (back to a checkpoint); returns how many."""
        target = self.reachable(self.offset - n)
        if target == self.offset:
            return 0
        exact = target >= self.floor
        self.raw.n = target
        for state in self.compressors.values():
            state.rows.n = target // state.ratio
            state.checkpoints = {c: p for c, p in state.checkpoints.items() if c <= target}
            if exact:
                p = state.pending
                cut = target - p.start
                state.pending = _Pending(p.kv[:cut], p.score[:cut], p.start)
            else:
                state.pending = state.checkpoints.get(target) or _empty_like(state.pending)
        trimmed = self.offset - target
        self.offset = target
        if not exact:
            self.floor = target
        return trimmed

    def snapshot(self) -> DeepseekV4Cache:
        """An independent copy of this layer's state (cheap: arrays are shared until written)."""
        out = DeepseekV4Cache(self.ratio, self.history, self.checkpoint_every)
        out.offset, out.floor, out.raw = self.offset, self.floor, self.raw.copy()
        out.compressors = {k: v.copy() for k, v in self.compressors.items()}
        return out

    def restore(self, snapshot: DeepseekV4Cache) -> None:
        copy = snapshot.snapshot()
        self.__dict__.update(copy.__dict__)

    @property
    def state(self) -> dict[str, Any]:
        """Everything as arrays and scalars: mlx-lm's `save_prompt_cache` writes it as is."""
        compressors = {}
        for name, c in self.compressors.items():
            held = {"pending": c.pending, **{f"cp{k}": p for k, p in c.checkpoints.items()}}
            compressors[name] = {
                "ratio": c.ratio,
                "rows": c.rows.view() if c.rows.n else None,
                **{
                    key: {"kv": p.kv, "score": p.score, "start": p.start} for key, p in held.items()
                },
            }
        return {
            "ratio": self.ratio,
            "history": self.history,
            "checkpoint_every": self.checkpoint_every,
            "offset": self.offset,
            "floor": self.floor,
            "raw": self.raw.view() if self.raw.n else None,
            "compressors": compressors,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> DeepseekV4Cache:
        """The inverse of `state` (mlx-lm's `load_prompt_cache` calls it)."""
        cache = cls(state["ratio"], state["history"], state["checkpoint_every"])
        cache.offset, cache.floor = state["offset"], state["floor"]
        if state["raw"] is not None:
            cache.raw.append(state["raw"])
        for name, held in state.get("compressors", {}).items():  # empty ones are not saved
            pending = held["pending"]
            c = cache.compressor(name, held["ratio"], pending["kv"].shape[1])
            if held["rows"] is not None:
                c.rows.append(held["rows"])
            c.pending = _Pending(pending["kv"], pending["score"], pending["start"])
            c.checkpoints = {
                int(key[2:]): _Pending(p["kv"], p["score"], p["start"])
                for key, p in held.items()
                if key.startswith("cp")
            }
        return cache

    @property
    def nbytes(self) -> int:
        arrays = [self.raw.view()] if self.raw.buf is not None else []
        for s in self.compressors.values():
            if s.rows.buf is not None:
                arrays.append(s.rows.view())
            for p in (s.pending, *s.checkpoints.values()):
                arrays += [p.kv, p.score]
        return sum(a.nbytes for a in arrays)


_PROJ = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}
_FP8_BLOCK = 128  # DeepSeek's FP8 matrices carry one scale per 128 x 128 block


def _e8m0(scale: mx.array) -> mx.array:
    """Scales as floats: E8M0 bytes are biased powers of two."""
    if scale.dtype == mx.uint8:
        return mx.power(2.0, scale.astype(mx.float32) - 127.0)
    return scale.astype(mx.float32)


def _dequantize_fp8(weight: mx.array, scale: mx.array) -> mx.array:
    """An FP8 (E4M3) matrix with per-block scales, as bfloat16."""
    if weight.dtype not in (mx.uint8, mx.int8):
        return weight
    rows, cols = weight.shape
    values = mx.from_fp8(weight.view(mx.uint8), dtype=mx.float32)
    factors = mx.repeat(mx.repeat(_e8m0(scale), _FP8_BLOCK, axis=0), _FP8_BLOCK, axis=1)
    return (values * factors[:rows, :cols]).astype(mx.bfloat16)


def _fp4_or_float(weight: mx.array, scale: mx.array | None) -> tuple[mx.array, mx.array | None]:
    """One routed expert's matrix: packed FP4 bytes as MLX mxfp4 (uint32 words, uint8
    scales), FP8 dequantized, floats as they are."""
    if scale is None:
        return weight, None
    if weight.shape[-1] == 16 * scale.shape[-1]:  # two codes a byte, 32 codes a scale
        return weight.view(mx.uint8).view(mx.uint32), scale.view(mx.uint8)
    return _dequantize_fp8(weight, scale), None


# mlx-lm's load_prompt_cache finds a cache class by its name among its own module's globals.
setattr(mlx_cache, DeepseekV4Cache.__name__, DeepseekV4Cache)


def _empty_like(p: _Pending) -> _Pending:
    empty = mx.zeros((0, p.kv.shape[1]), mx.float32)
    return _Pending(empty, empty, 0)


# --- modules --------------------------------------------------------------------------------


def _rms_norm(x: mx.array, eps: float) -> mx.array:
    return mx.fast.rms_norm(x, None, eps)


class Compressor(nn.Module):
    """Turns each completed block of `ratio` tokens into one K row (softmax-gated sum).

    4:1 blocks overlap: a row mixes the previous block's first-half projections with its own
    block's second half, so `wkv`/`wgate` are twice as wide there.
    """

    def __init__(self, hidden: int, head_dim: int, ratio: int, rope: RoPE, eps: float) -> None:
        super().__init__()
        self.ratio, self.head_dim = ratio, head_dim
        width = (2 if ratio == CSA_RATIO else 1) * head_dim
        self.wkv = nn.Linear(hidden, width, bias=False)
        self.wgate = nn.Linear(hidden, width, bias=False)
        self.ape = mx.zeros((ratio, width))
        self.norm = nn.RMSNorm(head_dim, eps=eps)
        self._rope = rope

    def __call__(self, x: mx.array, cache: DeepseekV4Cache, name: str) -> mx.array:
        """Add the rows the chunk `x` [L, hidden] completes; return all rows so far [n, D]."""
        r, d = self.ratio, self.head_dim
        state = cache.compressor(name, r, self.wkv.weight.shape[0])
        offset, n_new = cache.offset, x.shape[0]
        end = offset + n_new
        positions = mx.arange(offset, end) % r
        kv = self.wkv(x).astype(mx.float32)
        score = self.wgate(x).astype(mx.float32) + self.ape[positions].astype(mx.float32)
        p = state.pending
        all_kv = mx.concatenate([p.kv, kv])
        all_score = mx.concatenate([p.score, score])
        first, last = offset // r, end // r  # blocks [first, last) complete in this chunk
        if last > first:
            state.rows.append(self._compress(all_kv, all_score, p.start, first, last))
        for c in range(
            (offset // cache.checkpoint_every + 1) * cache.checkpoint_every,
            end + 1,
            cache.checkpoint_every,
        ):
            lo = state.needed_from(c)
            state.checkpoints[c] = _Pending(
                all_kv[lo - p.start : c - p.start], all_score[lo - p.start : c - p.start], lo
            )
        keep = max(p.start, state.needed_from(max(cache.floor, end - cache.history, 0)))
        state.pending = _Pending(all_kv[keep - p.start :], all_score[keep - p.start :], keep)
        return state.rows.view().astype(x.dtype) if state.rows.n else mx.zeros((0, d), x.dtype)

    def _compress(
        self, kv: mx.array, score: mx.array, start: int, first: int, last: int
    ) -> mx.array:
        r, d = self.ratio, self.head_dim
        n_blocks = last - first
        if r == CSA_RATIO:
            lo = (first - 1) * r
            if lo < 0:  # block 0 has no previous block: zero values, -inf gates
                pad = mx.zeros((r, kv.shape[1]), mx.float32)
                kv = mx.concatenate([pad, kv])
                score = mx.concatenate([mx.full(pad.shape, -mx.inf), score])
                start -= r
            span = slice(lo - start, lo - start + (n_blocks + 1) * r)
            kv = kv[span].reshape(n_blocks + 1, r, -1)
            score = score[span].reshape(n_blocks + 1, r, -1)
            values = mx.concatenate([kv[:-1, :, :d], kv[1:, :, d:]], axis=1)
            gates = mx.concatenate([score[:-1, :, :d], score[1:, :, d:]], axis=1)
        else:
            span = slice(first * r - start, last * r - start)
            values = kv[span].reshape(n_blocks, r, d)
            gates = score[span].reshape(n_blocks, r, d)
        rows = (values * mx.softmax(gates, axis=1)).sum(axis=1)
        rows = self.norm(rows)
        return self._rope(rows[None], first * r, stride=r)[0]


class Indexer(nn.Module):
    """The lightning indexer: scores compressed rows per query, keeps the top `index_topk`.

    The scoring and selection are `kernels.top_k_indices`: Metal kernels on an Apple GPU, the
    CUDA twin under mlx-cuda, the pure-MLX reference elsewhere (`STOKE_INDEXER_IMPL` forces
    one). llama.cpp also rotates the indexer's Q and K by a Hadamard matrix before storing
    K; that rotation is orthonormal, so it leaves every score as it is and is not done here.
    """

    def __init__(self, args: ModelArgs, rope: RoPE) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.top_k = (
            args.index_n_heads,
            args.index_head_dim,
            args.index_topk,
        )
        self.wq_b = nn.Linear(args.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.weights_proj = nn.Linear(args.hidden_size, self.n_heads, bias=False)
        self.compressor = Compressor(
            args.hidden_size, self.head_dim, CSA_RATIO, rope, args.rms_norm_eps
        )
        self._rope = rope

    def __call__(
        self, x: mx.array, qr: mx.array, cache: DeepseekV4Cache, n_visible: mx.array
    ) -> mx.array | None:
        """Top-k row indices [L, k], or None when every visible row is picked anyway."""
        keys = self.compressor(x, cache, "indexer")
        if keys.shape[0] <= self.top_k:
            return None
        n_q = x.shape[0]
        q = self.wq_b(qr).reshape(n_q, self.n_heads, self.head_dim)
        q = self._rope(q.swapaxes(0, 1), cache.offset).swapaxes(0, 1)
        weights = self.weights_proj(x) * (self.head_dim * self.n_heads) ** -0.5
        return top_k_indices(q, weights, keys, n_visible, self.top_k)


class Attention(nn.Module):
    """Shared-KV attention over a raw window plus compressed rows, with sinks."""

    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.n_heads, self.head_dim = args.num_attention_heads, args.head_dim
        self.window, self.eps = args.sliding_window, args.rms_norm_eps
        self.ratio = args.compress_ratios[layer]
        self.n_groups, self.group_rank = args.o_groups, args.o_lora_rank
        self.wq_a = nn.Linear(args.hidden_size, args.q_lora_rank, bias=False)
        self.q_norm = nn.RMSNorm(args.q_lora_rank, eps=args.rms_norm_eps)
        self.wq_b = nn.Linear(args.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wkv = nn.Linear(args.hidden_size, self.head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(self.head_dim, eps=args.rms_norm_eps)
        group_width = self.n_heads * self.head_dim // self.n_groups
        self.wo_a = SwitchLinear(group_width, self.group_rank, self.n_groups, bias=False)
        self.wo_b = nn.Linear(self.n_groups * self.group_rank, args.hidden_size, bias=False)
        self.attn_sink = mx.zeros((self.n_heads,))
        yarn = _yarn(args)
        compressed_rope = RoPE(args.qk_rope_head_dim, args.compress_rope_theta, yarn)
        # llama.cpp: compressed layers rotate with the compress base and YaRN, raw ones plainly
        self._rope = (
            compressed_rope if self.ratio else RoPE(args.qk_rope_head_dim, args.rope_theta, None)
        )
        if self.ratio:
            self.compressor = Compressor(
                args.hidden_size, self.head_dim, self.ratio, compressed_rope, args.rms_norm_eps
            )
        if self.ratio == CSA_RATIO:
            self.indexer = Indexer(args, compressed_rope)

    def __call__(self, x: mx.array, cache: DeepseekV4Cache) -> mx.array:
        n_q, offset = x.shape[0], cache.offset
        qr = self.q_norm(self.wq_a(x))
        q = self.wq_b(qr).reshape(n_q, self.n_heads, self.head_dim)
        q = self._rope(_rms_norm(q, self.eps).swapaxes(0, 1), offset)  # [H, L, D]
        kv = self._rope(self.kv_norm(self.wkv(x))[None], offset)[0]  # [L, D]

        cache.raw.append(kv)
        first = max(0, offset - self.window + 1)
        keys = [cache.raw.view(first, offset + n_q)]
        q_pos = mx.arange(offset, offset + n_q)[:, None]
        k_pos = mx.arange(first, offset + n_q)[None]
        masks = [(k_pos <= q_pos) & (q_pos - k_pos < self.window)]
        sinks = self.attn_sink.astype(q.dtype)
        scale = self.head_dim**-0.5
        picked = None
        if self.ratio:
            rows = self.compressor(x, cache, "attn")
            n_visible = (mx.arange(offset, offset + n_q) + 1) // self.ratio
            if self.ratio == CSA_RATIO:
                picked = self.indexer(x, qr, cache, n_visible)
            if rows.shape[0] and picked is None:
                keys.append(rows)
                masks.append(mx.arange(rows.shape[0])[None] < n_visible[:, None])
        k = mx.concatenate(keys).astype(q.dtype)
        mask = mx.concatenate(masks, axis=1)
        if picked is None:
            k = k[None, None]
            out = mx.fast.scaled_dot_product_attention(
                q[None], k, k, scale=scale, mask=mask[None, None], sinks=sinks
            )[0]
        else:
            out = _window_and_picked_attention(
                q, k, mask, rows.astype(q.dtype), picked, sinks, scale
            )
        out = self._rope(out, offset, inverse=True).swapaxes(0, 1)  # [L, H, D]
        out = out.reshape(n_q, self.n_groups, 1, -1)
        groups = mx.broadcast_to(mx.arange(self.n_groups), (n_q, self.n_groups))
        out = self.wo_a(out, groups).reshape(n_q, self.n_groups * self.group_rank)
        return self.wo_b(out)


def _window_and_picked_attention(
    q: mx.array,
    window: mx.array,
    window_mask: mx.array,
    rows: mx.array,
    picked: mx.array,
    sinks: mx.array,
    scale: float,
) -> mx.array:
    """Attention of q [H, L, D] over its window keys [S, D] and, per query, only the
    compressed rows the indexer picked (rows [n, D], picked [L, k], -1 for none), with one
    softmax across both and the sink. Gathering k rows per query keeps a long prompt's
    cost at L x (window + k) instead of L x (window + all rows). K is V."""
    chosen = rows[mx.maximum(picked, 0)]  # [L, k, D]
    by_query = q.swapaxes(0, 1)  # [L, H, D]
    raw = (q @ window.T).astype(mx.float32) * scale  # [H, L, S]
    raw = mx.where(window_mask[None], raw, -mx.inf)
    sparse = (by_query @ chosen.swapaxes(1, 2)).astype(mx.float32) * scale  # [L, H, k]
    sparse = mx.where((picked >= 0)[:, None, :], sparse, -mx.inf).swapaxes(0, 1)
    sink = mx.broadcast_to(sinks.astype(mx.float32)[:, None, None], (*raw.shape[:2], 1))
    weights = mx.softmax(mx.concatenate([raw, sparse, sink], axis=-1), axis=-1)
    n_window = window.shape[0]
    p_raw = weights[..., :n_window].astype(q.dtype)
    p_sparse = weights[..., n_window:-1].astype(q.dtype).swapaxes(0, 1)  # [L, H, k]
    return p_raw @ window + (p_sparse @ chosen).swapaxes(0, 1)


class ClampedSwiGLU(nn.Module):
    """silu(min(gate, limit)) * clip(up, -limit, limit): llama.cpp's swiglu_clamp."""

    def __init__(self, limit: float) -> None:
        super().__init__()
        self.limit = limit

    def __call__(self, up: mx.array, gate: mx.array) -> mx.array:
        if self.limit <= 1e-6:
            return nn.silu(gate) * up
        return nn.silu(mx.minimum(gate, self.limit)) * mx.clip(up, -self.limit, self.limit)


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
        probs = mx.sqrt(mx.logaddexp(logits, 0.0))
        if self.hashed:
            experts = self.gate.tid2eid[tokens]
        else:
            biased = probs + self.gate.bias.astype(mx.float32)
            experts = mx.argpartition(-biased, kth=self.top_k - 1, axis=-1)[:, : self.top_k]
        weights = mx.take_along_axis(probs, experts, axis=-1)
        if self.normalise:
            weights = weights / mx.maximum(weights.sum(-1, keepdims=True), _WEIGHT_SUM_FLOOR)
        weights = weights * self.scale
        routed = self.switch_mlp(x, experts)
        routed = (routed * weights[..., None].astype(routed.dtype)).sum(axis=-2)
        return routed + self.shared_experts(x)


def _sinkhorn(comb: mx.array, iters: int, eps: float) -> mx.array:
    """comb [L, src, dst]: softmax over dst, then alternate column/row normalisation."""
    comb = mx.softmax(comb, axis=-1) + eps
    comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(axis=-1, keepdims=True) + eps)
        comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    return comb


class HyperMix(nn.Module):
    """The hyper-connection weights around one sublayer (`hc_attn_*` or `hc_ffn_*`)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        hc = args.hc_mult
        self.fn = mx.zeros(((2 + hc) * hc, hc * args.hidden_size))
        self.base = mx.zeros(((2 + hc) * hc,))
        self.scale = mx.zeros((3,))
        self._hc, self._eps, self._norm_eps = hc, args.hc_eps, args.rms_norm_eps
        self._iters = args.hc_sinkhorn_iters

    def collapse(self, h: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """h [L, hc, E] -> the sublayer input [L, E], and the post gains and stream mix."""
        hc, n_q = self._hc, h.shape[0]
        flat = _rms_norm(h.reshape(n_q, -1), self._norm_eps)
        mixes = flat @ self.fn.T
        pre = mx.sigmoid(mixes[:, :hc] * self.scale[0] + self.base[:hc]) + self._eps
        post = 2 * mx.sigmoid(mixes[:, hc : 2 * hc] * self.scale[1] + self.base[hc : 2 * hc])
        comb = mixes[:, 2 * hc :] * self.scale[2] + self.base[2 * hc :]
        comb = _sinkhorn(comb.reshape(n_q, hc, hc), self._iters, self._eps)
        return (pre[..., None] * h).sum(axis=1), post, comb

    @staticmethod
    def expand(y: mx.array, h: mx.array, post: mx.array, comb: mx.array) -> mx.array:
        """The sublayer output y [L, E] spread back over the streams, plus the mixed residual."""
        mixed = (comb[..., None] * h[:, :, None, :]).sum(axis=1)  # [L, dst, E]
        return y[:, None, :] * post[..., None] + mixed


class Block(nn.Module):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.attn = Attention(args, layer)
        self.ffn_norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.ffn = MoE(args, layer)
        self.hc_attn = HyperMix(args)
        self.hc_ffn = HyperMix(args)

    def __call__(
        self, h: mx.array, tokens: mx.array, cache: DeepseekV4Cache, dtype: mx.Dtype
    ) -> mx.array:
        """h [L, hc, E] float32 streams; the sublayers compute in `dtype`."""
        y, post, comb = self.hc_attn.collapse(h)
        y = self.attn(self.attn_norm(y).astype(dtype), cache)
        h = HyperMix.expand(y.astype(mx.float32), h, post, comb)
        y, post, comb = self.hc_ffn.collapse(h)
        y = self.ffn(self.ffn_norm(y).astype(dtype), tokens)
        return HyperMix.expand(y.astype(mx.float32), h, post, comb)


class Model(nn.Module):
    """DeepSeek V4 (no MTP head): `model(tokens[1, L], cache) -> logits[1, L, vocab]`."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.embed = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [Block(args, i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        hc = args.hc_mult
        self.hc_head_fn = mx.zeros((hc, hc * args.hidden_size))
        self.hc_head_base = mx.zeros((hc,))
        self.hc_head_scale = mx.zeros((1,))

    def __call__(self, inputs: mx.array, cache: list[DeepseekV4Cache] | None = None) -> mx.array:
        if inputs.ndim != 2 or inputs.shape[0] != 1:
            raise ValueError("DeepSeek V4 runs one sequence at a time: inputs must be [1, L]")
        cache = cache if cache is not None else self.make_cache()
        tokens = inputs[0]
        x = self.embed(tokens).astype(mx.float32)
        h = mx.broadcast_to(x[:, None, :], (x.shape[0], self.args.hc_mult, x.shape[1]))
        dtype = self.compute_dtype
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            h = layer(h, tokens, layer_cache, dtype)
            layer_cache.advance(tokens.shape[0])
        flat = _rms_norm(h.reshape(h.shape[0], -1), self.args.rms_norm_eps)
        mixes = flat @ self.hc_head_fn.T
        pre = mx.sigmoid(mixes * self.hc_head_scale + self.hc_head_base) + self.args.hc_eps
        y = (pre[..., None] * h).sum(axis=1)
        return self.head(self.norm(y).astype(dtype))[None]

    @property
    def compute_dtype(self) -> mx.Dtype:
        """The activations' type: the weights' (the scales' when they are quantized)."""
        head = self.head
        return head.scales.dtype if hasattr(head, "scales") else head.weight.dtype

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """A Hugging Face DeepSeek V4 checkpoint (or an MLX one) as this model's parameters.

        Renames the hyper-connection tensors, stacks the routed experts for SwitchGLU,
        dequantizes FP8 block-scaled matrices, and keeps the FP4 experts packed: their bytes
        are MLX's mxfp4 layout already (two E2M1 codes per byte, low nibble first, one E8M0
        exponent per 32), so those layers become quantized ones here. Drops the MTP block
        and the vision-only routing bias. Idempotent on its own output.
        """
        args = self.args
        out: dict[str, mx.array] = {}
        experts: dict[str, list[tuple[int, mx.array, mx.array | None]]] = {}
        for name, value in weights.items():
            quant_scale = name.endswith(".scale") and name[:-6] + ".weight" in weights
            if name.startswith("mtp.") or name.endswith(".bias_vl") or quant_scale:
                continue
            layer, _, rest = name.removeprefix("layers.").partition(".")
            if name.startswith("layers.") and rest.startswith(("hc_attn_", "hc_ffn_")):
                stage, _, part = rest.partition("_")[2].partition("_")
                name = f"layers.{layer}.hc_{stage}.{part}"
            scale = weights.get(name.removesuffix(".weight") + ".scale")
            if rest.startswith("ffn.experts."):
                expert, proj, _ = rest.removeprefix("ffn.experts.").split(".")
                experts.setdefault(f"layers.{layer}.ffn.switch_mlp.{_PROJ[proj]}", []).append(
                    (int(expert), value, scale)
                )
                continue
            if name.endswith(".gate.bias") and int(layer) < args.num_hash_layers:
                continue  # hash layers route by table; llama.cpp drops this bias too
            if name.endswith("tid2eid"):
                value = value.astype(mx.int32)
            elif scale is not None:
                value = _dequantize_fp8(value, scale)
            if ".attn.wo_a." in name and value.ndim == 2:
                value = value.reshape(args.o_groups, args.o_lora_rank, -1)
            out[name] = value
        for path, parts in experts.items():
            parts.sort(key=lambda part: part[0])
            packed = [_fp4_or_float(value, scale) for _, value, scale in parts]
            out[f"{path}.weight"] = mx.stack([w for w, _ in packed])
            if packed[0][1] is not None:
                out[f"{path}.scales"] = mx.stack([sc for _, sc in packed])
        self._quantize_for(out)
        return out

    def _quantize_for(self, weights: dict[str, mx.array]) -> None:
        """Swap in quantized layers wherever the checkpoint brings packed weights."""

        def packed(path: str, module: nn.Module) -> dict[str, Any] | bool:
            if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
                return False
            return infer_quant_config(path, module, weights)

        nn.quantize(self, class_predicate=packed)

    def make_cache(
        self, history: int = 256, checkpoint_every: int = HCA_RATIO
    ) -> list[DeepseekV4Cache]:
        return [
            DeepseekV4Cache(self.args.compress_ratios[i], history, checkpoint_every)
            for i in range(self.args.num_hidden_layers)
        ]
