"""DeepSeek V4 Flash on MLX, written after llama.cpp's `deepseek4` graph (its executable spec).

One architecture in mlx-lm's style: a `ModelArgs` dataclass, small modules, a `Model` whose
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

The parts live in small modules: `args` (ModelArgs), `layers` (RMS norm, RoPE), `cache`
(DeepseekV4Cache: what it holds and what trimming can reach), `compressor`, `moe`, `hyper`
(hyper-connections), `names` (the tensor names of every published format), `weights`
(checkpoint tensors as parameters) and `mtp` (the MTP block
as a drafter's head, one window cache per conversation). This module holds the attention, the
lightning indexer, the MTP block (`MtpBlock`, a GGUF's NextN layer) and the model itself;
the indexer calls `top_k_indices` through this module's globals, so a benchmark can swap the
top-k implementation here.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import SwitchLinear

from app.engine.mlx.deepseek_v4.args import CSA_RATIO, HCA_RATIO, ModelArgs
from app.engine.mlx.deepseek_v4.cache import DeepseekV4Cache
from app.engine.mlx.deepseek_v4.compressor import Compressor
from app.engine.mlx.deepseek_v4.hyper import HyperMix
from app.engine.mlx.deepseek_v4.layers import RoPE, grouped_linear, rms_norm, yarn
from app.engine.mlx.deepseek_v4.moe import MoE
from app.engine.mlx.deepseek_v4.weights import quantize_for, sanitize_checkpoint
from app.engine.mlx.kernels import top_k_indices

__all__ = [
    "CSA_RATIO",
    "HCA_RATIO",
    "Attention",
    "Block",
    "DeepseekV4Cache",
    "Indexer",
    "Model",
    "ModelArgs",
    "MtpBlock",
    "top_k_indices",
]


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
        scaling = yarn(args)
        compressed_rope = RoPE(args.qk_rope_head_dim, args.compress_rope_theta, scaling)
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
        q = self._rope(rms_norm(q, self.eps).swapaxes(0, 1), offset)  # [H, L, D]
        kv = self._rope(self.kv_norm(self.wkv(x))[None], offset)[0]  # [L, D]

        cache.raw.append(kv)
        first = max(cache.start, offset - self.window + 1)
        keys = [cache.raw.view(first - cache.start, offset + n_q - cache.start)]
        # One query (decode) sees every key it is given: its window and every completed row.
        masked = n_q > 1
        masks = []
        if masked:
            q_pos = mx.arange(offset, offset + n_q)[:, None]
            k_pos = mx.arange(first, offset + n_q)[None]
            masks.append((k_pos <= q_pos) & (q_pos - k_pos < self.window))
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
                if masked:
                    masks.append(mx.arange(rows.shape[0])[None] < n_visible[:, None])
        k = mx.concatenate(keys).astype(q.dtype) if len(keys) > 1 else keys[0].astype(q.dtype)
        mask = mx.concatenate(masks, axis=1) if masked else None
        if picked is None:
            k = k[None, None]
            out = mx.fast.scaled_dot_product_attention(
                q[None],
                k,
                k,
                scale=scale,
                mask=None if mask is None else mask[None, None],
                sinks=sinks,
            )[0]
        else:
            out = _window_and_picked_attention(
                q, k, mask, rows.astype(q.dtype), picked, sinks, scale
            )
        out = self._rope(out, offset, inverse=True).swapaxes(0, 1)  # [L, H, D]
        out = grouped_linear(self.wo_a, out.reshape(n_q, self.n_groups, -1).swapaxes(0, 1))
        return self.wo_b(out.swapaxes(0, 1).reshape(n_q, self.n_groups * self.group_rank))


def _window_and_picked_attention(
    q: mx.array,
    window: mx.array,
    window_mask: mx.array | None,
    rows: mx.array,
    picked: mx.array,
    sinks: mx.array,
    scale: float,
) -> mx.array:
    """Attention of q [H, L, D] over its window keys [S, D] and, per query, only the
    compressed rows the indexer picked (rows [n, D], picked [L, k], -1 for none), with one
    softmax across both and the sink. Gathering k rows per query keeps a long prompt's
    cost at L x (window + k) instead of L x (window + all rows). K is V.

    The two score blocks stay apart and in q's type: one normaliser (float32) is taken over
    both and the sink, then each block becomes its weights, so no [H, L, S + k] float32 copy
    of a long prompt's scores is made."""
    chosen = rows[mx.maximum(picked, 0)]  # [L, k, D]
    q = q * scale
    raw = q @ window.T  # [H, L, S]
    if window_mask is not None:
        raw = mx.where(window_mask[None], raw, -mx.inf)
    sparse = q.swapaxes(0, 1) @ chosen.swapaxes(1, 2)  # [L, H, k]
    sparse = mx.where((picked >= 0)[:, None, :], sparse, -mx.inf).swapaxes(0, 1)
    p_raw, p_sparse = _split_softmax(raw, sparse, sinks)
    return p_raw @ window + (p_sparse.swapaxes(0, 1) @ chosen).swapaxes(0, 1)


