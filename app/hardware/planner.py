"""The expert-offload planner: which tensors go to which GPU, and which stay in RAM.

A mixture-of-experts model bigger than the GPUs runs well when everything that every token
uses (attention, shared experts, dense FFN, norms, output) sits on GPUs and the routed
experts fill whatever GPU memory is left, the rest in system RAM. People do this by hand with
llama.cpp `-ot` regexes and by watching VRAM; llama.cpp's own `--fit` gives up once any
override is set and never trades the micro-batch against expert room. This module does the
arithmetic with the memory model of `memory.py` (weights exact, KV exact, compute buffers
calibrated against llama.cpp's dry runs) and writes the result as the override list, tensor
split and llama-server command line that reproduce it.

How a plan is built, for one micro-batch:
1. Layers (and the output layer) are split over the GPUs in contiguous ranges, like
   llama.cpp's `tensor_split`, in proportion to what each GPU has left after its compute
   buffer; each layer's KV cache lives with the layer; token_embd stays in RAM, as llama.cpp
   keeps input embeddings on the CPU.
2. Expert tensors fill the remaining room: whole layers on the GPU that holds the layer first
   (no activations cross devices), then whole layers on any GPU, then single tensors
   (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps` one by one). What is left stays in RAM.
3. The first GPU stages host-memory experts for prefill, so its compute buffer depends on what
   stayed in RAM: it is recomputed from the final placement, which only ever lowers it.
A plan is never over a budget by its own model: each budget is first cut by the margin
(a fraction) and by what the GPU runtime keeps for itself (0.5% of the device, at least
256 MiB: `GPU_RESERVE`).
"""

from __future__ import annotations

import math
import re
import shlex
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from app.engine.gguf_info import GGUFInfo, TensorInfo
from app.hardware.detect import GpuInfo
from app.hardware.memory import (
    COMPUTE_CALIBRATION,
    GIB,
    MIB,
    OP_OFFLOAD_MIN_BATCH,
    ComputeRole,
    ContextShape,
    compute_bytes,
    is_dsv4,
    kv_cache,
    measure_dry_run,
    staging_bytes,
)

Profile = Literal["balanced", "prefill-heavy", "decode-heavy"]
PROFILES: tuple[Profile, ...] = ("balanced", "prefill-heavy", "decode-heavy")
# What the GPU runtime itself keeps beside llama.cpp's buffers (context, kernels, cuBLAS
# workspaces): 715-718 MiB per H200 (141 GiB, CUDA 13) after a prefill, 0.5% of the device;
# smaller cards have fewer SMs and smaller contexts, so the floor is 256 MiB.
GPU_RESERVE = 256 * MIB
GPU_RESERVE_FRACTION = 0.005
_INPUT_PREFIXES = ("token_embd.", "position_embd.", "token_types.", "per_layer_token_embd.")
_UBATCHES: dict[str, tuple[int, ...]] = {
    "prefill-heavy": (4096, 2048, 1024, 512),
    "balanced": (2048, 1024, 512),
    "decode-heavy": (512,),
}


@dataclass(frozen=True)
class DeviceBudget:
    """A GPU as llama.cpp names it ("CUDA0"), and the bytes a plan may use on it (its free
    memory, before the margin). Order matters: it is llama.cpp's device order."""

    name: str
    budget: int
    backend: str = "cuda"
    description: str = ""
    # (micro-batch, bytes): this device's compute buffer as llama.cpp's own dry run of a plan
    # measured it on this machine (`refine`); used instead of the calibrated envelope.
    measured_compute: tuple[tuple[int, int], ...] = ()
    total: int | None = None  # the device's whole memory, when known (sizes the reserve)
    runtime: int | None = None  # the GPU runtime's own bytes, where measured on this machine

    @classmethod
    def of(cls, gpu: GpuInfo) -> DeviceBudget:
        """A detected GPU, its free memory as the budget."""
        return cls(gpu.name, gpu.memory_free, gpu.backend, gpu.description, total=gpu.memory_total)

    @property
    def reserve(self) -> int:
        """Bytes the GPU runtime takes beside llama.cpp's buffers (see GPU_RESERVE)."""
        if self.runtime is not None:
            return self.runtime
        return max(GPU_RESERVE, int((self.total or self.budget) * GPU_RESERVE_FRACTION))


@dataclass(frozen=True)
class DevicePlan:
    """Predicted bytes on one device ("CPU" is system RAM) and the experts it holds."""

    name: str
    weights: int
    kv: int
    compute: int
    budget: int  # after the margin
    layers: tuple[int, int] | None  # first and last layer held; the output layer is n_layer
    expert_layers_full: tuple[int, ...]
    expert_layers_partial: tuple[tuple[int, tuple[str, ...]], ...]
    compute_source: str

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    @property
    def free(self) -> int:
        return self.budget - self.total


