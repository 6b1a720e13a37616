"""DeepSeek V4 Flash as llama.cpp sees it, without downloading 150 GB.

The offload planner has to be built and tested against the flagship's real tensor names,
shapes and quant types, and against what llama.cpp allocates for them. This writes `deepseek4`
GGUFs that follow llama.cpp's own loader (vendored in llama-cpp-python 0.3.36:
`src/models/deepseek4.cpp`, `src/llama-arch.cpp`, `conversion/deepseek.py`):

- `full`: the real dimensions and quant types of the 0731 release, tensor data left as a
  sparse hole. Seconds to write, a few MB on disk where the filesystem keeps holes (ext4,
  xfs, btrfs, tmpfs, APFS); inspection and llama.cpp dry runs (`no_alloc`) see the real
  148,899 MiB model.
- `scaled`: the same structure (compressed-KV and indexer layers, hash-routed first layers,
  hyper-connections, shared expert) at toy sizes with seeded random weights in types the
  CPU backend runs, so llama.cpp really loads it and generates (gibberish).

`mtp=True` appends DeepSeek V4's multi-token-prediction block as llama.cpp's loader reads it
from one file: block `n_layer` (raw window attention, routed MoE, hyper-connections) plus its
`nextn.eh_proj/enorm/hnorm/shared_head_norm` (the token embedding, output head and hc head are
shared with the trunk, as the converter writes them), `block_count` n_layer + 1 and
`nextn_predict_layers` 1. The catalog's full-size layout stays without it: llama.cpp's converter
leaves the MTP block out of the model file (`--mtp` writes it to a file of its own).

The installed gguf-py does not know `deepseek4`, so keys are written by name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGMLQuantizationType,
    GGUFWriter,
    LlamaFileType,
    TokenType,
)
from gguf.quants import dequantize, quantize

from app.engine.gguf_info import inspect_gguf

Mode = Literal["full", "scaled"]
Q = GGMLQuantizationType

ARCH = "deepseek4"
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
SQRT_SOFTPLUS = 4  # LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS, the only gating deepseek4 loads
# A few byte-level BPE merges, so the scaled tokenizer merges real text like the real one.
_MERGES = ("Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a t")


@dataclass(frozen=True)
class Dims:
    """Hyperparameters of a deepseek4 model; the defaults are DeepSeek-V4-Flash's."""

    n_layer: int = 43
    n_embd: int = 4096
    n_vocab: int = 129_280
    n_ctx_train: int = 1_048_576
    n_head: int = 64
    head_dim: int = 512  # one shared K=V row per token
    n_rot: int = 64
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    sliding_window: int = 128
    n_expert: int = 256
    n_expert_used: int = 6
    n_expert_shared: int = 1
    n_ff_exp: int = 2048
    hash_layers: int = 3  # first layers route by token id (tid2eid), not by the router
    indexer_heads: int = 64
    indexer_head_dim: int = 128
    indexer_top_k: int = 512
    hc_mult: int = 4  # hyper-connection streams
    rope_yarn_orig_ctx: int = 65_536

    def compress_ratio(self, layer: int) -> int:
        """0 (raw window only) for layers 0-1, then 4:1 with indexer (even), 128:1 (odd)."""
        if layer < 2:
            return 0
        return 4 if layer % 2 == 0 else 128


FLASH = Dims()
SCALED = Dims(
    n_layer=6,
    n_embd=256,
    n_vocab=512,
    n_ctx_train=4096,
    n_head=8,
    head_dim=64,
    n_rot=16,
    q_lora_rank=64,
    o_groups=2,
    o_lora_rank=64,
    sliding_window=16,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=128,
    indexer_heads=4,
    indexer_head_dim=64,  # llama.cpp's indexer Hadamard rotation starts at 64 wide
    indexer_top_k=8,
    rope_yarn_orig_ctx=1024,
)

