"""`stoke chat --engine mlx --model FOLDER` answers for DeepSeek V4 folders written as people
download them: mlx-lm's conversions of the FP8/FP4 release (4-bit at group 64, 8-bit, mxfp4,
the mixed 2/6-bit recipe), mlx-vlm's, and the release itself. Each folder is a tiny model
(tests/deepseek_v4_formats.py) with its tokenizer and chat template, run by the real CLI in a
process of its own; tests/unit/test_deepseek_v4_formats.py checks that each agrees with
mlx-vlm's model and with the release's weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import deepseek_v4_formats as formats
from tests.e2e.stoke_proc import one_turn

FOLDERS = ("official", "q4-g64", "q8-g64", "mxfp4", "mixed_2_6", "mlx-vlm")


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("downloads")
    model, metadata, _ = formats.source_model(root)
    official = root / "official"
    formats.write_official(model, official)
    formats.write_tokenizer(metadata, official)
    for recipe in ("q4-g64", "q8-g64", "mxfp4", "mixed_2_6"):
        formats.mlx_lm_folder(official, root / recipe, recipe, metadata)
    formats.mlx_vlm_folder(official, root / "mlx-vlm", metadata)
    return root


@pytest.mark.parametrize("folder", FOLDERS)
def test_stoke_chat_answers_from_the_folder(downloads: Path, folder: str, tmp_path: Path) -> None:
    answer = one_turn(tmp_path / "home", downloads / folder, "mlx", 4)
    assert answer["status"] == "complete"
    assert answer["stats"]["generated_tokens"] == 4
    assert answer["reply"]
