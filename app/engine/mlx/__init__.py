"""The MLX engine: Apple Silicon's fast path, also on Linux CPU (tests) and NVIDIA (mlx-cuda).

`backend.MlxEngine` keeps the llama.cpp engine's promises (exact-token prompts, prefix
reuse, prefill-only, checked snapshots); `models` maps a model's architecture to the code
that builds it, so a new model module plugs in without touching the engine.
"""

from app.engine.mlx.lm import register

register()  # mlx-lm's pieces without transformers and PyTorch (lm.py says why)
