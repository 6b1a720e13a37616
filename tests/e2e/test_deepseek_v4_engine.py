"""The MLX engine runs DeepSeek V4 from a GGUF: prefill in chunks, decode, and a second turn
that reuses the first turn's cache (compressor state included) all give the tokens one
uninterrupted pass of the model gives. The pass runs the model as the engine loads it
(models.load_model: float16 on a GPU, float32 on a CPU), so both sides compute alike."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np

from app.engine.mlx.backend import MlxEngine
from app.engine.mlx.models import load_model
from app.engine.protocol import LoadOptions, SamplingParams, TokenEvent
from app.hardware.synthetic_gguf import write_deepseek4


def one_pass_greedy(path: Path, tokens: list[int], n: int) -> list[int]:
    model = load_model(str(path)).model
    cache = model.make_cache()
    logits = model(mx.array([tokens]), cache)[0, -1]
    out = []
    for _ in range(n):
        out.append(int(mx.argmax(logits)))
        logits = model(mx.array([out[-1:]]), cache)[0, -1]
    return out


def test_engine_turns_equal_one_pass(tmp_path: Path) -> None:
    path = write_deepseek4(tmp_path / "dsv4.gguf", mode="scaled", seed=4, weights="f32")
    prompt = np.random.default_rng(7).integers(2, 512, 200).tolist()
    engine = MlxEngine()
    engine.load(LoadOptions(str(path), n_ctx=512, snapshots=False, n_batch=64))
    try:
        first = [
            e.token_id
            for e in engine.generate(prompt, SamplingParams.greedy(), 20)
            if isinstance(e, TokenEvent)
        ]
        follow_up = [*prompt, *first, 5, 6, 7]
        second = [
            e.token_id
            for e in engine.generate(follow_up, SamplingParams.greedy(), 12)
            if isinstance(e, TokenEvent)
        ]
    finally:
        engine.unload()
    assert first == one_pass_greedy(path, prompt, 20)
    assert second == one_pass_greedy(path, follow_up, 12)
