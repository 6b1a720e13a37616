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
256 MiB: `placement.GPU_RESERVE`). `placement.py` builds one placement; this module
chooses among them (micro-batch, profile) and says why.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from app.engine.gguf_info import GGUFInfo
from app.hardware.memory import (
    COMPUTE_CALIBRATION,
    ContextShape,
    compute_bytes,
    is_dsv4,
    measure_dry_run,
)
from app.hardware.network import LinkTraffic, expert_homes, traffic
from app.hardware.placement import (
    DeviceBudget,
    Group,
    Layout,
    Pieces,
    lay_out,
    layer_ranges,
    override_rules,
    server_command,
    tensor_pieces,
)
from app.units import gib

Profile = Literal["balanced", "prefill-heavy", "decode-heavy"]
PROFILES: tuple[Profile, ...] = ("balanced", "prefill-heavy", "decode-heavy")
_UBATCHES: dict[str, tuple[int, ...]] = {
    "prefill-heavy": (4096, 2048, 1024, 512),
    "balanced": (2048, 1024, 512),
    "decode-heavy": (512,),
}


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
    machine: str = ""  # "" for this machine, else the rpc-server's host

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
    # Remote devices (app/hardware/rpc.py): the rpc-servers to add, the devices llama.cpp
    # offloads to in order (its `devices` list; empty: its default), and each link's traffic.
    rpc_servers: tuple[str, ...] = ()
    device_order: tuple[str, ...] = ()
    links: tuple[LinkTraffic, ...] = ()

    @property
    def expert_layers_on_gpu(self) -> float:
        """Expert bytes on GPUs, in layers' worth (partial layers count by their bytes)."""
        return self.expert_bytes_gpu / self.expert_layer_bytes if self.expert_layer_bytes else 0.0

    def device(self, name: str) -> DevicePlan:
        return next(d for d in self.devices if d.name == name)


# -- the plan -------------------------------------------------------------------------------


def _experts_by_device(groups: Sequence[Group], per_layer: dict[int, int]):
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
    layout: Layout,
    gpus: Sequence[DeviceBudget],
    pieces: Pieces,
    *,
    profile: str,
    margin: float,
    kv_offload: bool,
    notes: Sequence[str] = (),
) -> Plan:
    shape = layout.shape
    swa_full = shape.swa_full_for(info)
    per_layer = {la: len(gs) for la, gs in pieces.groups.items()}
    lead = bool(gpus) and gpus[0].lead  # this CPU holds the first layers
    devices = []
    for i, gpu in enumerate(gpus):
        r = layer_ranges(layout.counts)[i]
        full, partial = _experts_by_device(layout.gpu_groups[i], per_layer)
        if lead and i == 0:
            continue  # merged into the CPU row below
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
                machine=gpu.machine,
            )
        )
    host = list(layout.host_groups) + (list(layout.gpu_groups[0]) if lead else [])
    full, partial = _experts_by_device(host, per_layer)
    cpu_layers = None if gpus else (0, pieces.n_units - 1)
    if lead and layout.counts[0]:
        cpu_layers = (0, layout.counts[0] - 1)
    devices.append(
        DevicePlan(
            name="CPU",
            weights=layout.ram_weights + (layout.weights[0] if lead else 0),
            kv=layout.ram_kv + (layout.kv[0] if lead else 0),
            compute=layout.ram_compute + (layout.compute[0] if lead else 0),
            budget=layout.ram_capacity + (layout.capacity[0] if lead else 0),
            layers=cpu_layers,
            expert_layers_full=full,
            expert_layers_partial=partial,
            compute_source=layout.ram_source,
        )
    )
    offload = gpus[1:] if lead else gpus
    counts = layout.counts[1:] if lead else layout.counts
    if lead:
        overrides = override_rules(offload, layout.gpu_groups[1:], host) if offload else []
    else:
        overrides = override_rules(gpus, layout.gpu_groups, layout.host_groups) if gpus else []
    sources = {d.compute_source for d in devices}
    warnings = list(notes)
    remote = [g for g in gpus if g.remote]
    links: list[LinkTraffic] = []
    if remote:
        homes = expert_homes(gpus, layout.gpu_groups, layout.host_groups)
        links, away = traffic(info, gpus, layout.counts, homes, shape.n_ubatch)
        warnings += _network_words(away, gpus, layout.counts, pieces.n_units)
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
            else f"{shape.n_seq_max} sequences: each keeps a KV stream of the whole context."
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
        tensor_split=tuple(float(c) for c in counts) if len(offload) > 1 else (),
        n_gpu_layers=sum(counts) if offload else 0,
        command=server_command(info, layout, gpus, overrides, swa_full, kv_offload),
        fits=layout.fits,
        minimum=None,
        expert_bytes_gpu=layout.expert_gpu,
        expert_bytes_total=pieces.expert_total,
        expert_layer_bytes=layer_bytes,
        warnings=tuple(warnings),
        calibrated_points={s: COMPUTE_CALIBRATION[s] for s in sorted(sources)},
        rpc_servers=tuple(dict.fromkeys(g.description for g in remote)),
        device_order=tuple(g.name for g in offload) if remote else (),
        links=tuple(links),
    )


