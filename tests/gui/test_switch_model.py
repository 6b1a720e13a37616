"""Loading another model from the Models dialog loads it as Stoke would start it: the app's
settings, then that model's own saved plan. The previous model's placement never carries over.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from app.engine.protocol import LoadOptions
from app.models import load_settings
from app.models.default import default_model_path
from app.settings import Settings
from tests.gui.harness import Harness

PLACED = {"n_ctx": 2048, "overrides": (("blk\\.99\\.ffn_.*", "CPU"),), "tensor_split": (1.0,)}


def _other_model(folder: Path) -> str:
    """A second GGUF with a fingerprint of its own (another mtime), and no saved plan."""
    path = folder / "other.gguf"
    shutil.copyfile(default_model_path(), path)
    return str(path)


def test_a_model_without_a_plan_does_not_inherit_the_previous_ones(
    harness: Harness, tmp_path: Path
) -> None:
    window = harness.start(**PLACED)  # as if the first model's plan said so
    other = _other_model(tmp_path)
    assert load_settings.load(other) is None
    harness.run(window.switch_model(other))
    options = window.session.engine.options
    defaults = LoadOptions(other)
    assert options.model_path == other
    assert options.n_ctx == Settings().n_ctx
    assert (options.overrides, options.tensor_split, options.kv_type) == (
        defaults.overrides,
        defaults.tensor_split,
        defaults.kv_type,
    )
    assert window.session.engine.info.path == other


def test_a_model_with_a_plan_loads_with_it(harness: Harness, tmp_path: Path) -> None:
    window = harness.start()
    other = _other_model(tmp_path)
    load_settings.save(other, {"n_ctx": 2048, "cpu_buffers": "none"})
    harness.run(window.switch_model(other))
    options = window.session.engine.options
    assert (options.model_path, options.n_ctx, options.cpu_buffers) == (other, 2048, "none")