@dataclass(frozen=True)
class Plan:
    """A placement, what it costs per device, and how to load it (Stoke or llama-server)."""

    model: str
    architecture: str
    n_layer: int
    n_ctx: int
    n_ubatch: int
    n_batch: int
    kv_type: str
    n_seq_max: int
    flash_attn: bool
    swa_full: bool
    kv_offload: bool
    profile: str
    margin: float
    devices: tuple[DevicePlan, ...]  # the GPUs in llama.cpp's order, then "CPU"
    overrides: tuple[tuple[str, str], ...]  # (regex, buffer type), first match wins
    tensor_split: tuple[float, ...]
    n_gpu_layers: int
    command: str
    fits: bool
    minimum: str | None  # what would make it fit, when it does not
    expert_bytes_gpu: int
    expert_bytes_total: int
    expert_layer_bytes: int
    warnings: tuple[str, ...] = ()
    calibrated_points: dict[str, str] = field(default_factory=dict)

    @property
    def expert_layers_on_gpu(self) -> float:
        """Expert bytes on GPUs, in layers' worth (partial layers count by their bytes)."""
        return self.expert_bytes_gpu / self.expert_layer_bytes if self.expert_layer_bytes else 0.0

    def device(self, name: str) -> DevicePlan:
        return next(d for d in self.devices if d.name == name)


# -- the model's pieces -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Group:
    """All tensors of one expert kind in one layer (`blk.7.ffn_up_exps.weight` and any bias):
    the unit the planner moves."""

    layer: int
    base: str  # "ffn_up_exps"
    tensors: tuple[TensorInfo, ...]

    @property
    def n_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)


@dataclass
class _Pieces:
    """Bytes of a model for one context shape: per unit (layer; unit n_layer is the output),
    token_embd, expert groups."""

    n_units: int
    weights: list[int]  # non-expert bytes per unit
    kv: list[int]
    input_bytes: int
    groups: dict[int, list[_Group]]  # by layer

    @property
    def expert_total(self) -> int:
        return sum(g.n_bytes for gs in self.groups.values() for g in gs)


def _pieces(info: GGUFInfo, shape: ContextShape) -> _Pieces:
    n_layer = info.block_count or 0
    weights = [0] * (n_layer + 1)
    input_bytes = 0
    grouped: dict[tuple[int, str], list[TensorInfo]] = defaultdict(list)
    for t in info.tensors:
        if t.name.startswith(_INPUT_PREFIXES):
            input_bytes += t.n_bytes
        elif t.kind == "expert" and t.layer is not None:
            base = t.name.split(".")[2]
            grouped[(t.layer, base)].append(t)
        else:
            weights[t.layer if t.layer is not None and t.layer < n_layer else n_layer] += t.n_bytes
    groups: dict[int, list[_Group]] = defaultdict(list)
    for (layer, base), tensors in sorted(grouped.items()):
        groups[layer].append(_Group(layer, base, tuple(tensors)))
    kv_layers = kv_cache(info, shape).by_layer
    kv = [kv_layers.get(u, 0) for u in range(n_layer + 1)]
    return _Pieces(n_layer + 1, weights, kv, input_bytes, dict(groups))


# -- one placement ----------------------------------------------------------------------------


@dataclass
class _Layout:
    """A candidate placement for one micro-batch and its predicted bytes."""

    shape: ContextShape
    counts: list[int]  # units per GPU, in order
    gpu_groups: list[list[_Group]]  # expert groups placed on each GPU
    host_groups: list[_Group]
    weights: list[int]
    kv: list[int]
    compute: list[int]
    sources: list[str]
    capacity: list[int]  # per GPU, after the margin
    ram_weights: int
    ram_kv: int
    ram_compute: int
    ram_source: str
    ram_capacity: int
    all_on_gpu: bool

    @property
    def gpu_totals(self) -> list[int]:
        return [w + k + c for w, k, c in zip(self.weights, self.kv, self.compute, strict=True)]

    @property
    def ram_total(self) -> int:
        return self.ram_weights + self.ram_kv + self.ram_compute

    @property
    def gpu_over(self) -> int:
        return sum(max(0, t - c) for t, c in zip(self.gpu_totals, self.capacity, strict=True))

    @property
    def ram_over(self) -> int:
        return max(0, self.ram_total - self.ram_capacity)

    @property
    def fits(self) -> bool:
        return self.gpu_over == 0 and self.ram_over == 0

    @property
    def expert_gpu(self) -> int:
        return sum(g.n_bytes for gs in self.gpu_groups for g in gs)


def _ranges(counts: Sequence[int]) -> list[range]:
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return out


