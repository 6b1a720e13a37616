"""Recommended models, and whether each fits this machine before a byte is downloaded.

The catalog ships as package data (`resources/catalog.json`, read through app.resources) so an
installed Stoke finds it without knowing where it was installed from.

DeepSeek V4 Flash GGUF entries get the offload planner's verdict before any download: the
planner places the real Flash layout (`resources/flash_layout.json`, the header of the
full-size replica of `app.hardware.synthetic_gguf`: every tensor's name, shape and type) with
its expert tensors sized to the entry's file, on this machine's GPUs and RAM. Other entries,
small dense models for which "does it fit" is a matter of size, get a size rule on the same
budgets; each answer says which it rests on.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app import resources
from app.engine.gguf_info import GGUFInfo
from app.engine.mlx.registry import GGUF_COMPACT_TYPES, not_compact_reason
from app.hardware.detect import Hardware
from app.hardware.planner import DeviceBudget, Plan, plan

FITS_GPU = "fits on GPU"
FITS_EXPERT_OFFLOAD = "fits with expert offload"
FITS_CPU_OFFLOAD = "fits with CPU offload"
RUNS_ON_CPU = "runs on CPU"
DOES_NOT_FIT = "does not fit"

_OVERHEAD = 1.10  # KV cache and compute buffers at a modest context, over the weights
_RUNTIME = 1 << 30  # the runtime itself, the app, the OS's file cache of small files
_SHARED_FRACTION = 0.10  # of a MoE file, what every token uses (attention, shared experts)
_APPLE_GPU_FRACTION = 0.75  # what Metal lets one process keep resident, when not reported


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    name: str
    family: str
    format: str  # "gguf" | "mlx"
    repo: str
    files: tuple[str, ...]  # empty: the repo's `quant` group (MLX: the whole model)
    quant: str | None
    size_bytes: int
    parameters: str
    moe: bool
    context_length: int | None
    checked: bool  # repo id and file names seen in the hub's listing
    notes: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CatalogEntry:
        return cls(**{**data, "files": tuple(data.get("files", ()))})


@dataclass(frozen=True)
class Budget:
    """Bytes a model can use on this machine: on its GPUs (Metal's share on Apple Silicon)
    and in system RAM besides."""

    gpu_bytes: int
    ram_bytes: int


def load_catalog() -> list[CatalogEntry]:
    raw = resources.read_text("catalog.json")
    return [CatalogEntry.from_dict(m) for m in json.loads(raw)["models"]]


def budget(hardware: Hardware) -> Budget:
    total = hardware.memory.total
    if hardware.apple is not None:
        gpu = hardware.apple.metal_working_set or int(
            hardware.apple.unified_memory * _APPLE_GPU_FRACTION
        )
        return Budget(gpu, max(total - gpu, 0))
    if not hardware.gpu_offload:  # llama.cpp built for the CPU cannot use the GPUs
        return Budget(0, total)
    gpu = sum(max(g.memory_total - DeviceBudget.of(g).reserve, 0) for g in hardware.gpus)
    return Budget(gpu, total)


@dataclass(frozen=True)
class Fit:
    """An entry's verdict on this machine, its predicted decode speed class, and what they
    rest on ("planner" or "size")."""

    verdict: str
    speed: str | None
    basis: str
    detail: str = ""
    engine: str = ""  # "MLX" or "llama.cpp": what runs the entry here (`engine_for`)
    engine_reason: str = ""


PLAN_CONTEXT = 65_536  # the context a catalog verdict plans for (stoke plan's default)
FLASH_LAYOUT = "flash_layout.json"  # in resources/


def assess(entry: CatalogEntry, hardware: Hardware) -> Fit:
    """The verdict for `entry`: the planner's where it knows the layout, else the size rule;
    with the engine that will run it here."""
    engine = engine_for(entry, hardware)
    if entry.format == "gguf" and entry.family == "DeepSeek V4 Flash":
        try:
            return dataclasses.replace(_planned(entry, hardware), **engine)
        except OSError:  # the shipped layout cannot be read (a broken install): judge by size
            pass
    fit = _size_verdict(entry, hardware)
    return Fit(fit, _speed_from_size(entry, hardware, fit), "size", **engine)


def engine_for(entry: CatalogEntry, hardware: Hardware) -> dict[str, str]:
    """Which engine runs `entry` on this machine and why, as `engine_choice` will decide once
    the file is here: an MLX folder on MLX; a GGUF on MLX on Apple Silicon when every tensor
    type its quantization names stays compact there, else on llama.cpp."""
    if entry.format == "mlx":
        if hardware.apple is not None:
            return {"engine": "MLX", "engine_reason": "an MLX folder, on the GPU"}
        return {
            "engine": "MLX",
            "engine_reason": "MLX folders run on Apple Silicon (elsewhere MLX's CUDA or CPU "
            "build); on this machine choose a GGUF",
        }
    if hardware.apple is None:
        return {"engine": "llama.cpp", "engine_reason": "GGUF on CPUs and NVIDIA/AMD GPUs"}
    types = {t.strip().removeprefix("UD-") for t in (entry.quant or "").split("/")}
    heavy = types - GGUF_COMPACT_TYPES
    if heavy:
        return {"engine": "llama.cpp", "engine_reason": not_compact_reason(heavy)}
    return {"engine": "MLX", "engine_reason": "its tensors stay compact on MLX, on the GPU"}


def verdict(entry: CatalogEntry, hardware: Hardware) -> str:
    """One of FITS_GPU, FITS_EXPERT_OFFLOAD, FITS_CPU_OFFLOAD, RUNS_ON_CPU, DOES_NOT_FIT."""
    return assess(entry, hardware).verdict


def _devices(hardware: Hardware) -> tuple[list[DeviceBudget], int]:
    """The GPUs and RAM a plan may use: whole devices, less what the app and OS keep."""
    ram = max(hardware.memory.total - _RUNTIME, 0)
    if hardware.apple is not None:
        room = budget(hardware)
        return [DeviceBudget("MTL0", room.gpu_bytes, "metal", hardware.apple.chip)], max(
            room.ram_bytes - _RUNTIME, 0
        )
    if not hardware.gpu_offload:
        return [], ram
    return [
        DeviceBudget(g.name, g.memory_total, g.backend, total=g.memory_total) for g in hardware.gpus
    ], ram


def _planned(entry: CatalogEntry, hardware: Hardware) -> Fit:
    info = _sized(flash_layout(), entry.size_bytes)
    devices, ram = _devices(hardware)
    n_ctx = min(PLAN_CONTEXT, entry.context_length or PLAN_CONTEXT)
    p = plan(info, devices, ram_bytes=ram, n_ctx=n_ctx)
    layers = f"{p.expert_layers_on_gpu:.1f} of {p.n_layer} expert layers on the GPUs"
    if not p.fits:
        return Fit(DOES_NOT_FIT, None, "planner", p.minimum or "")
    host = p.device("CPU")
    if not devices:
        fit = RUNS_ON_CPU
    elif host.expert_layers_full or host.expert_layers_partial:
        fit = FITS_EXPERT_OFFLOAD
    else:
        fit = FITS_GPU
    detail = f"{layers} at {n_ctx:,} context, micro-batch {p.n_ubatch}"
    return Fit(fit, _speed_from_plan(entry, info, p, apple=hardware.apple is not None), "planner",
               detail)  # fmt: skip


@functools.lru_cache(maxsize=1)
def flash_layout() -> GGUFInfo:
    """DeepSeek V4 Flash's tensors and metadata (no vocabulary), shipped as data: JSON, read
    without pickle, written by `stoke dev flash-layout` from the synthetic replica."""
    return GGUFInfo.from_dict(json.loads(resources.read_text(FLASH_LAYOUT)))


def _sized(info: GGUFInfo, size_bytes: int) -> GGUFInfo:
    """`info` with its expert tensors scaled so that the whole model is `size_bytes`: the
    catalog knows a file's size and quantization, not each tensor's type."""
    experts = sum(t.n_bytes for t in info.tensors if t.kind == "expert")
    rest = info.total_bytes - experts
    scale = max(size_bytes - rest, 0) / experts if experts else 1.0
    tensors = tuple(
        dataclasses.replace(t, n_bytes=int(t.n_bytes * scale)) if t.kind == "expert" else t
        for t in info.tensors
    )
    return dataclasses.replace(info, tensors=tensors)


def _size_verdict(entry: CatalogEntry, hardware: Hardware) -> str:
    return size_verdict(entry.size_bytes, entry.moe, hardware)


def size_verdict(size_bytes: int, moe: bool, hardware: Hardware) -> str:
    """The size rule for any model file: a library model, a hub search result, an entry."""
    room = budget(hardware)
    need = int(size_bytes * _OVERHEAD) + _RUNTIME
    if room.gpu_bytes and need <= room.gpu_bytes:
        return FITS_GPU
    if need > room.gpu_bytes + room.ram_bytes:
        return DOES_NOT_FIT
    if not room.gpu_bytes:
        return RUNS_ON_CPU
    if moe and size_bytes * _SHARED_FRACTION <= room.gpu_bytes:
        return FITS_EXPERT_OFFLOAD
    return FITS_CPU_OFFLOAD


# Bandwidth where a token's active weights are read from, conservatively: one desktop GPU,
# Apple's unified memory, dual/quad-channel system RAM. Decode is bound by it, so tokens/s is
# about bandwidth / active bytes per token; this sorts models into classes, not benchmarks.
_BANDWIDTH = {"gpu": 300e9, "unified": 400e9, "ram": 40e9}
_ACTIVE = re.compile(r"([\d.]+)\s*B\s+total,\s*([\d.]+)\s*B\s+active", re.IGNORECASE)


def active_fraction(entry: CatalogEntry) -> float:
    """Share of the weights one token reads: the active experts of a MoE, else all."""
    match = _ACTIVE.search(entry.parameters)
    return float(match[2]) / float(match[1]) if match and entry.moe else 1.0


def speed_class(entry: CatalogEntry, hardware: Hardware) -> str | None:
    """A predicted decode speed class ("fast, ~40 tok/s"); None when it does not fit."""
    return assess(entry, hardware).speed


def _label(tok_s: float) -> str:
    label = "fast" if tok_s >= 20 else "usable" if tok_s >= 5 else "slow"
    return f"{label}, up to ~{tok_s:,.0f} tok/s"


def _speed_from_size(entry: CatalogEntry, hardware: Hardware, fit: str) -> str | None:
    if fit == DOES_NOT_FIT:
        return None
    where = "unified" if hardware.apple is not None else "gpu" if fit == FITS_GPU else "ram"
    return _label(_BANDWIDTH[where] / max(entry.size_bytes * active_fraction(entry), 1))


def _speed_from_plan(entry: CatalogEntry, info: GGUFInfo, p: Plan, *, apple: bool) -> str:
    """Each token reads every non-expert weight (on the GPUs) and its share of the experts:
    the plan says how much of that share sits in GPU memory and how much in RAM."""
    fast = _BANDWIDTH["unified" if apple else "gpu"]
    experts = sum(t.n_bytes for t in info.tensors if t.kind == "expert")
    used = (info.expert_used_count or 1) / (info.expert_count or 1)
    dense = info.total_bytes - experts
    on_gpu = p.expert_bytes_gpu * used
    in_ram = (experts - p.expert_bytes_gpu) * used
    gpu_bytes = dense + on_gpu if p.devices[0].name != "CPU" else 0
    ram_bytes = in_ram + (0 if gpu_bytes else dense + on_gpu)
    seconds = gpu_bytes / fast + ram_bytes / (fast if apple else _BANDWIDTH["ram"])
    return _label(1 / seconds if seconds else 0.0)