def _network_words(
    away: Sequence[int], gpus: Sequence[DeviceBudget], counts: Sequence[int], n_units: int
) -> list[str]:
    """The plan's network choices in words: which layers each machine holds, and any layer
    whose experts memory forced onto another machine than the layer."""
    words = []
    ranges = layer_ranges(counts)
    for gpu, r in zip(gpus, ranges, strict=True):
        if gpu.remote and len(r):
            last = "the output" if r.stop - 1 >= n_units - 1 else str(r.stop - 1)
            words.append(
                f"{gpu.name} holds layers {r.start} to {last} with their KV "
                "cache: one contiguous range, so each token crosses its link once each way."
            )
    if away:
        shown = ", ".join(str(u) for u in away[:8]) + (" ..." if len(away) > 8 else "")
        words.append(
            f"Memory forced the experts of {len(away)} layer(s) ({shown}) onto another machine "
            "than their layer: each such layer sends its activations over the network and back "
            "once more per token."
        )
    return words


def ordered_devices(devices: Sequence[DeviceBudget], ram_bytes: int) -> list[DeviceBudget]:
    """The devices in the order llama.cpp offloads to them: remote ones first, then this
    machine's GPUs, so the output layer (and the logits) end on this machine where it has a
    GPU, as llama.cpp's own default order does. With remote devices and no GPU here, this
    machine's CPU leads the split (the first layers; llama.cpp keeps layers below
    n_gpu_layers there), budgeted with the RAM."""
    remote = [d for d in devices if d.remote]
    local = [d for d in devices if not d.remote]
    if remote and not local:
        return [
            DeviceBudget("CPU", ram_bytes, backend="cpu", description="this machine", lead=True),
            *remote,
        ]
    return remote + local


def _choose(layouts: dict[int, Layout], profile: str) -> Layout:
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


def _layers(layout: Layout) -> dict[int, list[Group]]:
    out: dict[int, list[Group]] = defaultdict(list)
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
    devices = ordered_devices(devices, ram_bytes)
    layout, notes = _best(
        info, devices, ram_bytes, n_ctx, n_ubatch, kv_type, profile, margin, n_seq_max,
        flash_attn, swa_full, kv_offload,
    )  # fmt: skip
    pieces = tensor_pieces(info, layout.shape)
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
) -> tuple[Layout, list[str]]:
    caps = [int(d.budget * (1 - margin)) - d.reserve for d in devices]
    ram_cap = int(ram_bytes * (1 - margin))
    ubatches = (n_ubatch,) if n_ubatch else _UBATCHES[profile]
    layouts = {}
    for ub in ubatches:
        shape = ContextShape(
            n_ctx, ub, kv_type, n_seq_max, swa_full=swa_full, flash_attn=flash_attn
        )
        pieces = tensor_pieces(info, shape)
        caps_ub, ram_ub = list(caps), ram_cap
        if devices and devices[0].lead:  # RAM is shared by the CPU's layers
            host_share = pieces.input_bytes + compute_bytes(info, shape, "host_all")[0]
            host_share += (info.vocab_size or 0) * 4 * n_seq_max
            caps_ub[0], ram_ub = ram_cap - host_share, host_share
        layouts[ub] = lay_out(info, pieces, shape, devices, caps_ub, ram_ub, kv_offload)
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
                f"buffers would push {gib(max(lost, 0), 1, up=True)} more experts into RAM."
            )
    if chosen.host_groups and profile == "decode-heavy" and len(layouts) == 1 and not n_ubatch:
        notes.append("Decode-heavy: micro-batch 512 keeps the most experts on the GPUs.")
    return chosen, notes


def _minimum(
    info: GGUFInfo,
    devices: Sequence[DeviceBudget],
    layout: Layout,
    **params,
) -> str:
    """What would make an impossible plan fit, in the model's own bytes."""
    parts = []
    gpu_short, ram_short = layout.gpu_over, layout.ram_over
    if gpu_short and devices:
        need = f"needs {gib(gpu_short, 1, up=True)} more GPU memory"
        if ram_short:
            need += f" and {gib(ram_short, 1, up=True)} more RAM"
        parts.append(need)
    elif ram_short:
        parts.append(
            f"needs {gib(ram_short, 1, up=True)} more RAM"
            + (f" or {gib(ram_short, 1, up=True)} more GPU memory" if devices else "")
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
        "rpc_servers": p.rpc_servers,
        "devices": p.device_order,
    }


def plan_to_dict(p: Plan) -> dict[str, object]:
    """The plan as plain JSON data (`stoke plan --json`)."""
    data = asdict(p)
    data["devices"] = [{**asdict(d), "total": d.total, "free": d.free} for d in p.devices]
    data["overrides"] = [list(o) for o in p.overrides]
    data["expert_layers_on_gpu"] = round(p.expert_layers_on_gpu, 3)
    return data
