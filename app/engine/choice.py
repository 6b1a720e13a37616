"""Which engine runs a model on this machine, and why (`stoke doctor` prints the why).

On Apple Silicon MLX is the fast path (the GPU in unified memory), with llama.cpp on Metal
as the alternative, except for GGUFs whose tensor types MLX cannot keep compact (K-quants, IQ
types), which llama.cpp runs at their own size, and vision models (an mmproj beside the
GGUF), whose images llama.cpp reads; elsewhere llama.cpp runs GGUF models on CPUs
and NVIDIA/AMD GPUs. An MLX folder runs only on MLX. `LoadOptions.engine` carries a user's
choice ("auto" when none): per model from its load settings (Settings > Hardware), for the
app from Settings, or per command from --engine.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from app.engine.gguf_info import inspect_gguf
from app.engine.images import find_projector
from app.engine.mlx.registry import GGUF_BUILDERS, not_compact, not_compact_reason
from app.engine.model_file import gguf_architecture
from app.engine.protocol import LoadOptions, ModelLoadError

AUTO = "auto"
LOCAL_ENGINES = ("llama.cpp", "mlx")
CHOICES = (AUTO, *LOCAL_ENGINES)


@dataclass(frozen=True)
class EngineChoice:
    engine: str  # a backend name EngineClient runs: "llama.cpp", "mlx" or "remote"
    reason: str


def apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def mlx_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("mlx", "mlx_lm"))


def _architecture(path: Path) -> str | None:
    try:
        return gguf_architecture(path)
    except (OSError, struct.error):
        return None  # the engine that loads it says what is wrong with the file


def _not_compact(path: Path) -> set[str]:
    """The file's tensor types MLX would expand (none when its header cannot be read: the
    engine that loads it says what is wrong)."""
    try:
        return set(not_compact(inspect_gguf(path)))
    except (OSError, ModelLoadError):
        return set()


def platform_choice(model_path: str | os.PathLike[str]) -> EngineChoice:
    """What runs the model best here when nobody chose."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        return EngineChoice("mlx", "an MLX model folder: only the MLX engine runs it")
    if not apple_silicon():
        return EngineChoice(
            "llama.cpp",
            "not Apple Silicon: llama.cpp runs GGUF models on CPUs and on NVIDIA or AMD GPUs",
        )
    if not mlx_installed():
        return EngineChoice("llama.cpp", "MLX is not installed: llama.cpp runs it with Metal")
    architecture = _architecture(path)
    if architecture not in GGUF_BUILDERS:
        return EngineChoice(
            "llama.cpp", f"MLX does not run {architecture} GGUF models: llama.cpp (Metal) does"
        )
    heavy = _not_compact(path)
    if heavy:
        return EngineChoice("llama.cpp", not_compact_reason(heavy))
    if find_projector(path) is not None:
        return EngineChoice(
            "llama.cpp",
            "a vision model (its mmproj lies beside it): llama.cpp (Metal) reads its images, "
            "Stoke's MLX engine does not yet",
        )
    return EngineChoice(
        "mlx",
        "Apple Silicon: MLX runs it on the GPU in unified memory "
        "(llama.cpp with Metal is the alternative, per model in Settings > Hardware)",
    )


def choose_engine(options: LoadOptions) -> EngineChoice:
    """The engine for these options: a server when they name one, else the user's choice,
    else the platform's. An MLX folder goes to MLX whatever was asked: llama.cpp cannot
    read it."""
    if options.remote is not None:
        return EngineChoice("remote", "a server runs the model")
    if options.engine == "mlx" or (
        options.engine == "llama.cpp" and not Path(options.model_path).expanduser().is_dir()
    ):
        return EngineChoice(options.engine, "chosen by the user")
    return platform_choice(options.model_path)
