"""The MLX engine on an Apple GPU: the default engine there, quantized layers kept packed.

These need Metal and are skipped elsewhere (MLX on Linux computes on the CPU, where the
engine expands quantized layers to float32); nothing here is claimed as tested on Linux.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.e2e.conftest import needs_mlx


def _metal() -> bool:
    if importlib.util.find_spec("mlx") is None:
        return False
    import mlx.core as mx

    return mx.metal.is_available()


needs_metal = pytest.mark.skipif(
    not _metal(), reason="needs an Apple GPU (Metal); MLX here runs on the CPU"
)


@needs_mlx
@needs_metal
def test_on_metal_mlx_is_the_default_and_q4_1_stays_quantized(model_path):
    import mlx.nn as nn

    from app.engine.choice import platform_choice
    from app.engine.mlx.backend import MlxEngine
    from app.engine.mlx.models import load_model
    from app.engine.protocol import LoadOptions, SamplingParams, TokenEvent

    assert platform_choice(model_path).engine == "mlx"
    model = load_model(model_path).model
    attention = model.model.layers[0].self_attn
    assert isinstance(attention.q_proj, nn.QuantizedLinear) and attention.q_proj.bits == 4
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    engine = MlxEngine()
    engine.load(LoadOptions(model_path, n_ctx=1024, snapshots=False))
    try:
        prompt = engine.tokenize(
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
            special=True,
        )
        events = list(engine.generate(prompt, SamplingParams.greedy(), 12))
    finally:
        engine.unload()
    assert "Paris" in "".join(e.text for e in events if isinstance(e, TokenEvent))