def _split(loads: Sequence[int], caps: Sequence[int]) -> list[int] | None:
    """Contiguous units per device in proportion to capacity, every device within it; None
    when no contiguous split fits. Proportional first (even slack for experts), then greedy."""
    n, total_cap = len(loads), sum(max(c, 0) for c in caps)
    if not caps:
        return None
    if total_cap <= 0:
        return None
    total = sum(loads)
    counts, start, acc, cum_cap = [], 0, 0, 0
    for i, cap in enumerate(caps):
        cum_cap += max(cap, 0)
        target = total * cum_cap / total_cap
        end = start
        while end < n and (i == len(caps) - 1 or acc + loads[end] / 2 <= target):
            acc += loads[end]
            end += 1
        counts.append(end - start)
        start = end
    if all(sum(loads[r.start : r.stop]) <= c for r, c in zip(_ranges(counts), caps, strict=True)):
        return counts
    counts, start = [], 0  # greedy: fill each device in turn
    for cap in caps:
        end, used = start, 0
        while end < n and used + loads[end] <= cap:
            used += loads[end]
            end += 1
        counts.append(end - start)
        start = end
    return counts if start == n else None


def _compute(
    info: GGUFInfo,
    shape: ContextShape,
    gpus: Sequence[DeviceBudget],
    counts: Sequence[int],
    host: Sequence[_Group],
) -> tuple[list[int], list[str], int, str]:
    """Compute buffers per GPU and in RAM for a placement (roles from what stays in RAM)."""
    host_weights = bool(host)
    output_gpu = max((i for i, c in enumerate(counts) if c), default=len(gpus) - 1)
    stage = host_weights and shape.n_ubatch >= OP_OFFLOAD_MIN_BATCH
    staged = staging_bytes(t for g in host for t in g.tensors) if stage else 0
    sizes, sources = [], []
    for i, gpu in enumerate(gpus):
        role: ComputeRole
        if host_weights:
            role = "gpu_first" if i == 0 and stage else "gpu"
        else:
            role = "gpu_all_output" if i == output_gpu else "gpu_all"
        size, source = compute_bytes(info, shape, role, backend=gpu.backend, staging=staged)
        measured = dict(gpu.measured_compute).get(shape.n_ubatch)
        if host_weights and measured is not None:  # measured with experts in RAM, as here
            size, source = measured, "measured"
        sizes.append(size)
        sources.append(source)
    host_role: ComputeRole = "host" if host_weights else "host_all"
    host_size, host_source = compute_bytes(info, shape, host_role)
    return sizes, sources, host_size, host_source


def _layout(
    info: GGUFInfo,
    pieces: _Pieces,
    shape: ContextShape,
    gpus: Sequence[DeviceBudget],
    caps: Sequence[int],
    ram_cap: int,
    kv_offload: bool,
) -> _Layout:
    """The best placement for this micro-batch: everything on the GPUs if that fits, else
    non-expert layers on the GPUs and experts packed into what is left."""
    all_groups = [g for layer in sorted(pieces.groups) for g in pieces.groups[layer]]
    out_buffer = (info.vocab_size or 0) * 4 * shape.n_seq_max  # logits of the last token
    kv_units = pieces.kv if kv_offload else [0] * pieces.n_units
    ram_kv = 0 if kv_offload else sum(pieces.kv)

    def build(counts: list[int], placed: list[list[_Group]], host: list[_Group]) -> _Layout:
        ranges = _ranges(counts)
        weights = [
            sum(pieces.weights[u] for u in r) + sum(g.n_bytes for g in placed[i])
            for i, r in enumerate(ranges)
        ]
        kv = [sum(kv_units[u] for u in r) for r in ranges]
        compute, sources, host_c, host_src = _compute(info, shape, gpus, counts, host)
        on_gpu = sum(counts)
        ram_units = range(on_gpu, pieces.n_units)  # units no GPU took (only without GPUs)
        ram_weights = (
            pieces.input_bytes
            + sum(g.n_bytes for g in host)
            + sum(pieces.weights[u] for u in ram_units)
        )
        if not gpus:
            host_c, host_src = compute_bytes(info, shape, "cpu", backend="cpu")
        return _Layout(
            shape=shape,
            counts=counts,
            gpu_groups=placed,
            host_groups=host,
            weights=weights,
            kv=kv,
            compute=compute,
            sources=sources,
            capacity=list(caps),
            ram_weights=ram_weights,
            ram_kv=ram_kv + sum(pieces.kv[u] for u in ram_units if kv_offload),
            ram_compute=host_c + out_buffer,
            ram_source=host_src,
            ram_capacity=ram_cap,
            all_on_gpu=bool(gpus) and not host,
        )

    if not gpus:
        return build([], [], all_groups)

    # everything on the GPUs, experts with their layers
    full = [
        pieces.weights[u] + kv_units[u] + sum(g.n_bytes for g in pieces.groups.get(u, []))
        for u in range(pieces.n_units)
    ]
    probe = _split(full, caps) or [0] * len(gpus)
    compute, *_ = _compute(info, shape, gpus, probe, [])
    counts = _split(full, [c - x for c, x in zip(caps, compute, strict=True)])
    if counts is not None:
        placed = [[g for u in r for g in pieces.groups.get(u, [])] for r in _ranges(counts)]
        layout = build(counts, placed, [])
        if layout.fits:
            return layout

    # non-expert layers on the GPUs, experts where room is left
    host = list(all_groups)
    compute, *_ = _compute(info, shape, gpus, [1] * len(gpus), host)
    fixed = [pieces.weights[u] + kv_units[u] for u in range(pieces.n_units)]
    counts = _split(fixed, [c - x for c, x in zip(caps, compute, strict=True)])
    if counts is None:  # not even the non-expert layers fit: the plan shows by how much
        counts = _split(fixed, [max(c, 1) for c in caps]) or [0] * (len(gpus) - 1) + [
            pieces.n_units
        ]
        return build(counts, [[] for _ in gpus], host)
    placed: list[list[_Group]] = [[] for _ in gpus]
    for _ in range(3):  # staging shrinks as experts move: repack into the room it frees
        layout = build(counts, placed, host)
        room = [c - t for c, t in zip(caps, layout.gpu_totals, strict=True)]
        moved = _pack(host, placed, room, _ranges(counts))
        if not moved:
            break
        gone = {id(g) for g in moved}
        host = [g for g in host if id(g) not in gone]
    layout = build(counts, placed, host)
    while layout.gpu_over and any(placed):
        # compute grew after all (everything moved, so the all-GPU roles apply, which use
        # more on the other GPUs): give back the last group moved
        i = max(range(len(placed)), key=lambda j: len(placed[j]))
        host.append(placed[i].pop())
        layout = build(counts, placed, host)
    return layout


