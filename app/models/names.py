"""What a model is called, in one place: the header, the model picker, the library, the API's
model list and the CLI all name a model by its file (or folder), never by the GGUF's
`general.name` (a training run's label such as "Smollm2 135M 8k Lc100K Mix1 Ep2"), so a
user sees one name for one model everywhere.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_SPLIT = re.compile(r"^(?P<stem>.+)-\d{5}-of-\d{5}\.gguf$")


def model_name(path: str | os.PathLike[str]) -> str:
    """A model's display name: a GGUF's file name without `.gguf` (a split set's without its
    part numbers), or an MLX folder's name."""
    name = Path(path).name
    match = _SPLIT.match(name)
    if match:
        return match["stem"]
    return name.removesuffix(".gguf")
