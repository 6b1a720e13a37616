"""What llama.cpp allocates on each device for a model, a context and a placement.

The offload planner can only promise "this fits" if its arithmetic agrees with llama.cpp's.
Three kinds of memory matter:

- **Weights**: exact, from the GGUF's tensor infos (`GGUFInfo.tensors`).
- **KV cache**: exact, from the model's metadata and the same formulas llama.cpp's caches use
  (`src/llama-kv-cache*.cpp`). DeepSeek V4 (`deepseek4`) keeps a raw sliding-window cache on
  every layer, compressed 4:1 caches plus lightning-indexer keys on the CSA layers, 128:1 caches
  on the HCA layers, and small f32 compressor states; standard models keep one K and one V row
  per layer and cell.
- **Compute buffer**: llama.cpp sizes it by reserving the worst-case graph and running its
  allocator over it, so it is not a closed formula: it steps and even dips as the context grows
  (allocator reuse). The model here is an *upper envelope* fitted to llama.cpp's own dry runs
  (`no_alloc`) of DeepSeek-V4-Flash: max-of-planes in the cache sizes, scaled so that it is never
  below any measured point, per backend kind (CPU build vs CUDA) and per role of the device.
  `COMPUTE_CALIBRATION` says where each number comes from; `measure_dry_run` re-measures on the
  machine at hand. A GPU that is the first device while expert weights stay in host memory also
  stages those weights for prefill (llama.cpp offloads host-weight matmuls of 32+ tokens to the
  first GPU), so its buffer holds two host expert tensors at once: `staging_bytes`.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from app.engine.gguf_info import GGUFInfo, TensorInfo

MIB = 1 << 20
GIB = 1 << 30

KV_TYPES = ("f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "f32")
_KV_GGML = {name: GGMLQuantizationType[name.upper()] for name in KV_TYPES}
# llama_context_params.type_k/type_v take the ggml_type enum values
KV_TYPE_IDS = {name: int(qtype) for name, qtype in _KV_GGML.items()}

ComputeRole = Literal[
    "cpu",  # the CPU backend of a CPU-only build
    "gpu",  # a GPU holding layers while some weights stay in host memory
    "gpu_first",  # the first GPU while weights stay in host memory: it stages them for prefill
    "gpu_all",  # a GPU when every weight is on a GPU
    "gpu_all_output",  # ... and it holds the output layer (adds the logits)
    "host",  # the host-side (CUDA_Host) buffer of a GPU build, weights in host memory
    "host_all",  # the host-side buffer when every weight is on a GPU
]

OP_OFFLOAD_MIN_BATCH = 32  # ggml-cuda's op_offload_min_batch_size: smaller batches stay on CPU
_DSV4_CSA, _DSV4_HCA = 4, 128
_NSEQ_FACTOR = 1.25  # compute at n_seq_max 2-4 measured +6..23% over n_seq_max 1 (one point)


def pad(value: int, to: int = 256) -> int:
    return -(-value // to) * to


def row_bytes(kv_type: str, n: int) -> int:
    """Bytes of one row of `n` elements in a KV type (ggml's block sizes, via gguf-py)."""
    block, size = GGML_QUANT_SIZES[_KV_GGML[kv_type]]
    if n % block:
        raise ValueError(f"a {kv_type} row needs a multiple of {block} elements, not {n}")
    return n // block * size


@dataclass(frozen=True)
class ContextShape:
    """The llama_context_params the memory depends on.

    `swa_full` None means the planner's choice: off for deepseek4 (its raw cache then holds the
    128-token window plus one micro-batch, and its memory cannot be cut mid-sequence anyway, so
    the full-size window buys nothing), on for other models, as Stoke's engine creates them.
    """

    n_ctx: int
    n_ubatch: int = 512
    kv_type: str = "f16"
    n_seq_max: int = 1
    kv_unified: bool = False  # LoadOptions.kv_unified: one pool of n_ctx, not a window each
    swa_full: bool | None = None
    flash_attn: bool = True

    def __post_init__(self) -> None:
        if self.kv_type not in KV_TYPES:
            raise ValueError(f"KV type must be one of {', '.join(KV_TYPES)}, not {self.kv_type!r}")
        if self.n_ctx < 1 or self.n_ubatch < 1 or self.n_seq_max < 1:
            raise ValueError("context, micro-batch and n_seq_max must be positive")

    def swa_full_for(self, info: GGUFInfo) -> bool:
        if self.swa_full is not None:
            return self.swa_full
        return info.architecture != "deepseek4"

    @property
    def kv_size(self) -> int:
        """Cells per stream, n_ctx padded to 256: Stoke's engine gives each resident
        conversation a stream of one window (or, unified, one pool of that size)."""
        return pad(self.n_ctx)

    @property
    def n_streams(self) -> int:
        return 1 if self.kv_unified else self.n_seq_max


# -- metadata -------------------------------------------------------------------------------


def _meta(info: GGUFInfo, key: str, default: object = None) -> object:
    return info.metadata.get(f"{info.architecture}.{key}", default)


def _per_layer(info: GGUFInfo, key: str, default: int) -> list[int]:
    value = _meta(info, key, default)
    n_layer = info.block_count or 0
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [int(v) for v in value][:n_layer]
    return [int(value)] * n_layer  # type: ignore[arg-type]


def _int(info: GGUFInfo, key: str, default: int | None = None) -> int:
    value = _meta(info, key, default)
    if value is None:
        raise ValueError(f"{info.path.name} has no {info.architecture}.{key}")
    return int(value)  # type: ignore[arg-type]


def is_dsv4(info: GGUFInfo) -> bool:
    return info.architecture == "deepseek4"


# -- KV cache -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVBreakdown:
    """KV bytes by cache, summed over layers, and per layer (what moves with a layer)."""

    by_cache: Mapping[str, int]
    by_layer: Mapping[int, int]

    @property
    def total(self) -> int:
        return sum(self.by_cache.values())


def _dsv4_kv(info: GGUFInfo, shape: ContextShape) -> KVBreakdown:
    """llama_kv_cache_dsv4: every cache keeps one stream per sequence (it ignores kv_unified)."""
    head = _int(info, "attention.key_length")
    n_head_kv = _per_layer(info, "attention.head_count_kv", 1)
    idx_head = _int(info, "attention.indexer.key_length")
    n_swa = _int(info, "attention.sliding_window")
    ratios = _per_layer(info, "attention.compress_ratios", 0)
    streams = shape.n_seq_max
    kv_size = shape.kv_size
    raw_cells = kv_size if shape.swa_full_for(info) else min(kv_size, pad(n_swa + shape.n_ubatch))
    comp = {
        _DSV4_CSA: pad(max(1, math.ceil(kv_size / _DSV4_CSA))),
        _DSV4_HCA: pad(max(1, math.ceil(kv_size / _DSV4_HCA))),
    }
    f32 = 4
    by_cache: dict[str, int] = {"raw": 0, "csa": 0, "hca": 0, "indexer": 0, "state": 0}
    by_layer: dict[int, int] = {}
    for il, ratio in enumerate(ratios):
        row = row_bytes(shape.kv_type, head * n_head_kv[il])
        parts = {"raw": streams * raw_cells * row}
        if ratio == _DSV4_CSA:
            parts["csa"] = streams * comp[ratio] * row
            parts["indexer"] = streams * comp[ratio] * row_bytes(shape.kv_type, idx_head)
            # compressor states: kv + score planes, f32, (2*width) x (2*ratio) per stream
            parts["state"] = 2 * f32 * streams * (2 * head * 2 * ratio + 2 * idx_head * 2 * ratio)
        elif ratio == _DSV4_HCA:
            parts["hca"] = streams * comp[ratio] * row
            parts["state"] = 2 * f32 * streams * head * ratio
        by_layer[il] = sum(parts.values())
        for name, size in parts.items():
            by_cache[name] += size
    return KVBreakdown(by_cache, by_layer)


def _standard_kv(info: GGUFInfo, shape: ContextShape) -> KVBreakdown:
    """n_layer x cells x n_head_kv x (k + v) x element size; MLA models keep one compressed
    row (kv_lora_rank + rope dims) per cell, which flash attention also reads as V."""
    n_layer = info.block_count or 0
    cells = shape.kv_size * shape.n_streams
    lora = _meta(info, "attention.kv_lora_rank")
    by_layer: dict[int, int] = {}
    if lora:
        width = int(lora) + _int(info, "rope.dimension_count", 64)  # type: ignore[arg-type]
        for il in range(n_layer):
            by_layer[il] = cells * row_bytes(shape.kv_type, width)
        return KVBreakdown({"k": sum(by_layer.values())}, by_layer)
    n_head = _per_layer(info, "attention.head_count", 1)
    n_head_kv = _per_layer(info, "attention.head_count_kv", 0)
    embd = info.embedding_length or 0
    k_len = _meta(info, "attention.key_length")
    v_len = _meta(info, "attention.value_length")
    k_tot = v_tot = 0
    for il in range(n_layer):
        heads_kv = n_head_kv[il] or n_head[il]
        k_dim = int(k_len) if k_len else embd // max(n_head[il], 1)  # type: ignore[arg-type]
        v_dim = int(v_len) if v_len else k_dim  # type: ignore[arg-type]
        k = cells * row_bytes(shape.kv_type, heads_kv * k_dim)
        v = cells * row_bytes(shape.kv_type, heads_kv * v_dim)
        by_layer[il] = k + v
        k_tot += k
        v_tot += v
    return KVBreakdown({"k": k_tot, "v": v_tot}, by_layer)


def kv_cache(info: GGUFInfo, shape: ContextShape) -> KVBreakdown:
    """KV bytes of the whole model for this context, by cache and by layer."""
    return _dsv4_kv(info, shape) if is_dsv4(info) else _standard_kv(info, shape)


# -- compute buffers ------------------------------------------------------------------------

# DeepSeek-V4-Flash, CPU build of llama-cpp-python 0.3.36, flash attention, n_seq_max 1:
# per micro-batch, planes (MiB per raw cell, MiB per CSA cell, MiB); the buffer is their max.
# Fitted as an upper envelope of 250 dry runs (ctx 4,096-1,048,576 x ubatch 256-4,096 x
# swa_full on/off): mean over-prediction 3.4-4.6% by micro-batch, never below a measured point.
_CPU_PLANES: dict[int, tuple[tuple[float, float, float], ...]] = {
    256: ((0.00194957, 0.00385268, 92.135), (-0.000260796, 0.000747052, 148.551),
          (0.00248928, 0.00062232, 119.509)),
    512: ((0.00442074, 0.0011053, 154.336), (-0.00867328, 0.00151765, 302.583),
          (0.0025046, 0.00588237, 252.033)),
    1024: ((0.00507473, 0.0120818, 333.513), (-0.0180264, 0.00643668, 604.37),
           (0.00621966, 0.00155491, 505.525)),
    2048: ((-0.0563978, 0.013103, 1291.94), (0.00991347, 0.00247837, 1022.91),
           (0.00898473, 0.0219854, 827.539)),
    4096: ((0.0118152, 0.0393433, 2019.12), (0.0257117, 0.00642792, 1584.06),
           (-0.00300767, 0.0223525, 2348.55)),
}  # fmt: skip

# CUDA build (2x H200), same model and settings: planes over (ubatch x raw cells,
# ubatch x CSA cells, ubatch, 1) in MiB, fitted as upper envelopes of the dry runs in
# CUDA_POINTS below (two of them confirmed by a real allocation, equal to the byte).
_CUDA_PLANES: dict[str, tuple[tuple[float, float, float, float], ...]] = {
    "gpu": ((4.73122e-06, 2.18685e-06, 0.591386, 6.29869),
            (5.11928e-06, 1.25493e-05, 0.138228, 108.906)),
    "gpu_all": ((9.1123e-06, 1.86585e-05, 0.531441, 3.37569),
                (1.09644e-05, 2.31427e-05, 0.250152, 109.298)),
    "gpu_all_output": ((9.85438e-06, 1.55328e-05, 0.509878, 4.92195),
                       (1.08746e-05, 2.27629e-05, 0.229756, 116.537)),
    "host": ((1.90627e-06, 3.87298e-06, 0.0316806, 0.0589086),),
    "host_all": ((7.62513e-06, 1.54919e-05, 0.0798451, 0.246784),),
}  # fmt: skip
# The first GPU with host experts: max(staging + floor(ubatch), "gpu" + _FIRST_DELTA_MIB).
_FIRST_FLOOR_MIB = {512: 173.01, 1024: 17.0, 2048: 34.0, 4096: 458.06}
_FIRST_DELTA_MIB = 285.7
_CALIBRATION_STAGING_MIB = 2176.0  # two MXFP4 expert tensors of DeepSeek-V4-Flash

# CUDA dry runs of the full DeepSeek-V4-Flash replica on 2x H200 (llama-cpp-python 0.3.36,
# flash attention, f16 KV, n_seq_max 1, tensor split 1,1: 22 layers each, the output layer on
# CUDA1). Key (ctx, ubatch, swa_full); values in MiB: with every expert tensor in host memory
# (`_exps\.=CPU`): CUDA0 (first GPU), CUDA1 (the larger of: no experts / 9 expert layers on it),
# CUDA_Host; with every tensor on the GPUs: CUDA0, CUDA1 (output layer), CUDA_Host.
CUDA_POINTS: dict[tuple[int, int, bool], tuple[float, float, float, float, float, float]] = {
    (8192, 512, False): (2184.5, 292.5, 21.09, 289.41, 536.87, 60.37),
    (65536, 512, False): (2285.76, 326.84, 49.34, 434.41, 681.87, 173.37),
    (131072, 512, False): (2184.5, 392.14, 81.84, 629.16, 845.62, 303.37),
    (262144, 512, False): (2184.5, 553.09, 146.84, 953.91, 1178.37, 563.37),
    (376832, 512, False): (2184.5, 786.84, 203.84, 1357.91, 1582.37, 791.37),
    (524288, 512, False): (2184.5, 1003.84, 276.84, 1793.91, 2018.37, 1083.37),
    (8192, 1024, False): (2193.0, 585.0, 43.12, 582.55, 1077.47, 124.48),
    (65536, 1024, False): (2193.0, 654.61, 99.62, 872.55, 1305.47, 350.48),
    (131072, 1024, False): (2193.0, 655.71, 164.62, 1132.55, 1581.47, 610.48),
    (262144, 1024, False): (2193.0, 1044.21, 294.62, 1911.05, 2359.97, 1130.48),
    (376832, 1024, False): (2193.0, 1390.11, 408.62, 2535.05, 2983.97, 1586.48),
    (524288, 1024, False): (2193.0, 1881.36, 554.62, 3464.3, 3913.22, 2170.48),
    (8192, 2048, False): (2210.0, 1170.01, 90.18, 1180.84, 2170.68, 264.71),
    (65536, 2048, False): (2210.0, 1313.16, 203.18, 1760.84, 2626.68, 716.71),
    (131072, 2048, False): (2210.0, 1315.35, 333.18, 2280.84, 3146.68, 1236.71),
    (262144, 2048, False): (2210.0, 2088.15, 593.18, 3713.68, 4611.68, 2276.71),
    (376832, 2048, False): (2877.03, 2788.16, 821.18, 5089.84, 5987.68, 3188.71),
    (524288, 2048, False): (3453.03, 3512.16, 1113.18, 6689.84, 7587.68, 4356.71),
    (8192, 4096, False): (2378.06, 2340.02, 196.29, 2425.42, 4405.11, 593.17),
    (65536, 4096, False): (2506.06, 2642.26, 422.29, 3585.42, 5317.11, 1497.17),
    (131072, 4096, False): (2634.06, 2424.64, 682.29, 4403.42, 6349.11, 2537.17),
    (262144, 4096, False): (3820.06, 3968.26, 1202.29, 7507.11, 9303.11, 4617.17),
    (376832, 4096, False): (5452.06, 5608.26, 1658.29, 10259.42, 12055.11, 6441.17),
    (524288, 4096, False): (6892.06, 7056.26, 2242.29, 13459.42, 15255.11, 8777.17),
    (65536, 512, True): (2349.01, 486.09, 112.59, 799.37, 1023.87, 426.37),
    (262144, 512, True): (2184.5, 1287.64, 402.09, 2485.41, 2709.87, 1584.37),
    (65536, 2048, True): (2210.0, 1750.15, 450.18, 2940.68, 3902.68, 1704.71),
    (262144, 2048, True): (4468.03, 4190.35, 1608.18, 9044.68, 9878.68, 6336.71),
}

COMPUTE_CALIBRATION: dict[str, str] = {
    "cpu": "250 CPU dry runs of DeepSeek-V4-Flash (llama-cpp-python 0.3.36): ctx 4,096-"
    "1,048,576, ubatch 256-4,096, swa_full on/off; upper envelope, mean +3.4..4.6%",
    "gpu": "28 CUDA dry runs on 2x H200 (CUDA_POINTS): ctx 8,192-524,288, ubatch 512-4,096; "
    "upper envelope, mean +4.6%",
    "gpu_first": "the same 28 runs, first GPU staging two host expert tensors; mean +6.7%",
    "gpu_all": "the same grid with every tensor on the GPUs; mean +2.1%",
    "gpu_all_output": "the same grid, the GPU with the output layer (logits added); mean +1.6%",
    "host": "CUDA_Host buffer of the same runs; within 0.4%",
    "host_all": "CUDA_Host buffer with every tensor on the GPUs; within 0.4%",
    "measured": "llama.cpp's own dry run (no_alloc) of this plan on this machine",
    "uncalibrated": "no llama.cpp measurement for this model or backend: a structural estimate",
}


def _cells(info: GGUFInfo, shape: ContextShape) -> tuple[int, int]:
    """(raw cells, CSA cells) the deepseek4 graph attends over, per stream."""
    n_swa = _int(info, "attention.sliding_window", 128)
    kv_size = shape.kv_size
    raw = kv_size if shape.swa_full_for(info) else min(kv_size, pad(n_swa + shape.n_ubatch))
    return raw, pad(max(1, math.ceil(kv_size / _DSV4_CSA)))


def _interpolate(table: Mapping[int, float], ub: int) -> float:
    """A per-micro-batch value at any micro-batch: linear between calibrated ones, scaled in
    proportion outside them (compute grows with the tokens of a micro-batch)."""
    keys = sorted(table)
    if ub <= keys[0]:
        return table[keys[0]] * ub / keys[0]
    if ub >= keys[-1]:
        return table[keys[-1]] * ub / keys[-1]
    hi = next(k for k in keys if k >= ub)
    lo = max(k for k in keys if k <= ub)
    if hi == lo:
        return table[lo]
    return table[lo] + (table[hi] - table[lo]) * (ub - lo) / (hi - lo)


def _cpu_mib(raw: int, csa: int, ub: int) -> float:
    values = {
        k: max(a * raw + b * csa + c for a, b, c in planes) for k, planes in _CPU_PLANES.items()
    }
    return _interpolate(values, ub)


def _cuda_mib(role: str, raw: int, csa: int, ub: int) -> float:
    return max(a * ub * raw + b * ub * csa + c * ub + d for a, b, c, d in _CUDA_PLANES[role])


def dsv4_calibrated(info: GGUFInfo) -> bool:
    """The fitted planes are DeepSeek-V4-Flash's: other deepseek4 sizes get the structural
    estimate instead of numbers that were never measured."""
    return (
        is_dsv4(info)
        and info.embedding_length == 4096
        and _meta(info, "attention.head_count") == 64
        and _meta(info, "attention.key_length") == 512
        and (info.vocab_size or 0) <= 160_000
    )


def compute_bytes(
    info: GGUFInfo,
    shape: ContextShape,
    role: ComputeRole,
    *,
    backend: str = "cuda",
    staging: int = 0,
) -> tuple[int, str]:
    """Predicted compute buffer of one device in bytes, and which calibration it rests on.

    `backend` is the GPU backend kind ("cuda" is calibrated; Metal, ROCm and Vulkan reuse the
    CUDA numbers and say so). `staging` is `staging_bytes(...)` for role "gpu_first".
    """
    if is_dsv4(info) and not shape.flash_attn:
        raise ValueError(
            "deepseek4 plans need flash attention: without it llama.cpp's compute buffer is "
            "3-20x larger (1,564 MiB instead of 271 at 8k context on CPU)"
        )
    ub = shape.n_ubatch
    if not dsv4_calibrated(info):
        return _structural_compute(info, shape, role, staging), "uncalibrated"
    raw, csa = _cells(info, shape)
    if role == "cpu":
        mib, source = _cpu_mib(raw, csa, ub), "cpu"
    elif role == "gpu_first":
        floor = _interpolate(_FIRST_FLOOR_MIB, max(ub, min(_FIRST_FLOOR_MIB)))
        attention = _cuda_mib("gpu", raw, csa, ub) + _FIRST_DELTA_MIB
        mib, source = max(staging / MIB + floor, attention), "gpu_first"
    else:
        mib, source = _cuda_mib(role, raw, csa, ub), role
        if role == "gpu_all_output":
            mib += ub * (info.vocab_size or 0) * 4 / MIB  # the logits of a full micro-batch
    if shape.n_seq_max > 1:
        mib *= _NSEQ_FACTOR
    if role != "cpu" and backend != "cuda":
        source = "uncalibrated"
    return math.ceil(mib * MIB), source


def _structural_compute(
    info: GGUFInfo, shape: ContextShape, role: ComputeRole, staging: int
) -> int:
    """For models no dry run calibrated: the largest activations of one micro-batch (logits,
    FFN, attention scores over the context), the staged weights on the first GPU, doubled for
    what the allocator keeps alive around them. An estimate; plans built on it say so."""
    ub = shape.n_ubatch
    embd = info.embedding_length or 4096
    n_head = max(_per_layer(info, "attention.head_count", 32) or [32])
    n_ff = int(_meta(info, "feed_forward_length", 4 * embd) or 4 * embd)  # type: ignore[arg-type]
    n_ff = max(n_ff, int(_meta(info, "expert_feed_forward_length", 0) or 0) * 8)  # type: ignore[arg-type]
    cells = shape.kv_size  # one stream's: a micro-batch attends over its own sequence's
    attention = ub * cells * (2 if shape.flash_attn else 4 * n_head)
    activations = ub * 4 * (6 * embd + 3 * n_ff)
    logits = ub * (info.vocab_size or 32_000) * 4
    if role in ("host", "host_all"):
        return int(ub * cells * 2 + ub * 4 * 4 * embd)
    total = 2 * max(attention + activations, logits)
    if role == "gpu_first":
        total += staging
    return int(total * (_NSEQ_FACTOR if shape.n_seq_max > 1 else 1))


def staging_bytes(host_experts: Iterable[TensorInfo]) -> int:
    """Host-memory weights the first GPU copies in for a prefill micro-batch: the two largest
    expert tensors of one layer left in host memory (gate and up are staged together)."""
    by_layer: dict[int, list[int]] = {}
    for t in host_experts:
        by_layer.setdefault(t.layer if t.layer is not None else -1, []).append(t.n_bytes)
    return max((sum(sorted(sizes, reverse=True)[:2]) for sizes in by_layer.values()), default=0)


# -- measuring what llama.cpp allocates -------------------------------------------------------

_COMPUTE_RE = re.compile(r"(\S+) compute buffer size = +([\d.]+) MiB")
_LAYER_DEV_RE = re.compile(r"(?:llama_kv_cache|llama_dsv4_comp_state): layer +\d+: dev = (\S+)")
_KV_SIZE_RE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers")
_STATE_RE = re.compile(r"llama_dsv4_comp_state: (\w+) ratio = .*layers = (\d+), size = +([\d.]+)")
_ASSIGN_RE = re.compile(r"layer +(\d+) assigned to device (\S+),")
_OVERRIDE_RE = re.compile(r"tensor (\S+) \((\d+) MiB (\S+)\) buffer type overridden to (\S+)")
_MODEL_BUF_RE = re.compile(r"load_tensors: +(\S+) model buffer size = +([\d.]+) MiB")


def parse_load_log(text: str) -> dict[str, object]:
    """Per-device buffer sizes llama.cpp printed while loading a model and creating a context.

    KV buffers print as 0 in a dry run, so KV per device comes from each cache's total and the
    device each of its layers went to (the log lists both).
    """
    kv: dict[str, float] = {}
    caches: list[dict[str, object]] = []
    devs: list[str] = []
    for line in text.splitlines():
        if m := _LAYER_DEV_RE.search(line):
            devs.append(m[1])
            continue
        size = layers = None
        if m := _KV_SIZE_RE.search(line):
            size, layers = float(m[1]), int(m[3])
            caches.append({"mib": size, "cells": int(m[2]), "layers": layers})
        elif m := _STATE_RE.search(line):
            size, layers = float(m[3]), int(m[2])
            caches.append({"mib": size, "state": m[1], "layers": layers})
        if size is not None and layers:
            for dev in devs[-layers:]:
                kv[dev] = kv.get(dev, 0.0) + size / layers
        if size is not None:
            devs = []
    return {
        "compute": {m[0]: round(float(m[1]) * MIB) for m in _COMPUTE_RE.findall(text)},
        "kv": {dev: round(mib * MIB) for dev, mib in kv.items()},
        "kv_caches": caches,
        "model": {m[0]: round(float(m[1]) * MIB) for m in _MODEL_BUF_RE.findall(text)},
        "layer_device": {int(m[0]): m[1] for m in _ASSIGN_RE.findall(text)},
        "overridden": {m[0]: m[3] for m in _OVERRIDE_RE.findall(text)},
    }


def measure_dry_run(
    path: str | Path,
    n_ctx: int,
    n_ubatch: int,
    flash_attn: bool = True,
    *,
    kv_type: str = "f16",
    n_seq_max: int = 1,
    swa_full: bool = True,
    kv_offload: bool = True,
    overrides: Sequence[tuple[str, str]] = (),
    tensor_split: Sequence[float] | None = None,
    n_gpu_layers: int = 999,
) -> dict[str, object]:
    """Ask llama.cpp itself what it would allocate: a `no_alloc` load and context (no weights
    read, no buffers allocated; a fraction of a second even for a 150 GB model), its log
    parsed into per-device bytes (`parse_load_log`). The planner's numbers are checked
    against this; on the machine that will run the model it is the ground truth.
    """
    import llama_cpp

    from app.engine.llamacpp.backend import _install_log, keeps_own_streams
    from app.engine.llamacpp.overrides import apply_overrides

    log = _install_log()
    kept = log.lines
    log.lines = deque()  # the whole log this time, not the last few lines
    try:
        mparams = llama_cpp.llama_model_default_params()
        mparams.no_alloc = True
        mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
        mparams.n_gpu_layers = n_gpu_layers
        mparams.use_extra_bufts = False
        mparams.no_host = True
        keepalive = apply_overrides(mparams, overrides, tensor_split=tensor_split)
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise RuntimeError(f"llama.cpp could not read {path}: {log.reason()}")
        try:
            cparams = llama_cpp.llama_context_default_params()
            shared = keeps_own_streams(model)  # the layout Stoke's engine gives it
            cparams.n_ctx = n_ctx if shared else n_ctx * n_seq_max
            cparams.n_batch = max(n_ubatch, 512)
            cparams.n_ubatch = n_ubatch
            cparams.n_seq_max = n_seq_max
            cparams.kv_unified = shared
            cparams.swa_full = swa_full
            cparams.offload_kqv = kv_offload
            cparams.type_k = cparams.type_v = KV_TYPE_IDS[kv_type]
            cparams.flash_attn_type = (
                llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
                if flash_attn
                else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
            ctx = llama_cpp.llama_init_from_model(model, cparams)
            if not ctx:
                raise RuntimeError(f"llama.cpp could not plan the context: {log.reason()}")
            llama_cpp.llama_free(ctx)
        finally:
            llama_cpp.llama_model_free(model)
        del keepalive
        result = parse_load_log("".join(log.lines))
    finally:
        log.lines = kept
    return result