def _pack(
    host: list[_Group], placed: list[list[_Group]], room: list[int], ranges: Sequence[range]
) -> list[_Group]:
    """Move expert groups from `host` into `room` (per GPU), locality first; returns what
    moved. Whole layers on their own GPU, then whole layers anywhere, then single tensors."""
    moved: list[_Group] = []

    def put(i: int, groups: Sequence[_Group]) -> None:
        placed[i].extend(groups)
        room[i] -= sum(g.n_bytes for g in groups)
        moved.extend(groups)

    left: dict[int, list[_Group]] = defaultdict(list)
    for g in host:
        left[g.layer].append(g)
    owner = {u: i for i, r in enumerate(ranges) for u in r}
    for layer in sorted(left):  # 1. whole layers on the GPU holding the layer
        i = owner.get(layer)
        size = sum(g.n_bytes for g in left[layer])
        if i is not None and size <= room[i]:
            put(i, left.pop(layer))
    for layer in sorted(left):  # 2. whole layers on any GPU
        size = sum(g.n_bytes for g in left[layer])
        i = max(range(len(room)), key=lambda j: room[j])
        if size <= room[i]:
            put(i, left.pop(layer))
    order = {"ffn_gate_exps": 0, "ffn_up_exps": 1, "ffn_down_exps": 2}  # gate+up pair first
    singles = sorted(
        (g for gs in left.values() for g in gs), key=lambda g: (g.layer, order.get(g.base, 3))
    )
    for i in range(len(room)):  # 3. single tensors: this GPU's own layers, then any
        mine = [g for g in singles if owner.get(g.layer) == i]
        for g in mine + [g for g in singles if owner.get(g.layer) != i]:
            if g.n_bytes <= room[i]:
                put(i, [g])
                singles.remove(g)
    return moved


# -- overrides and command line -----------------------------------------------------------------


def _numbers_regex(numbers: Iterable[int]) -> str:
    """`(7|1[0-2]|20)` for {7, 10, 11, 12, 20}: an ECMAScript/Python alternation that matches
    exactly these decimal numbers (between `blk\\.` and `\\.`)."""
    by_prefix: dict[str, list[int]] = defaultdict(list)
    for n in sorted(set(numbers)):
        s = str(n)
        by_prefix[s[:-1]].append(int(s[-1]))
    parts = []
    for prefix, digits in by_prefix.items():
        runs: list[list[int]] = []
        for d in digits:
            if runs and d == runs[-1][-1] + 1:
                runs[-1].append(d)
            else:
                runs.append([d])
        for run in runs:
            if len(run) == 1:
                parts.append(f"{prefix}{run[0]}")
            elif len(run) == 2:
                parts.append(f"{prefix}{run[0]}|{prefix}{run[1]}")
            else:
                parts.append(f"{prefix}[{run[0]}-{run[-1]}]")
    joined = "|".join(parts)
    return f"({joined})" if "|" in joined else joined


