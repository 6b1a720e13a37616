"""Which code builds which architecture on MLX: plug a model module in here.

Two small tables, by architecture name, so a model runs on the MLX engine without touching
the engine itself:
- `GGUF_BUILDERS`: a GGUF's `general.architecture` -> "module:function" taking the tensors
  and metadata `mx.load` returns and giving back an mlx-lm-shaped model (`model(tokens,
  cache=...)` returns logits; `make_cache()` when the default KV cache does not fit);
- `FOLDER_MODULES`: an mlx-lm folder's `model_type` -> the module holding `Model` and
  `ModelArgs`, for architectures mlx-lm does not ship (the others come from mlx-lm). Such a
  module's `Model.sanitize` maps every published dialect's names and quantizes its own layers
  from the tensors (config.json's `quantization` is not applied a second time).
- `GGUF_COMPACT_TYPES`: the GGUF tensor types MLX holds at their own size (`gguf_tensors`
  reads them); a file with others (K-quants, IQ types) would be expanded to float16.
Entries are import paths and this module imports nothing heavy, so the app can ask which
architectures MLX runs (engine choice, doctor, the model manager) on a machine without MLX.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.gguf_info import GGUFInfo

GGUF_BUILDERS: dict[str, str] = {
    "llama": "app.engine.mlx.gguf_llama:build",
    "deepseek4": "app.engine.mlx.gguf_deepseek_v4:build",
}
FOLDER_MODULES: dict[str, str] = {"deepseek_v4": "app.engine.mlx.deepseek_v4"}
GGUF_COMPACT_TYPES = frozenset({"F32", "F16", "BF16", "I32", "Q8_0", "Q4_0", "Q4_1", "MXFP4"})
FLOAT16_BYTES_PER_VALUE = 2  # what MLX expands a tensor of any other type to


def not_compact(info: GGUFInfo) -> Counter[str]:
    """Tensors per ggml type in `info` that MLX cannot keep compact."""
    return Counter(t.ggml_type for t in info.tensors if t.ggml_type not in GGUF_COMPACT_TYPES)


def not_compact_reason(types: Iterable[str]) -> str:
    """Why a GGUF of these (not compact) tensor types runs on llama.cpp, in one line: the
    engine choice says it for a file, the catalog for a download."""
    return (
        f"its {', '.join(sorted(types))} tensors have no compact MLX form (MLX would expand "
        "them to float16, about 4x): llama.cpp (Metal) runs the file at its own size"
    )


def mlx_bytes(info: GGUFInfo) -> int:
    """What the file's tensors would take in MLX's memory: compact types at their size, the
    others expanded to float16."""
    return sum(
        t.n_bytes
        if t.ggml_type in GGUF_COMPACT_TYPES
        else FLOAT16_BYTES_PER_VALUE * math.prod(t.shape)
        for t in info.tensors
    )
