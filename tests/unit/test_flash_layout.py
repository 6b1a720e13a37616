"""The DeepSeek V4 Flash layout the catalog plans with ships as data: regenerating it from the
synthetic replica gives the shipped file byte for byte, and it loads back as the same header."""

from __future__ import annotations

import dataclasses
import json

from app import resources
from app.engine.gguf_info import GGUFInfo
from app.hardware.synthetic_gguf import flash_layout_text
from app.models import catalog


def test_the_shipped_layout_is_what_the_dev_command_writes() -> None:
    shipped = resources.read_text(catalog.FLASH_LAYOUT)
    assert flash_layout_text() == shipped, "run `stoke dev flash-layout` and commit the file"


def test_the_layout_loads_back_as_the_header_it_was_read_from() -> None:
    info = catalog.flash_layout()
    assert (info.architecture, info.block_count, len(info.tensors)) == ("deepseek4", 43, 1328)
    assert round(info.total_bytes / 2**20) == 148_899
    assert not any(key.startswith("tokenizer.") for key in info.metadata)
    again = GGUFInfo.from_dict(json.loads(json.dumps(info.to_dict())))
    assert again == info
    assert dataclasses.replace(again, tensors=()) != info