def _kinds_regex(bases: Sequence[str]) -> str:
    """`ffn_(gate|up)_exps` for two bases sharing a prefix and suffix; an alternation else."""
    bases = sorted(set(bases))
    if len(bases) == 1:
        return bases[0]
    m = [re.fullmatch(r"(ffn_)(\w+?)(_exps)", b) for b in bases]
    if all(m):
        return f"ffn_({'|'.join(x[2] for x in m if x)})_exps"
    return f"({'|'.join(bases)})"


def _overrides(
    gpus: Sequence[DeviceBudget], placed: Sequence[Sequence[_Group]], host: Sequence[_Group]
) -> list[tuple[str, str]]:
    """The -ot rules: each GPU's experts, then `_exps\\.` to the CPU. Experts are listed per
    GPU even on their own layer's GPU, since the catch-all rule would take them otherwise."""
    if not host:
        return []
    rules = []
    for gpu, groups in zip(gpus, placed, strict=True):
        by_kinds: dict[tuple[str, ...], list[int]] = defaultdict(list)
        per_layer: dict[int, list[str]] = defaultdict(list)
        for g in groups:
            per_layer[g.layer].append(g.base)
        for layer, bases in per_layer.items():
            by_kinds[tuple(sorted(bases))].append(layer)
        for bases, layers in sorted(by_kinds.items(), key=lambda kv: min(kv[1])):
            pattern = rf"blk\.{_numbers_regex(layers)}\.{_kinds_regex(bases)}\."
            rules.append((pattern, gpu.name))
    rules.append((r"_exps\.", "CPU"))
    return rules


def _command(
    info: GGUFInfo, layout: _Layout, gpus: Sequence[DeviceBudget], overrides, swa_full, kv_offload
) -> str:
    shape = layout.shape
    args = [
        "llama-server",
        "-m",
        str(info.path),
        "-c",
        str(shape.n_ctx),
        "-np",
        str(shape.n_seq_max),
        "-b",
        str(max(2048, shape.n_ubatch)),
        "-ub",
        str(shape.n_ubatch),
        "-fa",
        "on" if shape.flash_attn else "off",
        "-ctk",
        shape.kv_type,
        "-ctv",
        shape.kv_type,
    ]
    if gpus:
        args += ["-ngl", str(sum(layout.counts))]
        if len(gpus) > 1:
            args += ["-sm", "layer", "-ts", ",".join(str(c) for c in layout.counts)]
    else:
        args += ["-ngl", "0"]
    if swa_full and info.metadata.get(f"{info.architecture}.attention.sliding_window"):
        args.append("--swa-full")
    if not kv_offload:
        args.append("-nkvo")
    if overrides:
        # host experts in a plain (not repacked) buffer: what the memory model measured
        args += ["--no-repack", "--fit", "off", "-ot", ",".join(f"{p}={b}" for p, b in overrides)]
    return shlex.join(args)


# -- the plan -------------------------------------------------------------------------------


def _gib(n: float) -> str:
    """GiB to one decimal, rounded up: a shortfall of 30 MiB is 0.1 GiB, not 0.0."""
    return f"{math.ceil(n / GIB * 10) / 10:,.1f} GiB"


def _experts_by_device(groups: Sequence[_Group], per_layer: dict[int, int]):
    layers: dict[int, list[str]] = defaultdict(list)
    for g in groups:
        layers[g.layer].append(g.base)
    full = tuple(sorted(la for la, b in layers.items() if len(b) == per_layer.get(la, 0)))
    partial = tuple(
        (la, tuple(sorted(b))) for la, b in sorted(layers.items()) if la not in set(full)
    )
    return full, partial


