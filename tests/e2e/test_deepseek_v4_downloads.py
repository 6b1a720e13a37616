"""`stoke chat --engine mlx --model FOLDER` answers for DeepSeek V4 folders in each layout
people download them in: the FP8/FP4 release itself, an mlx-lm conversion of it (4-bit at
group 64, as mlx-community uploads it) and mlx-vlm's (its own mixed recipe, keys under
`language_model.`). Each folder is a tiny model (tests/deepseek_v4_formats.py) with its
tokenizer and chat template, run by the real CLI in a process of its own. The CLI reaches
every recipe through one loader, `load_model`, which tests/unit/test_deepseek_v4_formats.py
runs on each mlx-lm recipe (8-bit, mxfp4, the mixed 2/6-bit one, ...), checking that each
agrees with mlx-vlm's model and with the release's weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import deepseek_v4_formats as formats
from tests.e2e.stoke_proc import one_turn

FOLDERS = ("official", "q4-g64", "mlx-vlm")


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("downloads")
    model, metadata, _ = formats.source_model(root)
    official = root / "official"
    formats.write_official(model, official)
    formats.write_tokenizer(metadata, official)
    formats.mlx_lm_folder(official, root / "q4-g64", "q4-g64", metadata)
    formats.mlx_vlm_folder(official, root / "mlx-vlm", metadata)
    return root


@pytest.mark.parametrize("folder", FOLDERS)
def test_stoke_chat_answers_from_the_folder(downloads: Path, folder: str, stoke_home: Path) -> None:
    answer = one_turn(stoke_home, downloads / folder, "mlx", 4)
    assert answer["status"] == "complete"
    assert answer["stats"]["generated_tokens"] == 4
    assert answer["reply"]
