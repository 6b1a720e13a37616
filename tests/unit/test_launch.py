"""The one precedence of load options: defaults, then Settings, then the model's saved plan,
then the flags; a server when asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.launch import LoadFlags, resolve_load_options
from app.models import load_settings
from app.models.default import default_model_path
from app.settings import Settings


@pytest.fixture(autouse=True)
def home(stoke_home: Path) -> Path:
    return stoke_home


def test_settings_then_the_plan_then_the_flags() -> None:
    model = str(default_model_path())
    settings = Settings(n_ctx=4096, n_threads=3, engine="llama.cpp")
    assert resolve_load_options(None, settings).model_path == model
    options = resolve_load_options(model, settings)
    assert (options.n_ctx, options.n_threads, options.engine) == (4096, 3, "llama.cpp")
    load_settings.save(model, {"n_ctx": 2048, "engine": "mlx", "cpu_buffers": "no-amx"})
    options = resolve_load_options(model, settings)
    assert (options.n_ctx, options.engine, options.cpu_buffers) == (2048, "mlx", "no-amx")
    options = resolve_load_options(model, settings, LoadFlags(ctx=1024, engine="llama.cpp"))
    assert (options.n_ctx, options.engine, options.cpu_buffers) == (1024, "llama.cpp", "no-amx")


def test_a_missing_model_has_no_plan_and_a_server_needs_no_model(tmp_path: Path) -> None:
    missing = str(tmp_path / "gone.gguf")
    assert resolve_load_options(missing, Settings(n_ctx=512)).n_ctx == 512
    served = resolve_load_options(
        missing, Settings(), LoadFlags(remote_url="http://127.0.0.1:1", remote_tokenizer="t")
    )
    assert served.remote is not None and served.model_path == "t"