# Storage of each tensor role in the 0731 release. Routed experts keep the checkpoint's FP4 as
# MXFP4 and its FP8 projections become Q8_0, as llama.cpp's converter does
# (conversion/deepseek.py). The release's per-tensor list is not at hand: the remaining roles
# are the one natural assignment that reproduces its measured totals exactly (FIELD_NOTES:
# 148,899 MiB of weights, 7,537 MiB outside the experts and token_embd). Only the output head
# (Q8_0, 537 MiB) and the BF16/F32 split of the small roles (~300 MiB) rest on that fit.
_FULL_TYPES: dict[str, Q] = {
    "embedding": Q.BF16,
    "output": Q.Q8_0,
    "dense": Q.Q8_0,
    "expert": Q.MXFP4,
    "router": Q.F32,
    "compressor": Q.BF16,
    "indexer": Q.BF16,
    "f32": Q.F32,
    "i32": Q.I32,
}
# The scaled model swaps in types whose CPU kernels are plain and whose data numpy can write.
_SCALED_TYPES = _FULL_TYPES | {
    "embedding": Q.F16,
    "expert": Q.Q8_0,
    "compressor": Q.F16,
    "indexer": Q.F16,
}
# `weights="f16"/"f32"`: every matrix in one float type that `mx.load` reads as it is, so the
# MLX model and llama.cpp run on the very same numbers (the logit-agreement test).
# `weights="mxfp4"`: the f32 model with its routed experts in MXFP4, as the 0731 release ships;
# A "-values" twin holds the same numbers as its packed model with every packed tensor stored
# as F32 (its blocks read back), so an engine's packed kernels can be checked against another
# engine's float ones on the very same values.
_MATRIX_ROLES = ("embedding", "output", "dense", "expert", "compressor", "indexer")
Weights = Literal["quantized", "f16", "f32", "mxfp4", "quantized-values", "mxfp4-values"]
_PACKED = (Q.Q8_0, Q.MXFP4)


