"""The MLX engine reads a prompt in mlx-lm's 2,048-token steps on a GPU, n_batch on a CPU."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")

from app.engine.mlx.backend import GPU_PREFILL_STEP, prefill_steps  # noqa: E402
from app.engine.protocol import LoadOptions  # noqa: E402


def test_a_gpu_reads_the_prompt_in_mlx_lms_steps_and_a_cpu_in_n_batch() -> None:
    options = LoadOptions("model.gguf", n_batch=512)
    assert prefill_steps(options, mx.Device(mx.gpu, 0)).n_batch == GPU_PREFILL_STEP == 2048
    assert prefill_steps(options, mx.Device(mx.cpu, 0)) is options
    larger = LoadOptions("model.gguf", n_batch=4096)
    assert prefill_steps(larger, mx.Device(mx.gpu, 0)).n_batch == 4096
