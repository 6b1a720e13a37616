"""Recommended models, and whether each fits this machine before a byte is downloaded.

The catalog ships inside the package (`app/models/catalog.json`, package data) so an installed
Stoke finds it without knowing where it was installed from.

The verdict is a size rule on the machine's budgets from `app.hardware.detect`: the offload
planner places tensors and needs a model's header, which a catalog entry does not have until
its file is on disk. Once it is, the planner gives the exact plan.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.hardware.detect import Hardware
from app.hardware.planner import GPU_RESERVE

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
    raw = importlib.resources.files("app.models").joinpath("catalog.json").read_text("utf-8")
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
    gpu = sum(max(g.memory_total - GPU_RESERVE, 0) for g in hardware.gpus)
    return Budget(gpu, total)


def verdict(entry: CatalogEntry, hardware: Hardware) -> str:
    """One of FITS_GPU, FITS_EXPERT_OFFLOAD, FITS_CPU_OFFLOAD, RUNS_ON_CPU, DOES_NOT_FIT."""
    room = budget(hardware)
    need = int(entry.size_bytes * _OVERHEAD) + _RUNTIME
    if room.gpu_bytes and need <= room.gpu_bytes:
        return FITS_GPU
    if need > room.gpu_bytes + room.ram_bytes:
        return DOES_NOT_FIT
    if not room.gpu_bytes:
        return RUNS_ON_CPU
    if entry.moe and entry.size_bytes * _SHARED_FRACTION <= room.gpu_bytes:
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
    fit = verdict(entry, hardware)
    if fit == DOES_NOT_FIT:
        return None
    where = "unified" if hardware.apple is not None else "gpu" if fit == FITS_GPU else "ram"
    tok_s = _BANDWIDTH[where] / max(entry.size_bytes * active_fraction(entry), 1)
    label = "fast" if tok_s >= 20 else "usable" if tok_s >= 5 else "slow"
    return f"{label}, up to ~{tok_s:,.0f} tok/s"
