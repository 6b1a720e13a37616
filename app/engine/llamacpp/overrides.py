"""Tensor placement for llama.cpp loads: `-ot` overrides and the layer split, over ctypes.

llama-cpp-python binds `llama_model_params.tensor_buft_overrides` as an untyped pointer and
has no argument for it, so a plan's override list becomes a NULL-terminated C array of
`llama_model_tensor_buft_override` here, with buffer types from ggml's device registry
(`ggml.py`). llama.cpp reads the array, and the pattern strings in it, while it loads the
model: the objects returned as the keepalive must outlive `llama_model_load_from_file`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp

from app.engine.llamacpp import ggml


class llama_model_tensor_buft_override(ctypes.Structure):
    """struct llama_model_tensor_buft_override { const char * pattern;
    ggml_backend_buffer_type_t buft; };"""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass
class Keepalive:
    """What llama.cpp points into until the model is loaded (and, for tensor_split, for as
    long as the model lives: llama.cpp copies it, but keeping it costs nothing)."""

    overrides: ctypes.Array | None
    patterns: list[bytes]
    tensor_split: ctypes.Array | None


def buffer_types() -> dict[str, int]:
    """Each ggml device's name ("CUDA0", "CPU", ...) to its default buffer type.

    `-ot X=CPU` in llama.cpp names the CPU device's buffer type, which is what llama.cpp
    compares against to pick the CPU's extra (repacking) buffer types, so "CPU" maps to it.
    """
    if ggml.ggml_backend_dev_count is None or ggml.ggml_backend_dev_get is None:
        return {}
    if ggml.ggml_backend_dev_buffer_type is None or ggml.ggml_backend_dev_name is None:
        return {}
    ggml.load_backends()
    names: dict[str, int] = {}
    for index in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(index)
        if not dev:
            continue
        name = ggml.ggml_backend_dev_name(dev).decode("utf-8", "replace")
        buft = ggml.ggml_backend_dev_buffer_type(dev)
        if buft:
            names[name] = buft
    return names


def override_array(
    overrides: Sequence[tuple[str, str]],
) -> tuple[ctypes.Array | None, list[bytes]]:
    """The NULL-terminated C array for `overrides` ((regex, buffer type name) pairs, first
    match wins); None when there are none. Unknown device names raise ValueError."""
    if not overrides:
        return None, []
    bufts = buffer_types()
    array = (llama_model_tensor_buft_override * (len(overrides) + 1))()
    patterns = []
    for i, (pattern, device) in enumerate(overrides):
        if device not in bufts:
            known = ", ".join(bufts) or "none"
            raise ValueError(
                f"The plan puts tensors on {device}, which this llama.cpp build does not "
                f"have (devices: {known}). Plan again for this machine."
            )
        raw = pattern.encode()
        patterns.append(raw)
        array[i].pattern = raw
        array[i].buft = bufts[device]
    array[len(overrides)].pattern = None  # the terminator llama.cpp stops at
    array[len(overrides)].buft = None
    return array, patterns


def apply_overrides(
    mparams: llama_cpp.llama_model_params,
    overrides: Sequence[tuple[str, str]],
    *,
    tensor_split: Sequence[float] | None = None,
) -> Keepalive:
    """Set `tensor_buft_overrides`, and with a tensor split the layer split mode and split,
    on `mparams`. Keep the returned object referenced until the model has loaded."""
    array, patterns = override_array(overrides)
    mparams.tensor_buft_overrides = ctypes.addressof(array) if array is not None else None
    split = None
    if tensor_split:
        n_max = llama_cpp.llama_max_devices()
        if len(tensor_split) > n_max:
            raise ValueError(f"llama.cpp splits across at most {n_max} devices")
        split = (ctypes.c_float * n_max)(*tensor_split)
        mparams.tensor_split = split
        mparams.split_mode = llama_cpp.LLAMA_SPLIT_MODE_LAYER
    return Keepalive(array, patterns, split)