def _assemble(
    info: GGUFInfo,
    layout: _Layout,
    gpus: Sequence[DeviceBudget],
    pieces: _Pieces,
    *,
    profile: str,
    margin: float,
    kv_offload: bool,
    notes: Sequence[str] = (),
) -> Plan:
    shape = layout.shape
    swa_full = shape.swa_full_for(info)
    per_layer = {la: len(gs) for la, gs in pieces.groups.items()}
    devices = []
    for i, gpu in enumerate(gpus):
        r = _ranges(layout.counts)[i]
        full, partial = _experts_by_device(layout.gpu_groups[i], per_layer)
        devices.append(
            DevicePlan(
                name=gpu.name,
                weights=layout.weights[i],
                kv=layout.kv[i],
                compute=layout.compute[i],
                budget=layout.capacity[i],
                layers=(r.start, r.stop - 1) if len(r) else None,
                expert_layers_full=full,
                expert_layers_partial=partial,
                compute_source=layout.sources[i],
            )
        )
    full, partial = _experts_by_device(layout.host_groups, per_layer)
    devices.append(
        DevicePlan(
            name="CPU",
            weights=layout.ram_weights,
            kv=layout.ram_kv,
            compute=layout.ram_compute,
            budget=layout.ram_capacity,
            layers=None if gpus else (0, pieces.n_units - 1),
            expert_layers_full=full,
            expert_layers_partial=partial,
            compute_source=layout.ram_source,
        )
    )
    overrides = _overrides(gpus, layout.gpu_groups, layout.host_groups) if gpus else []
    sources = {d.compute_source for d in devices}
    warnings = list(notes)
    if "uncalibrated" in sources:
        warnings.append(
            "The compute buffers of this model or backend were never measured: they are a "
            "structural estimate. `stoke plan --measure` on the machine checks them with "
            "llama.cpp's own dry run and packs the experts again."
        )
    if shape.n_seq_max > 1:
        warnings.append(
            f"{shape.n_seq_max} sequences: llama.cpp keeps deepseek4's caches once per "
            "sequence, and the compute buffers are scaled from one measurement."
            if is_dsv4(info)
            else f"{shape.n_seq_max} sequences share the context's cells."
        )
    layer_bytes = max((sum(g.n_bytes for g in gs) for gs in pieces.groups.values()), default=0)
    n_layer = pieces.n_units - 1
    return Plan(
        model=str(info.path),
        architecture=info.architecture,
        n_layer=n_layer,
        n_ctx=shape.n_ctx,
        n_ubatch=shape.n_ubatch,
        n_batch=max(2048, shape.n_ubatch),
        kv_type=shape.kv_type,
        n_seq_max=shape.n_seq_max,
        flash_attn=shape.flash_attn,
        swa_full=swa_full,
        kv_offload=kv_offload,
        profile=profile,
        margin=margin,
        devices=tuple(devices),
        overrides=tuple(overrides),
        tensor_split=tuple(float(c) for c in layout.counts) if len(gpus) > 1 else (),
        n_gpu_layers=sum(layout.counts) if gpus else 0,
        command=_command(info, layout, gpus, overrides, swa_full, kv_offload),
        fits=layout.fits,
        minimum=None,
        expert_bytes_gpu=layout.expert_gpu,
        expert_bytes_total=pieces.expert_total,
        expert_layer_bytes=layer_bytes,
        warnings=tuple(warnings),
        calibrated_points={s: COMPUTE_CALIBRATION[s] for s in sorted(sources)},
    )


def _choose(layouts: dict[int, _Layout], profile: str) -> _Layout:
    """The micro-batch for the profile. Prefill with experts in RAM is PCIe-bound (each
    micro-batch copies the used experts to the first GPU), so a larger micro-batch pays off
    there; decode only reads, so it wants every expert byte on a GPU."""
    fitting = {ub: lay for ub, lay in layouts.items() if lay.fits}
    if not fitting:
        return layouts[min(layouts)]
    base = fitting[min(fitting)]
    if profile == "decode-heavy":
        return base
    if base.all_on_gpu:  # nothing to amortise: grow the micro-batch only while all stays
        keep = [ub for ub, lay in fitting.items() if lay.all_on_gpu]
        return fitting[max(keep)]
    if profile == "prefill-heavy":
        return fitting[max(fitting)]
    one_layer = max((sum(g.n_bytes for g in gs) for gs in _layers(base).values()), default=0)
    keep = [ub for ub, lay in fitting.items() if lay.expert_gpu >= base.expert_gpu - one_layer]
    return fitting[max(keep)]


def _layers(layout: _Layout) -> dict[int, list[_Group]]:
    out: dict[int, list[_Group]] = defaultdict(list)
    for g in [*layout.host_groups, *(g for gs in layout.gpu_groups for g in gs)]:
        out[g.layer].append(g)
    return out


