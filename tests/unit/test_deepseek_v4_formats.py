"""DeepSeek V4 as people download it: every folder format mlx-lm and mlx-vlm write (affine 2-8
bits at group sizes 32/64/128, mxfp4, mxfp8, a mixed per-layer recipe, mlx-vlm's own recipe) and
DeepSeek's release loads into Stoke's model through the engine's loader, and agrees with
mlx-vlm's model reading the same folder (the independent reference), while its weights are the
release's within the format's quantization error.

The tiny models are chaotic (random weights, 6 layers of top-k routing): a relative weight
change of 1e-4 moves some logit by 1. So the formats are compared with the release by their
weights, and with the reference by their logits on the very same weights.

The release, its model as Stoke loads it and each conversion are written or loaded once per
module: the tests only read them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from app.engine.mlx.models import load_model
from tests import deepseek_v4_formats as formats

TOKENS = np.random.default_rng(1).integers(2, 512, 128).tolist()  # 32 rows per 4:1 layer > top-k 8
# the largest relative RMS error of any matrix, by the fewest bits a recipe stores
ERROR_BY_BITS = {2: 0.5, 3: 0.3, 4: 0.15, 5: 0.08, 6: 0.05, 8: 0.04}
FEWEST_BITS = {"mxfp4": 4, "mxfp8": 8, "nvfp4": 4, "mixed_2_6": 2, "mlx-vlm": 8}


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("dsv4")
    model, metadata, _ = formats.source_model(root)
    folder = root / "official"
    formats.write_official(model, folder)
    formats.write_tokenizer(metadata, folder)
    return folder, metadata


@pytest.fixture(scope="module")
def release_model(release: tuple[Path, dict]) -> nn.Module:
    return load_model(str(release[0])).model


@pytest.fixture(scope="module")
def release_weights(release_model: nn.Module) -> dict[str, mx.array]:
    return dict(tree_flatten(release_model.parameters()))


@pytest.fixture(scope="module")
def converted(
    release: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """mlx-lm's conversion of the release by a recipe, written the first time it is asked."""
    folders: dict[str, Path] = {}

    def folder(recipe: str) -> Path:
        if recipe not in folders:
            target = tmp_path_factory.mktemp("converted") / recipe
            folders[recipe] = formats.mlx_lm_folder(release[0], target, recipe, release[1])
        return folders[recipe]

    return folder


def assert_agrees_with_reference(folder: Path, model: nn.Module) -> np.ndarray:
    """`model`, Stoke's load of `folder`, against mlx-vlm's model reading the same folder."""
    ours = formats.logits(model, TOKENS)
    reference = formats.logits(formats.reference_model(folder), TOKENS)
    assert formats.top1_agreement(ours, reference) >= 0.99
    # Where an expert's or the indexer's top-k meets a near-tie, float32 rounding may pick
    # another: that position's K row then differs for one sliding window (16 positions) of
    # later ones. The rest agree to rounding.
    close = (np.abs(ours - reference).max(axis=-1) < 1e-3).mean()
    assert close >= 0.75, f"only {close:.0%} of positions agree with mlx-vlm's model"
    return ours


def assert_weights_match_release(model: nn.Module, release: dict[str, mx.array], bits: int) -> None:
    loaded = dict(tree_flatten(model.parameters()))
    assert loaded.keys() == release.keys()
    for name, value in release.items():
        if value.ndim < 2 or name.endswith("tid2eid"):
            assert np.allclose(np.array(loaded[name]), np.array(value), rtol=1e-2), name
            continue
        scale = max(float(mx.sqrt(mx.mean(value**2))), 1e-6)  # compressor offsets start at 0
        error = float(mx.sqrt(mx.mean((loaded[name] - value) ** 2))) / scale
        assert error < ERROR_BY_BITS[bits], f"{name}: relative error {error:.3f}"


def test_the_release_agrees_with_mlx_vlm(
    release: tuple[Path, dict], release_model: nn.Module
) -> None:
    weight = release_model.layers[2].ffn.switch_mlp.gate_proj.weight
    assert weight.dtype == mx.float32  # CPU: expanded
    assert_agrees_with_reference(release[0], release_model)


@pytest.mark.parametrize("recipe", list(formats.RECIPES))
def test_an_mlx_lm_conversion_loads_and_agrees(
    recipe: str, converted: Callable[[str], Path], release_weights: dict
) -> None:
    folder = converted(recipe)
    model = load_model(str(folder)).model
    spec = formats.RECIPES[recipe]
    bits = FEWEST_BITS.get(recipe) or spec[1]
    assert_weights_match_release(model, release_weights, bits)
    assert_agrees_with_reference(folder, model)


def test_an_mlx_vlm_conversion_loads_and_agrees(
    release: tuple[Path, dict], release_weights: dict, tmp_path: Path
) -> None:
    folder = formats.mlx_vlm_folder(release[0], tmp_path / "vlm", release[1])
    assert next(iter(mx.load(str(folder / "model.safetensors")))).startswith("language_model.")
    model = load_model(str(folder)).model
    assert_weights_match_release(model, release_weights, FEWEST_BITS["mlx-vlm"])
    assert_agrees_with_reference(folder, model)


def test_packed_layers_stay_packed_on_a_gpu(converted: Callable[[str], Path]) -> None:
    """What a GPU keeps (the CPU expands it): mxfp4 experts and affine attention, in the
    modes and sizes the folder stores, computing in bfloat16 (an mxfp4 head's uint8 scales
    once set the compute type)."""
    from mlx_lm.utils import load_model as mlx_lm_load

    from app.engine.mlx.models import _model_classes

    folder = converted("mxfp4")  # the recipe test's folder, written once
    model, _ = mlx_lm_load(
        folder,
        model_config={"quantization": None, "quantization_config": None},
        get_model_classes=_model_classes,
    )
    experts = model.layers[2].ffn.switch_mlp.gate_proj
    assert (experts.mode, experts.bits, experts.group_size) == ("mxfp4", 4, 32)
    assert model.head.mode == "mxfp4"
    assert model.compute_dtype == mx.bfloat16
