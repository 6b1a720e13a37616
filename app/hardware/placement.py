"""Where each tensor goes, for one micro-batch: the model cut into pieces (layers, their KV,
expert groups), layers split over the GPUs in contiguous ranges, expert groups packed into the
room left, and the llama.cpp `-ot` rules and llama-server command line that reproduce it.

`planner.py` chooses among these placements (micro-batch, profile, margins) and reports them.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from app.engine.gguf_info import GGUFInfo, TensorInfo
from app.hardware.detect import GpuInfo, detect
from app.hardware.memory import (
    MIB,
    OP_OFFLOAD_MIN_BATCH,
    ComputeRole,
    ContextShape,
    compute_bytes,
    kv_cache,
    staging_bytes,
)

# What the GPU runtime itself keeps beside llama.cpp's buffers (context, kernels, cuBLAS
# workspaces): 715-718 MiB per H200 (141 GiB, CUDA 13) after a prefill, 0.5% of the device;
# smaller cards have fewer SMs and smaller contexts, so the floor is 256 MiB.
GPU_RESERVE = 256 * MIB
GPU_RESERVE_FRACTION = 0.005
_INPUT_PREFIXES = ("token_embd.", "position_embd.", "token_types.", "per_layer_token_embd.")


@dataclass(frozen=True)
class Link:
    """The network to a remote machine: its rate in bytes per second and its round trip
    (None: not measured or stated), and how it was written ("10GbE")."""

    bandwidth: int
    rtt_s: float | None
    name: str


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
    machine: str = ""  # "" for this machine; an rpc-server's HOST:PORT for a remote device
    link: Link | None = None  # the network to `machine`
    # this machine's CPU leading a split over rpc-servers (its RAM the budget), not a device
    # that offloads; a lone CPU device stands in for a GPU (as on CI) and offloads like one
    lead: bool = False

    @classmethod
    def of(cls, gpu: GpuInfo) -> DeviceBudget:
        """A detected GPU, its free memory as the budget."""
        return cls(gpu.name, gpu.memory_free, gpu.backend, gpu.description, total=gpu.memory_total)

    @property
    def remote(self) -> bool:
        return bool(self.machine)

    @property
    def reserve(self) -> int:
        """Bytes the GPU runtime takes beside llama.cpp's buffers (see GPU_RESERVE)."""
        if self.lead:  # this machine's CPU leading a split: RAM has no runtime
            return 0
        if self.runtime is not None:
            return self.runtime
        if self.backend == "rpc":  # whatever the server runs on: no floor for a CPU there
            return int((self.total or self.budget) * GPU_RESERVE_FRACTION)
        return max(GPU_RESERVE, int((self.total or self.budget) * GPU_RESERVE_FRACTION))


def budgets_here() -> tuple[list[DeviceBudget], int, list[str]]:
    """This machine's GPUs (their free memory as budgets, none where this llama.cpp cannot
    offload), its available RAM, and notes in words (a rebuild hint): what `stoke plan`
    plans for when no machine is described."""
    hw = detect()
    notes = list(hw.notes)
    gpus = [DeviceBudget.of(g) for g in hw.gpus]
    if gpus and not hw.gpu_offload:
        notes.append(hw.rebuild_hint or "This llama.cpp cannot offload to the GPU.")
        gpus = []
    elif not gpus and hw.rebuild_hint:
        notes.append(hw.rebuild_hint)
    return gpus, hw.memory.available, notes