def _scaled_types(weights: Weights) -> dict[str, Q]:
    if weights.endswith("-values"):
        packed = _scaled_types(weights.removesuffix("-values"))
        return {role: Q.F32 if t in _PACKED else t for role, t in packed.items()}
    if weights == "quantized":
        return _SCALED_TYPES
    if weights == "mxfp4":
        return _SCALED_TYPES | dict.fromkeys(_MATRIX_ROLES, Q.F32) | {"expert": Q.MXFP4}
    if weights not in ("f16", "f32"):
        raise ValueError(f"weights must be 'quantized', 'f16', 'f32' or 'mxfp4', not {weights!r}")
    return _SCALED_TYPES | dict.fromkeys(_MATRIX_ROLES, Q.F16 if weights == "f16" else Q.F32)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to write: `shape` in ggml order (ne0 first), `role` picks its type."""

    name: str
    shape: tuple[int, ...]
    role: str


def tensor_specs(d: Dims, *, mtp: bool = False) -> Iterator[TensorSpec]:
    """Every tensor llama.cpp's deepseek4 loader creates, in its shapes; with `mtp` the MTP
    block after the trunk's layers too."""
    hc_dim, hc_mix = d.hc_mult * d.n_embd, (2 + d.hc_mult) * d.hc_mult
    yield TensorSpec("token_embd.weight", (d.n_embd, d.n_vocab), "embedding")
    yield TensorSpec("output_norm.weight", (d.n_embd,), "f32")
    yield TensorSpec("output.weight", (d.n_embd, d.n_vocab), "output")
    yield TensorSpec("output_hc_fn.weight", (hc_dim, d.hc_mult), "f32")
    yield TensorSpec("output_hc_base.weight", (d.hc_mult,), "f32")
    yield TensorSpec("output_hc_scale.weight", (1,), "f32")
    for il in range(d.n_layer + int(mtp)):
        b = f"blk.{il}."
        if il == d.n_layer:  # the MTP block: [enorm(embed); hnorm(h)] -> eh_proj -> block
            yield TensorSpec(b + "nextn.eh_proj.weight", (2 * d.n_embd, d.n_embd), "dense")
            yield TensorSpec(b + "nextn.enorm.weight", (d.n_embd,), "f32")
            yield TensorSpec(b + "nextn.hnorm.weight", (d.n_embd,), "f32")
            yield TensorSpec(b + "nextn.shared_head_norm.weight", (d.n_embd,), "f32")
        yield TensorSpec(b + "attn_norm.weight", (d.n_embd,), "f32")
        yield TensorSpec(b + "attn_sinks.weight", (d.n_head,), "f32")
        yield TensorSpec(b + "attn_q_a.weight", (d.n_embd, d.q_lora_rank), "dense")
        yield TensorSpec(b + "attn_q_a_norm.weight", (d.q_lora_rank,), "f32")
        yield TensorSpec(b + "attn_q_b.weight", (d.q_lora_rank, d.n_head * d.head_dim), "dense")
        yield TensorSpec(b + "attn_kv.weight", (d.n_embd, d.head_dim), "dense")
        yield TensorSpec(b + "attn_kv_a_norm.weight", (d.head_dim,), "f32")
        # stored 2-D; llama.cpp views it as [.., o_lora_rank, o_groups] (TENSOR_ALLOW_RESHAPE)
        o_a = (d.n_head * d.head_dim // d.o_groups, d.o_lora_rank * d.o_groups)
        yield TensorSpec(b + "attn_output_a.weight", o_a, "dense")
        yield TensorSpec(
            b + "attn_output_b.weight", (d.o_groups * d.o_lora_rank, d.n_embd), "dense"
        )
        for stage in ("attn", "ffn"):
            yield TensorSpec(b + f"hc_{stage}_fn.weight", (hc_dim, hc_mix), "f32")
            yield TensorSpec(b + f"hc_{stage}_base.weight", (hc_mix,), "f32")
            yield TensorSpec(b + f"hc_{stage}_scale.weight", (3,), "f32")
        ratio = d.compress_ratio(il) if il < d.n_layer else 0  # MTP: raw window only
        if ratio:
            width = (2 if ratio == 4 else 1) * d.head_dim  # 4:1 windows overlap: two halves
            yield TensorSpec(b + "attn_compressor_kv.weight", (d.n_embd, width), "compressor")
            yield TensorSpec(b + "attn_compressor_gate.weight", (d.n_embd, width), "compressor")
            yield TensorSpec(b + "attn_compressor_ape.weight", (width, ratio), "f32")
            yield TensorSpec(b + "attn_compressor_norm.weight", (d.head_dim,), "f32")
        if ratio == 4:
            iw = 2 * d.indexer_head_dim
            yield TensorSpec(b + "indexer.proj.weight", (d.n_embd, d.indexer_heads), "indexer")
            q_b = (d.q_lora_rank, d.indexer_heads * d.indexer_head_dim)
            yield TensorSpec(b + "indexer.attn_q_b.weight", q_b, "indexer")
            yield TensorSpec(b + "indexer_compressor_kv.weight", (d.n_embd, iw), "compressor")
            yield TensorSpec(b + "indexer_compressor_gate.weight", (d.n_embd, iw), "compressor")
            yield TensorSpec(b + "indexer_compressor_ape.weight", (iw, ratio), "f32")
            yield TensorSpec(b + "indexer_compressor_norm.weight", (d.indexer_head_dim,), "f32")
        yield TensorSpec(b + "ffn_gate_inp.weight", (d.n_embd, d.n_expert), "router")
        if il < d.hash_layers:
            yield TensorSpec(b + "ffn_gate_tid2eid.weight", (d.n_expert_used, d.n_vocab), "i32")
        else:
            yield TensorSpec(b + "exp_probs_b.bias", (d.n_expert,), "f32")
        yield TensorSpec(b + "ffn_norm.weight", (d.n_embd,), "f32")
        exps = (d.n_embd, d.n_ff_exp, d.n_expert)
        yield TensorSpec(b + "ffn_gate_exps.weight", exps, "expert")
        yield TensorSpec(b + "ffn_down_exps.weight", (d.n_ff_exp, d.n_embd, d.n_expert), "expert")
        yield TensorSpec(b + "ffn_up_exps.weight", exps, "expert")
        shared = d.n_ff_exp * d.n_expert_shared
        yield TensorSpec(b + "ffn_gate_shexp.weight", (d.n_embd, shared), "dense")
        yield TensorSpec(b + "ffn_down_shexp.weight", (shared, d.n_embd), "dense")
        yield TensorSpec(b + "ffn_up_shexp.weight", (d.n_embd, shared), "dense")


def _n_bytes(shape: tuple[int, ...], qtype: Q) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape, dtype=np.int64)) // block * size