def plan(
    info: GGUFInfo,
    devices: Sequence[DeviceBudget],
    *,
    ram_bytes: int,
    n_ctx: int,
    n_ubatch: int | None = None,
    kv_type: str = "f16",
    profile: Profile = "balanced",
    margin: float = 0.05,
    n_seq_max: int = 1,
    flash_attn: bool = True,
    swa_full: bool | None = None,
    kv_offload: bool = True,
) -> Plan:
    """Place `info`'s tensors on `devices` (GPUs, llama.cpp's order) and RAM for a context of
    `n_ctx` tokens; see the module docstring. When it cannot fit, `Plan.minimum` says what
    would (more memory, a smaller KV type, KV in RAM, a shorter context)."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, not {profile!r}")
    if not 0 <= margin < 1:
        raise ValueError("the margin is a fraction of each budget, from 0 to below 1")
    if not info.block_count:
        raise ValueError(f"{info.path.name} has no block count: not a model llama.cpp splits")
    layout, notes = _best(
        info, devices, ram_bytes, n_ctx, n_ubatch, kv_type, profile, margin, n_seq_max,
        flash_attn, swa_full, kv_offload,
    )  # fmt: skip
    pieces = _pieces(info, layout.shape)
    result = _assemble(
        info, layout, devices, pieces, profile=profile, margin=margin, kv_offload=kv_offload,
        notes=notes,
    )  # fmt: skip
    if not result.fits:
        result = replace(
            result,
            minimum=_minimum(
                info, devices, layout, ram_bytes=ram_bytes, n_ctx=n_ctx, kv_type=kv_type,
                margin=margin, n_seq_max=n_seq_max, flash_attn=flash_attn, swa_full=swa_full,
                kv_offload=kv_offload,
            ),
        )  # fmt: skip
    return result


def refine(
    info: GGUFInfo,
    devices: Sequence[DeviceBudget],
    measure: Callable[[Plan], Mapping[str, int]],
    **kwargs,
) -> Plan:
    """`plan`, then checked by llama.cpp itself: `measure` (normally `dry_run_compute`, a
    `no_alloc` load of the plan on this machine) gives each GPU's real compute buffer, which
    replaces the calibrated upper envelope, and the experts are packed again into the room
    that frees. Repeated until a dry run confirms every compute buffer (at most 3 times)."""
    p = plan(info, devices, **kwargs)
    seen: dict[str, int] = {}
    for _ in range(3):
        got = measure(p)
        gpus = [d for d in p.devices if d.name != "CPU"]
        if seen and all(got.get(d.name, 0) <= d.compute for d in gpus):
            break
        for name, size in got.items():
            seen[name] = max(size, seen.get(name, 0))
        devices = [
            replace(d, measured_compute=((p.n_ubatch, seen[d.name]),)) if d.name in seen else d
            for d in devices
        ]
        p = plan(info, devices, **{**kwargs, "n_ubatch": p.n_ubatch})
    return p


def dry_run_compute(p: Plan) -> dict[str, int]:
    """Each device's compute buffer for `p` as llama.cpp allocates it here (a dry run)."""
    parsed = measure_dry_run(
        p.model, p.n_ctx, p.n_ubatch, p.flash_attn, kv_type=p.kv_type, n_seq_max=p.n_seq_max,
        swa_full=p.swa_full, kv_offload=p.kv_offload, overrides=p.overrides,
        tensor_split=p.tensor_split or None, n_gpu_layers=p.n_gpu_layers,
    )  # fmt: skip
    return {name: int(size) for name, size in parsed["compute"].items()}  # type: ignore[union-attr]


def _best(
    info: GGUFInfo,
    devices: Sequence[DeviceBudget],
    ram_bytes: int,
    n_ctx: int,
    n_ubatch: int | None,
    kv_type: str,
    profile: str,
    margin: float,
    n_seq_max: int,
    flash_attn: bool,
    swa_full: bool | None,
    kv_offload: bool,
) -> tuple[_Layout, list[str]]:
    caps = [int(d.budget * (1 - margin)) - d.reserve for d in devices]
    ram_cap = int(ram_bytes * (1 - margin))
    ubatches = (n_ubatch,) if n_ubatch else _UBATCHES[profile]
    layouts = {}
    for ub in ubatches:
        shape = ContextShape(
            n_ctx, ub, kv_type, n_seq_max, swa_full=swa_full, flash_attn=flash_attn
        )
        layouts[ub] = _layout(info, _pieces(info, shape), shape, devices, caps, ram_cap, kv_offload)
    chosen = _choose(layouts, profile)
    notes = []
    ub = chosen.shape.n_ubatch
    bigger = [lay for u, lay in sorted(layouts.items()) if u > ub]
    if chosen.fits and chosen.host_groups and bigger:
        nxt = bigger[0]
        if not nxt.fits:
            notes.append(
                f"Micro-batch {ub}: {nxt.shape.n_ubatch} would speed up prefill (experts in "
                "RAM are copied to the first GPU once per micro-batch) but would not fit."
            )
        else:
            lost = chosen.expert_gpu - nxt.expert_gpu
            notes.append(
                f"Micro-batch {ub}: {nxt.shape.n_ubatch} would speed up prefill (experts in "
                "RAM are copied to the first GPU once per micro-batch) but its compute "
                f"buffers would push {_gib(max(lost, 0))} more experts into RAM."
            )
    if chosen.host_groups and profile == "decode-heavy" and len(layouts) == 1 and not n_ubatch:
        notes.append("Decode-heavy: micro-batch 512 keeps the most experts on the GPUs.")
    return chosen, notes


