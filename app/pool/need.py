"""How much memory a model takes loaded, and how much the pool may fill by default.

A model's need is the planner's memory model for its load options (app/hardware/memory.py):
the weights as they are on disk, the KV of every resident conversation's window, and the
CPU compute buffer. It is an estimate the pool compares against its budget before a load, so
a model that cannot fit is refused in words instead of failing halfway through loading.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from app.engine.gguf_info import inspect_gguf
from app.engine.protocol import LoadOptions, ModelLoadError
from app.hardware.detect import detect
from app.hardware.memory import ContextShape, compute_bytes, kv_cache

RAM_SHARE = 0.85  # of this machine's RAM the pool may fill by default: the OS and app keep the rest


def memory_need(options: LoadOptions, files: Sequence[Path] = ()) -> int:
    """Bytes the model takes loaded with these options (`files`: all its files; default the
    model path alone, or every file of an MLX folder)."""
    path = Path(options.model_path).expanduser()
    files = files or (
        sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    )
    weights = sum(f.stat().st_size for f in files if f.exists())
    if path.is_dir():
        return weights  # an MLX folder: the planner's KV model is the GGUF's
    shape = ContextShape(
        n_ctx=max(options.n_ctx, 1),
        n_ubatch=max(options.n_ubatch, 1),
        kv_type=options.kv_type,
        n_seq_max=max(options.n_seq_max, 1),
        kv_unified=options.kv_unified,
        swa_full=options.swa_full,
        flash_attn=options.flash_attn,
    )
    try:
        info = inspect_gguf(path)
        kv = kv_cache(info, shape).total
        compute = compute_bytes(info, shape, "cpu", backend="cpu")[0]
    except (ModelLoadError, OSError, ValueError, KeyError):  # an unusual header: weights alone
        return weights
    return weights + kv + compute


def default_budget() -> int:
    """What the pool may fill when no budget is given: most of this machine's RAM, and the
    GPUs' memory where llama.cpp offloads to them."""
    hardware = detect()
    gpus = sum(gpu.memory_total for gpu in hardware.gpus) if hardware.gpu_offload else 0
    return int(hardware.memory.total * RAM_SHARE) + gpus