@mx.compile
def _split_softmax(raw: mx.array, sparse: mx.array, sinks: mx.array) -> tuple[mx.array, mx.array]:
    """softmax over [raw | sparse | sink] along the last axis, returned as its two blocks."""
    norm = mx.logaddexp(
        mx.logsumexp(raw.astype(mx.float32), axis=-1, keepdims=True),
        mx.logsumexp(sparse.astype(mx.float32), axis=-1, keepdims=True),
    )
    norm = mx.logaddexp(norm, sinks.astype(mx.float32)[:, None, None])
    return (
        mx.exp(raw.astype(mx.float32) - norm).astype(raw.dtype),
        mx.exp(sparse.astype(mx.float32) - norm).astype(sparse.dtype),
    )


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


class MtpBlock(nn.Module):
    """The NextN (multi-token prediction) block, as llama.cpp's deepseek4 `graph_mtp` runs it:
    the entry of token x at p reads the model's final streams at p - 1, each stream becomes
    `eh_proj([enorm(embed(x)); hnorm(stream)])`, one more block (raw window attention) runs over
    them, and the model's hc head with this block's own norm and the model's head give the
    logits of p + 1. Its output streams stand in for the model's when a guess is fed back."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        width, eps = args.hidden_size, args.rms_norm_eps
        self.eh_proj = nn.Linear(2 * width, width, bias=False)
        self.enorm = nn.RMSNorm(width, eps=eps)
        self.hnorm = nn.RMSNorm(width, eps=eps)
        self.norm = nn.RMSNorm(width, eps=eps)  # the shared head's
        self.block = Block(args, args.num_hidden_layers)
        self._hc = args.hc_mult

    def __call__(
        self, model: Model, tokens: mx.array, states: mx.array, cache: DeepseekV4Cache
    ) -> tuple[mx.array, mx.array]:
        """tokens [L], the streams before them [L, hc * E] -> logits [L, vocab], streams."""
        n, dtype = tokens.shape[0], model.compute_dtype
        e = self.enorm(model.embed(tokens).astype(mx.float32))
        h = self.hnorm(states.astype(mx.float32).reshape(n, self._hc, -1))
        x = mx.concatenate([mx.broadcast_to(e[:, None, :], h.shape), h], axis=-1)
        x = self.eh_proj(x.astype(dtype)).astype(mx.float32)
        x = self.block(x, tokens, cache, dtype)
        cache.advance(n)
        return model.output(x, self.norm), x.reshape(n, -1)


class Model(nn.Module):
    """DeepSeek V4: `model(tokens[1, L], cache) -> logits[1, L, vocab]`, with its MTP block
    (`mtp.MtpBlock`) where the GGUF has one. While `keep_hidden` is set, `hidden` is the last
    call's final streams [L, hc * E] (the state the MTP block reads)."""

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
        if args.mtp_layers:
            self.mtp = [MtpBlock(args)]
        self.keep_hidden = False
        self.hidden: mx.array | None = None

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
        if self.keep_hidden:
            self.hidden = h.reshape(h.shape[0], -1)
        return self.output(h, self.norm)[None]

    def output(self, h: mx.array, norm: nn.Module) -> mx.array:
        """Logits [L, vocab] of the streams h [L, hc, E]: the hc head's mix, `norm`, head."""
        flat = rms_norm(h.reshape(h.shape[0], -1), self.args.rms_norm_eps)
        mixes = flat @ self.hc_head_fn.T
        pre = mx.sigmoid(mixes * self.hc_head_scale + self.hc_head_base) + self.args.hc_eps
        y = (pre[..., None] * h).sum(axis=1)
        return self.head(norm(y).astype(self.compute_dtype))

    @property
    def compute_dtype(self) -> mx.Dtype:
        """The activations' type: the final norm's, which every format keeps in the model's
        float type (a quantized head's scales are uint8 in the float-block modes)."""
        return self.norm.weight.dtype

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """A Hugging Face DeepSeek V4 checkpoint (or an MLX one) as this model's parameters.

        Maps any published dialect's names (`names`), stacks the routed experts for
        SwitchGLU, and keeps the release's packed matrices packed: FP4 experts are MLX's
        mxfp4 layout already (two E2M1 codes per byte, low nibble first, one E8M0 exponent
        per 32) and FP8 matrices with E8M0 block scales are mxfp8 with the block's exponent
        repeated per 32, so those layers become quantized ones here, as do layers an MLX
        conversion packed (any mode, bits and group size, read off the tensors). Drops a
        Hugging Face checkpoint's MTP block (a GGUF's is kept) and the vision-only routing
        bias. Idempotent on its own output.
        """
        out = sanitize_checkpoint(self.args, weights)
        quantize_for(self, out)
        return out

    def make_cache(
        self, history: int = 256, checkpoint_every: int = HCA_RATIO
    ) -> list[DeepseekV4Cache]:
        return [
            DeepseekV4Cache(self.args.compress_ratios[i], history, checkpoint_every)
            for i in range(self.args.num_hidden_layers)
        ]
