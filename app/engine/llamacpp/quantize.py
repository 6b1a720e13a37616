"""A GGUF written again with other weight types, through llama.cpp's own quantizer.

The tests make K-quant and IQ files of a synthetic model with it; `stoke bench decode
--weights bf16` uses it: the same model with weights that llamafile's
sgemm takes in batches, where the default model's Q4_1 runs a batch column by column, so
that the bench shows what speculation gives where a verify batch is cheaper per token.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from app.engine.protocol import EngineError

# each is llama.cpp's LLAMA_FTYPE_MOSTLY_<name>; the last two are what published DeepSeek V4
# files mostly hold (K-quants, IQ types), which the tests run as users get them
WEIGHT_TYPES = ("bf16", "f16", "q8_0", "q4_0", "q4_k_m", "iq4_xs")


def requantize(source: Path, target: Path, weights: str) -> Path:
    """Write `source` to `target` with `weights` (one of WEIGHT_TYPES). Weights that are
    already quantized are dequantized first, so a copy holds the source's values rounded
    once more, never better ones."""
    if weights not in WEIGHT_TYPES:
        raise EngineError(f"Unknown weight type {weights!r}: use one of {', '.join(WEIGHT_TYPES)}.")
    import llama_cpp  # here: the CLI's parser reads WEIGHT_TYPES without loading llama.cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{weights.upper()}")
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    if rc != 0 or not target.is_file():
        raise EngineError(f"llama.cpp could not write {source.name} with {weights} weights.")
    return target
