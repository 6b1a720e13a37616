"""Tensor placement for llama.cpp loads: `-ot` overrides and the layer split, over ctypes.

llama-cpp-python binds `llama_model_params.tensor_buft_overrides` as an untyped pointer and
has no argument for it, so a plan's override list becomes a NULL-terminated C array of
`llama_model_tensor_buft_override` here, with buffer types from ggml's device registry
(`ggml.py`). llama.cpp reads the array, and the pattern strings in it, while it loads the
model: the objects returned as the keepalive must outlive `llama_model_load_from_file`.

With remote devices (`rpc.py`) the plan also names the devices to offload to, in order: a
NULL-terminated `llama_model_params.devices` array (which replaces llama.cpp's default list),
and the RPC devices' buffer types join the local ones for the overrides.
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
    devices: ctypes.Array | None = None


def local_devices() -> dict[str, int]:
    """Each device of ggml's registry here ("CUDA0", "CPU", ...) to its handle."""
    if ggml.ggml_backend_dev_count is None or ggml.ggml_backend_dev_get is None:
        return {}
    ggml.load_backends()
    handles = {}
    for index in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(index)
        if dev:
            handles[ggml.ggml_backend_dev_name(dev).decode("utf-8", "replace")] = dev
    return handles


def device_array(names: Sequence[str], extra: dict[str, int]) -> ctypes.Array | None:
    """`llama_model_params.devices` for `names` in order (local names, or the remote devices
    in `extra`: name -> handle); None for llama.cpp's default list."""
    if not names:
        return None
    handles = {**local_devices(), **extra}
    missing = [n for n in names if n not in handles]
    if missing:
        raise ValueError(
            f"The plan offloads to {', '.join(missing)}, which this process does not have "
            f"(devices: {', '.join(handles) or 'none'}). Plan again for these machines."
        )
    array = (ctypes.c_void_p * (len(names) + 1))(*(handles[n] for n in names))
    array[len(names)] = None
    return array


def buffer_types(extra: dict[str, int] | None = None) -> dict[str, int]:
    """Each ggml device's name ("CUDA0", "CPU", ...) to its default buffer type.

    `-ot X=CPU` in llama.cpp names the CPU device's buffer type, which is what llama.cpp
    compares against to pick the CPU's extra (repacking) buffer types, so "CPU" maps to it.
    """
    if ggml.ggml_backend_dev_buffer_type is None or ggml.ggml_backend_dev_name is None:
        return {}
    names: dict[str, int] = {}
    for name, dev in {**local_devices(), **(extra or {})}.items():
        buft = ggml.ggml_backend_dev_buffer_type(dev)
        if buft:
            names[name] = buft
    return names


def override_array(
    overrides: Sequence[tuple[str, str]], extra: dict[str, int] | None = None
) -> tuple[ctypes.Array | None, list[bytes]]:
    """The NULL-terminated C array for `overrides` ((regex, buffer type name) pairs, first
    match wins); None when there are none. Unknown device names raise ValueError."""
    if not overrides:
        return None, []
    bufts = buffer_types(extra)
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
    devices: Sequence[str] = (),
    remote: dict[str, int] | None = None,
) -> Keepalive:
    """Set `tensor_buft_overrides`, with a tensor split the layer split mode and split, and
    with `devices` the offload devices in order (`remote`: the RPC devices' handles by name),
    on `mparams`. Keep the returned object referenced until the model has loaded."""
    array, patterns = override_array(overrides, remote)
    mparams.tensor_buft_overrides = ctypes.addressof(array) if array is not None else None
    listed = device_array(devices, remote or {})
    mparams.devices = ctypes.addressof(listed) if listed is not None else None
    split = None
    if tensor_split:
        n_max = llama_cpp.llama_max_devices()
        if len(tensor_split) > n_max:
            raise ValueError(f"llama.cpp splits across at most {n_max} devices")
        split = (ctypes.c_float * n_max)(*tensor_split)
        mparams.tensor_split = split
        mparams.split_mode = llama_cpp.LLAMA_SPLIT_MODE_LAYER
    return Keepalive(array, patterns, split, listed)