# -- the model's pieces -----------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """All tensors of one expert kind in one layer (`blk.7.ffn_up_exps.weight` and any bias):
    the unit the planner moves."""

    layer: int
    base: str  # "ffn_up_exps"
    tensors: tuple[TensorInfo, ...]

    @property
    def n_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)


@dataclass
class Pieces:
    """Bytes of a model for one context shape: per unit (layer; unit n_layer is the output),
    token_embd, expert groups."""

    n_units: int
    weights: list[int]  # non-expert bytes per unit
    kv: list[int]
    input_bytes: int
    groups: dict[int, list[Group]]  # by layer

    @property
    def expert_total(self) -> int:
        return sum(g.n_bytes for gs in self.groups.values() for g in gs)


def tensor_pieces(info: GGUFInfo, shape: ContextShape) -> Pieces:
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
    groups: dict[int, list[Group]] = defaultdict(list)
    for (layer, base), tensors in sorted(grouped.items()):
        groups[layer].append(Group(layer, base, tuple(tensors)))
    kv_layers = kv_cache(info, shape).by_layer
    kv = [kv_layers.get(u, 0) for u in range(n_layer + 1)]
    return Pieces(n_layer + 1, weights, kv, input_bytes, dict(groups))


# -- one placement ----------------------------------------------------------------------------


@dataclass
class Layout:
    """A candidate placement for one micro-batch and its predicted bytes."""

    shape: ContextShape
    counts: list[int]  # units per GPU, in order
    gpu_groups: list[list[Group]]  # expert groups placed on each GPU
    host_groups: list[Group]
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


def layer_ranges(counts: Sequence[int]) -> list[range]:
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
    if all(
        sum(loads[r.start : r.stop]) <= c for r, c in zip(layer_ranges(counts), caps, strict=True)
    ):
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


def _remote_first(
    full: Sequence[int], fixed: Sequence[int], room: Sequence[int], gpus: Sequence[DeviceBudget]
) -> list[int] | None:
    """Remote devices (first in the order) take whole layers, experts included, as many as
    fit, so no layer of theirs has its experts on another machine; this machine's GPUs split
    the rest as usual, their experts packed after. None when that does not apply or fit."""
    n_remote = next((i for i, g in enumerate(gpus) if not g.remote), len(gpus))
    if not n_remote or n_remote == len(gpus):
        return None
    head, start = [], 0
    for i in range(n_remote):
        end, used = start, 0
        while end < len(full) - 1 and used + full[end] <= room[i]:
            used += full[end]
            end += 1
        head.append(end - start)
        start = end
    rest = _split(fixed[start:], room[n_remote:])
    return None if rest is None else head + rest


def _compute(
    info: GGUFInfo,
    shape: ContextShape,
    gpus: Sequence[DeviceBudget],
    counts: Sequence[int],
    host: Sequence[Group],
) -> tuple[list[int], list[str], int, str]:
    """Compute buffers per GPU and in RAM for a placement (roles from what stays in RAM)."""
    host_weights = bool(host)
    output_gpu = max((i for i, c in enumerate(counts) if c), default=len(gpus) - 1)
    stage = host_weights and shape.n_ubatch >= OP_OFFLOAD_MIN_BATCH
    staged = staging_bytes(t for g in host for t in g.tensors) if stage else 0
    # llama.cpp stages host experts on the first device that offloads ops: RPC devices do not
    first = next((i for i, g in enumerate(gpus) if g.backend != "rpc" and not g.lead), None)
    sizes, sources = [], []
    for i, gpu in enumerate(gpus):
        role: ComputeRole
        if gpu.lead:  # this machine's CPU holding the first layers of a split
            size, source = compute_bytes(info, shape, "cpu", backend="cpu")
            sizes.append(size)
            sources.append(source)
            continue
        if host_weights:
            role = "gpu_first" if i == first and stage else "gpu"
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


def lay_out(
    info: GGUFInfo,
    pieces: Pieces,
    shape: ContextShape,
    gpus: Sequence[DeviceBudget],
    caps: Sequence[int],
    ram_cap: int,
    kv_offload: bool,
) -> Layout:
    """The best placement for this micro-batch: everything on the GPUs if that fits, else
    non-expert layers on the GPUs and experts packed into what is left."""
    all_groups = [g for layer in sorted(pieces.groups) for g in pieces.groups[layer]]
    out_buffer = (info.vocab_size or 0) * 4 * shape.n_seq_max  # logits of the last token
    kv_units = pieces.kv if kv_offload else [0] * pieces.n_units
    ram_kv = 0 if kv_offload else sum(pieces.kv)

    def build(counts: list[int], placed: list[list[Group]], host: list[Group]) -> Layout:
        ranges = layer_ranges(counts)
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
        return Layout(
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
        placed = [[g for u in r for g in pieces.groups.get(u, [])] for r in layer_ranges(counts)]
        layout = build(counts, placed, [])
        if layout.fits:
            return layout

    # non-expert layers on the GPUs, experts where room is left
    host = list(all_groups)
    compute, *_ = _compute(info, shape, gpus, [1] * len(gpus), host)
    fixed = [pieces.weights[u] + kv_units[u] for u in range(pieces.n_units)]
    room = [c - x for c, x in zip(caps, compute, strict=True)]
    counts = _remote_first(full, fixed, room, gpus) or _split(fixed, room)
    if counts is None:  # not even the non-expert layers fit: the plan shows by how much
        counts = _split(fixed, [max(c, 1) for c in caps]) or [0] * (len(gpus) - 1) + [
            pieces.n_units
        ]
        return build(counts, [[] for _ in gpus], host)
    placed: list[list[Group]] = [[] for _ in gpus]
    for _ in range(3):  # staging shrinks as experts move: repack into the room it frees
        layout = build(counts, placed, host)
        room = [c - t for c, t in zip(caps, layout.gpu_totals, strict=True)]
        moved = _pack(host, placed, room, layer_ranges(counts), [g.machine for g in gpus])
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
    host: list[Group],
    placed: list[list[Group]],
    room: list[int],
    ranges: Sequence[range],
    machines: Sequence[str],
) -> list[Group]:
    """Move expert groups from `host` into `room` (per GPU), locality first; returns what
    moved. Whole layers on their own GPU, then whole layers on another GPU of the same
    machine, then single tensors. A layer's experts never move to another machine than the
    layer's (that would send its activations over the network and back)."""
    moved: list[Group] = []

    def put(i: int, groups: Sequence[Group]) -> None:
        placed[i].extend(groups)
        room[i] -= sum(g.n_bytes for g in groups)
        moved.extend(groups)

    left: dict[int, list[Group]] = defaultdict(list)
    for g in host:
        left[g.layer].append(g)
    owner = {u: i for i, r in enumerate(ranges) for u in r}
    for layer in sorted(left):  # 1. whole layers on the GPU holding the layer
        i = owner.get(layer)
        size = sum(g.n_bytes for g in left[layer])
        if i is not None and size <= room[i]:
            put(i, left.pop(layer))

    def near(layer: int) -> list[int]:
        """The devices on the layer's machine (this machine's for units no device holds)."""
        home = machines[owner[layer]] if layer in owner else ""
        return [j for j in range(len(room)) if machines[j] == home]

    for layer in sorted(left):  # 2. whole layers on another GPU of the same machine
        size = sum(g.n_bytes for g in left[layer])
        i = max(near(layer), key=lambda j: room[j], default=None)
        if i is not None and size <= room[i]:
            put(i, left.pop(layer))
    order = {"ffn_gate_exps": 0, "ffn_up_exps": 1, "ffn_down_exps": 2}  # gate+up pair first
    singles = sorted(
        (g for gs in left.values() for g in gs), key=lambda g: (g.layer, order.get(g.base, 3))
    )
    for i in range(len(room)):  # 3. single tensors: this GPU's own layers, then its machine's
        mine = [g for g in singles if owner.get(g.layer) == i]
        others = [g for g in singles if owner.get(g.layer) != i and i in near(g.layer)]
        for g in mine + others:
            if g.n_bytes <= room[i]:
                put(i, [g])
                singles.remove(g)
    return moved