def _byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte: llama.cpp's BPE needs all 256 as tokens."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = (b for b in range(256) if b not in printable)
    table = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(extra)}
    return [table[b] for b in range(256)]


def _vocabulary(n_vocab: int) -> tuple[list[str], list[int]]:
    """BOS, EOS, the 256 byte tokens, the merged tokens, then unused placeholders."""
    merged = [m.replace(" ", "") for m in _MERGES]
    tokens = [BOS, EOS, *_byte_level_alphabet(), *merged]
    if n_vocab < len(tokens):
        raise ValueError(f"n_vocab must be at least {len(tokens)} (byte tokens and merges)")
    types = [TokenType.CONTROL] * 2 + [TokenType.NORMAL] * (len(tokens) - 2)
    pad = n_vocab - len(tokens)
    tokens += [f"<｜place▁holder▁no▁{i}｜>" for i in range(pad)]
    types += [TokenType.UNUSED] * pad
    return tokens, [int(t) for t in types]


# How published files' metadata differ from llama.cpp's converter's (read from the files'
# headers as their publishers list them): antirez's say one MTP layer that the file does not
# hold, clamp the shared expert by the routed experts' values and name another pre-tokenizer;
# unsloth's add a ratio for the MTP block and the release's version.
Variant = Literal["llama.cpp", "antirez", "unsloth"]