def _minimum(
    info: GGUFInfo,
    devices: Sequence[DeviceBudget],
    layout: _Layout,
    **params,
) -> str:
    """What would make an impossible plan fit, in the model's own bytes."""
    parts = []
    gpu_short, ram_short = layout.gpu_over, layout.ram_over
    if gpu_short and devices:
        need = f"needs {_gib(gpu_short)} more GPU memory"
        if ram_short:
            need += f" and {_gib(ram_short)} more RAM"
        parts.append(need)
    elif ram_short:
        parts.append(
            f"needs {_gib(ram_short)} more RAM"
            + (f" or {_gib(ram_short)} more GPU memory" if devices else "")
        )
    choices = []

    def fits(**change) -> bool:
        args = {**params, **change}
        lay, _ = _best(
            info, devices, args["ram_bytes"], args["n_ctx"], layout.shape.n_ubatch,
            args["kv_type"], "decode-heavy", args["margin"], args["n_seq_max"],
            args["flash_attn"], args["swa_full"], args["kv_offload"],
        )  # fmt: skip
        return lay.fits

    for kv in ("q8_0", "q4_0"):
        if kv != params["kv_type"] and fits(kv_type=kv):
            choices.append(f"KV {kv}")
            break
    if params["kv_offload"] and devices and gpu_short and fits(kv_offload=False):
        choices.append("KV in RAM (-nkvo)")
    if layout.shape.n_ubatch > 512:
        lay, _ = _best(
            info, devices, params["ram_bytes"], params["n_ctx"], 512, params["kv_type"],
            "decode-heavy", params["margin"], params["n_seq_max"], params["flash_attn"],
            params["swa_full"], params["kv_offload"],
        )  # fmt: skip
        if lay.fits:
            choices.append("micro-batch 512")
    lo, hi = 0, params["n_ctx"] // 4096
    while lo < hi:  # the longest context (in 4,096s) that fits
        mid = (lo + hi + 1) // 2
        if mid * 4096 < params["n_ctx"] and fits(n_ctx=mid * 4096):
            lo = mid
        else:
            hi = mid - 1
    if lo:
        choices.append(f"context {lo * 4096:,}")
    text = "; or ".join(filter(None, ["; ".join(parts), ", or ".join(choices)]))
    return (text[0].upper() + text[1:] + ".") if text else "It does not fit in these budgets."


def alternatives(info: GGUFInfo, devices: Sequence[DeviceBudget], **kwargs) -> list[Plan]:
    """The same plan with each single choice changed that trades context memory for experts:
    smaller micro-batches, q8_0/q4_0 KV, KV in RAM. For showing why a plan holds what it does."""
    base = dict(kwargs)
    out = []
    for ub in (2048, 1024, 512):
        if ub < (base.get("n_ubatch") or 4096):
            out.append(plan(info, devices, **{**base, "n_ubatch": ub}))
    for kv in ("q8_0", "q4_0"):
        if kv != base.get("kv_type", "f16"):
            out.append(plan(info, devices, **{**base, "kv_type": kv}))
    if base.get("kv_offload", True):
        out.append(plan(info, devices, **{**base, "kv_offload": False}))
    return out


def describe_choice(p: Plan) -> str:
    """One line naming a plan's context settings, for lists of alternatives."""
    return (
        f"micro-batch {p.n_ubatch}, KV {p.kv_type}{'' if p.kv_offload else ' in RAM'}: "
        f"{p.expert_layers_on_gpu:.1f} expert layers on GPUs, "
        + ("fits" if p.fits else "does not fit")
    )


def load_options(p: Plan) -> dict[str, object]:
    """The engine's load settings that reproduce this plan (fields of `LoadOptions`, some of
    them proposed: overrides, tensor_split, kv_type, swa_full, kv_offload)."""
    return {
        "n_ctx": p.n_ctx,
        "n_batch": p.n_batch,
        "n_ubatch": p.n_ubatch,
        "n_seq_max": p.n_seq_max,
        "flash_attn": p.flash_attn,
        "n_gpu_layers": p.n_gpu_layers,
        "overrides": p.overrides,
        "tensor_split": p.tensor_split,
        "kv_type": p.kv_type,
        "swa_full": p.swa_full,
        "kv_offload": p.kv_offload,
    }


def plan_to_dict(p: Plan) -> dict[str, object]:
    """The plan as plain JSON data (`stoke plan --json`)."""
    data = asdict(p)
    data["devices"] = [{**asdict(d), "total": d.total, "free": d.free} for d in p.devices]
    data["overrides"] = [list(o) for o in p.overrides]
    data["expert_layers_on_gpu"] = round(p.expert_layers_on_gpu, 3)
    return data
