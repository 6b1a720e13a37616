"""What the wizard plans with: the context slider's stops, the devices' budgets, the
recommended engine, reading a model's header (cached while the file is unchanged) and one
plan with its alternatives, timed. No widgets: these run on pool threads or feed them."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.engine.gguf_info import GGUFInfo, inspect_gguf
from app.engine.model_file import check_gguf
from app.hardware.detect import Hardware
from app.hardware.planner import DeviceBudget, Plan, alternatives, plan
from app.models import load_settings

DEFAULT_CONTEXT = 65_536
# Half-octave stops from 4K to 1M: each step is 1.5x or 1.33x the last.
CONTEXT_STOPS: tuple[int, ...] = tuple(
    sorted({base << shift for shift in range(9) for base in (4096, 6144)} - {6144 << 8})
)
MAX_RESIDENT = 16
MAX_CHOICES = 4
UBATCHES: tuple[int | None, ...] = (None, 4096, 2048, 1024, 512)


def context_stops(model_max: int | None, extra: int | None = None) -> list[int]:
    """The slider's stops, up to what the model was trained for (its own length is the last
    stop), plus `extra` (a saved context that is not a stop) when it is in range."""
    limit = model_max or CONTEXT_STOPS[-1]
    stops = {s for s in CONTEXT_STOPS if s <= limit}
    stops.add(min(limit, CONTEXT_STOPS[-1]))
    if extra and extra <= limit:
        stops.add(extra)
    return sorted(stops)


def recommended_engine(hw: Hardware) -> tuple[str, str]:
    """("mlx" or "llama.cpp", why), from the machine alone."""
    if hw.apple is not None:
        return (
            "MLX",
            f"{hw.apple.chip}: MLX runs models on the GPU in unified memory, GGUF files of "
            "the architectures it knows included. The plan below is for llama.cpp (Metal), "
            "the alternative: choose the engine per model.",
        )
    return (
        "llama.cpp",
        "It runs GGUF models on CPUs and on NVIDIA or AMD GPUs, and splits a model too big "
        "for the GPUs between them and system RAM.",
    )


def budgets(hw: Hardware) -> tuple[list[DeviceBudget], int]:
    """GPUs llama.cpp can use, with their free memory as budgets, and the RAM budget."""
    if not hw.gpu_offload:
        return [], hw.memory.available
    gpus = [DeviceBudget.of(g) for g in hw.gpus]
    return gpus, hw.memory.available


def useful_alternatives(current: Plan, alts: Sequence[Plan]) -> list[Plan]:
    """The alternatives worth a click: when the plan fits, those that fit with more experts on
    the GPUs; when it does not, every other choice, those that fit first."""
    has_gpus = len(current.devices) > 1
    mine = (current.n_ubatch, current.kv_type, current.kv_offload)
    out: dict[tuple[int, str, bool], Plan] = {}
    for a in alts:
        key = (a.n_ubatch, a.kv_type, a.kv_offload)
        if key == mine or key in out or (not a.kv_offload and not has_gpus):
            continue
        if current.fits and not (a.fits and a.expert_bytes_gpu > current.expert_bytes_gpu):
            continue
        out[key] = a
    return sorted(out.values(), key=lambda a: (not a.fits, -a.expert_bytes_gpu))


@functools.lru_cache(maxsize=4)
def _inspect(path: str, size: int, mtime_ns: int) -> GGUFInfo:
    return inspect_gguf(path)


def read_model(path: str) -> tuple[GGUFInfo, dict[str, Any] | None]:
    """The model's header (cached while the file is unchanged) and its saved load settings."""
    file = check_gguf(path)  # a missing or foreign file, said in words
    stat = file.stat()
    return _inspect(str(file), stat.st_size, stat.st_mtime_ns), load_settings.load(file)


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    alternatives: tuple[Plan, ...]
    plan_ms: float
    alternatives_ms: float


def compute_plan(info: GGUFInfo, devices: Sequence[DeviceBudget], **kwargs: Any) -> PlanResult:
    started = time.perf_counter()
    chosen = plan(info, devices, **kwargs)
    planned = time.perf_counter()
    alts = alternatives(info, devices, **kwargs)
    return PlanResult(
        chosen,
        tuple(alts),
        (planned - started) * 1000,
        (time.perf_counter() - planned) * 1000,
    )