def _add_metadata(
    w: GGUFWriter, d: Dims, mode: Mode, tokenizer_pre: str, mtp: bool, variant: Variant
) -> None:
    a = ARCH
    ratios = [d.compress_ratio(il) for il in range(d.n_layer)] + [0] * int(mtp)
    if variant == "unsloth" and not mtp:
        ratios.append(0)
    n_blocks = d.n_layer + int(mtp)
    if mode == "full":
        w.add_name("DeepSeek-V4-Flash-0731 (synthetic: real layout, no weights)")
        w.add_file_type(LlamaFileType.MOSTLY_MXFP4_MOE)
    else:
        w.add_name("DeepSeek-V4-Flash (synthetic: scaled layout, random weights)")
        w.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(2)
    w.add_uint32(f"{a}.context_length", d.n_ctx_train)
    w.add_uint32(f"{a}.embedding_length", d.n_embd)
    w.add_uint32(f"{a}.embedding_length_out", d.n_embd * d.hc_mult)
    w.add_uint32(f"{a}.block_count", n_blocks)
    if mtp or variant == "antirez":
        w.add_uint32(f"{a}.nextn_predict_layers", 1)
    if variant == "unsloth":
        w.add_string("general.base_model.version", "0731")
    w.add_uint32(f"{a}.attention.head_count", d.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", 1)
    w.add_uint32(f"{a}.attention.key_length", d.head_dim)
    w.add_uint32(f"{a}.attention.value_length", d.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{a}.attention.q_lora_rank", d.q_lora_rank)
    w.add_uint32(f"{a}.attention.sliding_window", d.sliding_window)
    w.add_uint32(f"{a}.attention.output_group_count", d.o_groups)
    w.add_uint32(f"{a}.attention.output_lora_rank", d.o_lora_rank)
    w.add_array(f"{a}.attention.compress_ratios", ratios)
    w.add_float32(f"{a}.attention.compress_rope_freq_base", 160_000.0)
    w.add_uint32(f"{a}.attention.indexer.head_count", d.indexer_heads)
    w.add_uint32(f"{a}.attention.indexer.key_length", d.indexer_head_dim)
    w.add_uint32(f"{a}.attention.indexer.top_k", d.indexer_top_k)
    w.add_uint32(f"{a}.rope.dimension_count", d.n_rot)
    w.add_float32(f"{a}.rope.freq_base", 10_000.0)
    w.add_string(f"{a}.rope.scaling.type", "yarn")
    w.add_float32(f"{a}.rope.scaling.factor", 16.0)
    w.add_uint32(f"{a}.rope.scaling.original_context_length", d.rope_yarn_orig_ctx)
    w.add_float32(f"{a}.rope.scaling.yarn_beta_fast", 32.0)
    w.add_float32(f"{a}.rope.scaling.yarn_beta_slow", 1.0)
    w.add_uint32(f"{a}.expert_count", d.n_expert)
    w.add_uint32(f"{a}.expert_used_count", d.n_expert_used)
    w.add_uint32(f"{a}.expert_shared_count", d.n_expert_shared)
    w.add_uint32(f"{a}.expert_feed_forward_length", d.n_ff_exp)
    w.add_float32(f"{a}.expert_weights_scale", 1.5)
    w.add_bool(f"{a}.expert_weights_norm", True)
    w.add_uint32(f"{a}.expert_gating_func", SQRT_SOFTPLUS)
    w.add_array(f"{a}.swiglu_clamp_exp", [10.0] * n_blocks)
    if variant != "antirez":
        w.add_array(f"{a}.swiglu_clamp_shexp", [10.0] * n_blocks)
    w.add_uint32(f"{a}.hash_layer_count", d.hash_layers)
    w.add_uint32(f"{a}.hyper_connection.count", d.hc_mult)
    w.add_uint32(f"{a}.hyper_connection.sinkhorn_iterations", 20)
    w.add_float32(f"{a}.hyper_connection.epsilon", 1e-6)
    tokens, types = _vocabulary(d.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("joyai-llm" if variant == "antirez" else tokenizer_pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(_MERGES))
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(True)


def _random_tensor(
    spec: TensorSpec, qtype: Q, d: Dims, rng: np.random.Generator, rounded: Q | None = None
) -> np.ndarray:
    """Weights that keep activations finite: unit norms, fan-in scaled matrices."""
    shape = tuple(reversed(spec.shape))  # numpy order
    if qtype == Q.I32:  # token -> experts table: distinct experts per token
        order = np.argsort(rng.random((d.n_vocab, d.n_expert)), axis=1)
        return order[:, : d.n_expert_used].astype(np.int32)
    if spec.name.endswith(("norm.weight", "_scale.weight")):
        data = np.ones(shape, np.float32)
    elif len(shape) == 1 or spec.name.endswith("ape.weight"):
        data = np.zeros(shape, np.float32)
    else:
        data = rng.standard_normal(shape, np.float32) / np.sqrt(spec.shape[0])
    if spec.name == "output.weight":
        data[:2] = 0  # BOS/EOS logits stay 0, below the best random one: greedy runs to the end
    if qtype in _PACKED:
        return quantize(data, qtype)
    if rounded is not None:  # the values a packed type would store, as floats
        data = dequantize(quantize(data, rounded), rounded)
    return data.astype(np.float16 if qtype == Q.F16 else np.float32)


def _write_sparse(writer: GGUFWriter, d: Dims, mtp: bool) -> None:
    """Header and tensor infos for real; the data region is only a length (a hole)."""
    for spec in tensor_specs(d, mtp=mtp):
        qtype = _FULL_TYPES[spec.role]
        numpy_shape = tuple(reversed(spec.shape))
        size = _n_bytes(spec.shape, qtype)
        writer.add_tensor_info(spec.name, numpy_shape, np.dtype(np.float32), size, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    (fout,) = writer.fout
    align = writer.data_alignment
    data_start = fout.tell() + (-fout.tell() % align)
    span = sum(ti.nbytes + (-ti.nbytes % align) for ti in writer.tensors[0].values())
    fout.truncate(data_start + span)


def _write_random(
    writer: GGUFWriter,
    d: Dims,
    rng: np.random.Generator,
    types: dict[str, Q],
    mtp: bool,
    rounded: dict[str, Q],
) -> None:
    for spec in tensor_specs(d, mtp=mtp):
        qtype = types[spec.role]
        data = _random_tensor(spec, qtype, d, rng, rounded.get(spec.role))
        writer.add_tensor(spec.name, data, raw_dtype=qtype if qtype in _PACKED else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()


def write_deepseek4(
    path: str | os.PathLike[str],
    *,
    mode: Mode,
    seed: int = 0,
    tokenizer_pre: str = "deepseek-v3",
    weights: Weights = "quantized",
    mtp: bool = False,
    variant: Variant = "llama.cpp",
    **dims: int,
) -> Path:
    """Write a deepseek4 GGUF at `path`; `dims` override fields of `Dims` for that mode.

    `tokenizer_pre` is DeepSeek's own pre-tokenizer by default; "gpt-2" splits text without
    std::regex, which a CUDA build of llama-cpp-python crashed in while loading the vocab.
    `weights` (scaled mode): "quantized" (Q8_0 experts and projections), every matrix in
    "f16"/"f32", "mxfp4" (f32 with MXFP4 routed experts), or the "-values" twin of
    "quantized" or "mxfp4" (the same numbers, packed tensors stored as F32). `variant`: whose
    metadata conventions the header follows (`Variant`). `mtp` appends the MTP block (the
    module docstring says how)."""
    if mode not in ("full", "scaled"):
        raise ValueError(f"mode must be 'full' or 'scaled', not {mode!r}")
    types = _scaled_types(weights)
    out = Path(path)
    d = dataclasses.replace(FLASH if mode == "full" else SCALED, **dims)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(out, ARCH)
    _add_metadata(writer, d, mode, tokenizer_pre, mtp, variant)
    if mode == "full":
        _write_sparse(writer, d, mtp)
    else:
        rounded = {}
        if weights.endswith("-values"):
            packed = _scaled_types(weights.removesuffix("-values"))
            rounded = {role: t for role, t in packed.items() if t in _PACKED}
        _write_random(writer, d, np.random.default_rng(seed), types, mtp, rounded)
    writer.close()
    return out


def flash_layout_text() -> str:
    """DeepSeek V4 Flash's layout as the catalog ships it (`resources/flash_layout.json`):
    the full-size replica's header, read from a temporary folder, without its vocabulary.

    One JSON row per tensor, so a change of layout reads as a diff.
    """
    with tempfile.TemporaryDirectory() as tmp:
        info = inspect_gguf(write_deepseek4(Path(tmp) / "flash.gguf", mode="full"))
    meta = {k: v for k, v in info.metadata.items() if not k.startswith("tokenizer.")}
    return layout_text(dataclasses.replace(info, metadata=meta).to_dict())


def layout_text(data: dict[str, object]) -> str:
    """`GGUFInfo.to_dict()` as JSON with a line per field, metadata key and tensor."""
    tensors, metadata = data.pop("tensors"), data.pop("metadata")
    assert isinstance(tensors, list) and isinstance(metadata, dict)
    meta = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in metadata.items())
    rows = ",\n".join(f"  {json.dumps(row)}" for row in tensors)
    fields = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items()]
    fields += [f' "metadata": {{\n{meta}\n }}', f' "tensors": [\n{rows}\n ]']
    return "{\n" + ",\n".join(fields) + "\n}\n"
