"""Which code builds which architecture on MLX: plug a model module in here.

Two small tables, by architecture name, so a model runs on the MLX engine without touching
the engine itself:
- `GGUF_BUILDERS`: a GGUF's `general.architecture` -> "module:function" taking the tensors
  and metadata `mx.load` returns and giving back an mlx-lm-shaped model (`model(tokens,
  cache=...)` returns logits; `make_cache()` when the default KV cache does not fit);
- `FOLDER_MODULES`: an mlx-lm folder's `model_type` -> the module holding `Model` and
  `ModelArgs`, for architectures mlx-lm does not ship (the others come from mlx-lm).
Entries are import paths and this module imports nothing heavy, so the app can ask which
architectures MLX runs (engine choice, doctor) on a machine without MLX.
"""

from __future__ import annotations

GGUF_BUILDERS: dict[str, str] = {
    "llama": "app.engine.mlx.gguf_llama:build",
    "deepseek4": "app.engine.mlx.gguf_deepseek_v4:build",
}
FOLDER_MODULES: dict[str, str] = {"deepseek_v4": "app.engine.mlx.deepseek_v4"}