# -- overrides and command line -----------------------------------------------------------------


def numbers_regex(numbers: Iterable[int]) -> str:
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


def override_rules(
    gpus: Sequence[DeviceBudget], placed: Sequence[Sequence[Group]], host: Sequence[Group]
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
            pattern = rf"blk\.{numbers_regex(layers)}\.{_kinds_regex(bases)}\."
            rules.append((pattern, gpu.name))
    rules.append((r"_exps\.", "CPU"))
    return rules


def server_command(
    info: GGUFInfo, layout: Layout, gpus: Sequence[DeviceBudget], overrides, swa_full, kv_offload
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
    counts = list(layout.counts)
    if gpus and gpus[0].lead:  # this CPU leads: its layers are the ones not offloaded
        gpus, counts = gpus[1:], counts[1:]
    remote = [g for g in gpus if g.remote]
    if remote:
        args += ["--rpc", ",".join(dict.fromkeys(g.description for g in remote))]
        args += ["-dev", ",".join(_server_device_names(gpus))]
    if gpus:
        args += ["-ngl", str(sum(counts))]
        if len(gpus) > 1:
            args += ["-sm", "layer", "-ts", ",".join(str(c) for c in counts)]
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


def _server_device_names(gpus: Sequence[DeviceBudget]) -> list[str]:
    """llama-server's `-dev` names: RPC devices are numbered across servers in `--rpc` order
    (RPC0, RPC1, ...), local GPUs keep their names."""
    numbers: dict[str, int] = {}
    names = []
    for g in gpus:
        if g.remote:
            numbers.setdefault(g.name, len(numbers))
            names.append(f"RPC{numbers[g.name]}")
        else:
            names.append(g.name)
    return names
