"""ctypes bindings for the parts of libggml that llama-cpp-python leaves unbound.

llama-cpp-python binds libllama only, but placing tensors on devices (`tensor_buft_overrides`)
needs ggml's device registry: which devices exist, how much memory each has free, and each
one's buffer type. As in llama-cpp-python's `llama_cpp.py`, the top of this module mirrors the
C API one-to-one; the friendly functions at the bottom are what the rest of Stoke calls.

Every binding is None when the shipped libraries lack that symbol (an older or unusual build),
so callers learn what they can instead of crashing.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import llama_cpp

LIB_DIR = Path(llama_cpp.__file__).resolve().parent / "lib"


def _load(base_name: str) -> ctypes.CDLL | None:
    """The shipped library `lib<base_name>`, the same one libllama already has loaded."""
    for suffix in (".so", ".dylib"):
        path = LIB_DIR / f"lib{base_name}{suffix}"
        if path.exists():
            try:
                return ctypes.CDLL(str(path))
            except OSError:
                return None
    return None


# libggml-base holds the per-device calls, libggml the registry that enumerates devices.
_libs = [lib for lib in (_load("ggml-base"), _load("ggml")) if lib is not None]


def _bind(name: str, argtypes: list[Any], restype: Any) -> Callable[..., Any] | None:
    """The C function `name` from whichever ggml library exports it, typed; None if none does."""
    for lib in _libs:
        try:
            func = getattr(lib, name)
        except AttributeError:
            continue
        func.argtypes = argtypes
        func.restype = restype
        return func
    return None


# -- types (opaque handles are plain pointers) ---------------------------------------------

ggml_backend_dev_t = ctypes.c_void_p
ggml_backend_buffer_type_t = ctypes.c_void_p
ggml_backend_reg_t = ctypes.c_void_p

# enum ggml_backend_dev_type (ggml-backend.h)
GGML_BACKEND_DEVICE_TYPE_CPU = 0
GGML_BACKEND_DEVICE_TYPE_GPU = 1
GGML_BACKEND_DEVICE_TYPE_IGPU = 2
GGML_BACKEND_DEVICE_TYPE_ACCEL = 3
GGML_BACKEND_DEVICE_TYPE_META = 4

# -- backend registry (libggml) -------------------------------------------------------------

# GGML_API size_t ggml_backend_reg_count(void);
ggml_backend_reg_count = _bind("ggml_backend_reg_count", [], ctypes.c_size_t)

# GGML_API size_t ggml_backend_dev_count(void);
ggml_backend_dev_count = _bind("ggml_backend_dev_count", [], ctypes.c_size_t)

# GGML_API ggml_backend_dev_t ggml_backend_dev_get(size_t index);
ggml_backend_dev_get = _bind("ggml_backend_dev_get", [ctypes.c_size_t], ggml_backend_dev_t)

# GGML_API ggml_backend_reg_t ggml_backend_reg_by_name(const char * name);
ggml_backend_reg_by_name = _bind("ggml_backend_reg_by_name", [ctypes.c_char_p], ggml_backend_reg_t)

# GGML_API void ggml_backend_load_all_from_path(const char * dir_path);
ggml_backend_load_all_from_path = _bind("ggml_backend_load_all_from_path", [ctypes.c_char_p], None)

# GGML_API size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg);
ggml_backend_reg_dev_count = _bind(
    "ggml_backend_reg_dev_count", [ggml_backend_reg_t], ctypes.c_size_t
)

# GGML_API ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index);
ggml_backend_reg_dev_get = _bind(
    "ggml_backend_reg_dev_get", [ggml_backend_reg_t, ctypes.c_size_t], ggml_backend_dev_t
)

# typedef ggml_backend_reg_t (*ggml_backend_rpc_add_server_t)(const char * endpoint);
# (the RPC backend's proc address "ggml_backend_rpc_add_server", ggml-rpc.h)
ggml_backend_rpc_add_server_t = ctypes.CFUNCTYPE(ggml_backend_reg_t, ctypes.c_char_p)

# -- devices (libggml-base) -----------------------------------------------------------------

# GGML_API const char * ggml_backend_dev_name(ggml_backend_dev_t device);
ggml_backend_dev_name = _bind("ggml_backend_dev_name", [ggml_backend_dev_t], ctypes.c_char_p)

# GGML_API const char * ggml_backend_dev_description(ggml_backend_dev_t device);
ggml_backend_dev_description = _bind(
    "ggml_backend_dev_description", [ggml_backend_dev_t], ctypes.c_char_p
)

# GGML_API void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
ggml_backend_dev_memory = _bind(
    "ggml_backend_dev_memory",
    [ggml_backend_dev_t, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
    None,
)

# GGML_API enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
ggml_backend_dev_type = _bind("ggml_backend_dev_type", [ggml_backend_dev_t], ctypes.c_int)

# GGML_API ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device);
ggml_backend_dev_buffer_type = _bind(
    "ggml_backend_dev_buffer_type", [ggml_backend_dev_t], ggml_backend_buffer_type_t
)

# GGML_API ggml_backend_dev_t ggml_backend_dev_by_type(enum ggml_backend_dev_type type);
ggml_backend_dev_by_type = _bind("ggml_backend_dev_by_type", [ctypes.c_int], ggml_backend_dev_t)

# GGML_API ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device);
ggml_backend_dev_backend_reg = _bind(
    "ggml_backend_dev_backend_reg", [ggml_backend_dev_t], ggml_backend_reg_t
)

# GGML_API void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name);
ggml_backend_reg_get_proc_address = _bind(
    "ggml_backend_reg_get_proc_address", [ggml_backend_reg_t, ctypes.c_char_p], ctypes.c_void_p
)

# GGML_API const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
ggml_backend_buft_name = _bind(
    "ggml_backend_buft_name", [ggml_backend_buffer_type_t], ctypes.c_char_p
)

# typedef ggml_backend_buffer_type_t * (*ggml_backend_dev_get_extra_bufts_t)(ggml_backend_dev_t);
# (a CPU backend proc address, "ggml_backend_dev_get_extra_bufts": a NULL-terminated array)
ggml_backend_dev_get_extra_bufts_t = ctypes.CFUNCTYPE(
    ctypes.POINTER(ggml_backend_buffer_type_t), ggml_backend_dev_t
)

# -- friendly functions ---------------------------------------------------------------------

DeviceKind = Literal["cpu", "gpu", "igpu", "accel", "meta", "unknown"]

_KINDS: dict[int, DeviceKind] = {
    GGML_BACKEND_DEVICE_TYPE_CPU: "cpu",
    GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
    GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu",
    GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel",
    GGML_BACKEND_DEVICE_TYPE_META: "meta",
}


@dataclass(frozen=True)
class Device:
    """One ggml device as llama.cpp sees it; `index` is its place in ggml's registry."""

    index: int
    name: str
    description: str
    kind: DeviceKind
    memory_free: int
    memory_total: int


@functools.cache
def load_backends() -> None:
    """Register ggml's backends once, before anything asks for devices.

    Builds with GGML_BACKEND_DL ship each backend as a plugin library that nothing registers
    until asked; statically linked builds have registered theirs already and are left alone.
    """
    llama_cpp.llama_backend_init()
    if ggml_backend_reg_count is None or ggml_backend_load_all_from_path is None:
        return
    if ggml_backend_reg_count() == 0:
        ggml_backend_load_all_from_path(str(LIB_DIR).encode())


def _text(func: Callable[..., Any] | None, dev: int) -> str:
    value = func(dev) if func is not None else None
    return value.decode("utf-8", "replace") if value else ""


def _device(index: int, dev: int) -> Device:
    free = ctypes.c_size_t(0)
    total = ctypes.c_size_t(0)
    if ggml_backend_dev_memory is not None:
        ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    kind_id = ggml_backend_dev_type(dev) if ggml_backend_dev_type is not None else -1
    return Device(
        index=index,
        name=_text(ggml_backend_dev_name, dev),
        description=_text(ggml_backend_dev_description, dev),
        kind=_KINDS.get(kind_id, "unknown"),
        memory_free=free.value,
        memory_total=total.value,
    )


def list_devices() -> list[Device]:
    """Every device llama.cpp can place tensors on, with its memory in bytes.

    Asking a CUDA device for its memory creates a CUDA context in this process, so call this
    from the engine host or a short-lived command, not from the GUI process.
    """
    if ggml_backend_dev_count is None or ggml_backend_dev_get is None:
        return []
    load_backends()
    devices = []
    for index in range(ggml_backend_dev_count()):
        dev = ggml_backend_dev_get(index)
        if dev:
            devices.append(_device(index, dev))
    return devices


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build has a GPU to offload layers to. llama.cpp's own
    `llama_supports_gpu_offload` also says yes for the RPC backend, so a CPU-only build with
    RPC claimed offload on a machine without a GPU; the devices' kinds are asked instead
    (their kind only: no device memory is queried, so no GPU context is made)."""
    load_backends()
    if (
        ggml_backend_dev_count is None
        or ggml_backend_dev_get is None
        or ggml_backend_dev_type is None
    ):
        return bool(llama_cpp.llama_supports_gpu_offload())
    gpu_kinds = (GGML_BACKEND_DEVICE_TYPE_GPU, GGML_BACKEND_DEVICE_TYPE_IGPU)
    return any(
        ggml_backend_dev_type(ggml_backend_dev_get(i)) in gpu_kinds
        for i in range(ggml_backend_dev_count())
    )


def rpc_supported() -> bool:
    """Whether this llama.cpp build has the RPC backend (built with GGML_RPC=ON), which adds
    other machines' `rpc-server` devices to this process's."""
    if ggml_backend_reg_by_name is None:
        return False
    load_backends()
    return bool(ggml_backend_reg_by_name(b"RPC"))


def cpu_extra_buffer_types() -> ctypes.Array | None:
    """The CPU device's extra buffer types ("AMX", "CPU_REPACK", ...): llama.cpp's own
    NULL-terminated table, which it reads again at every model load; None if this build
    has no such table."""
    needed = (
        ggml_backend_dev_by_type,
        ggml_backend_dev_backend_reg,
        ggml_backend_reg_get_proc_address,
    )
    if any(func is None for func in needed):
        return None
    load_backends()
    cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    if not cpu:
        return None
    address = ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(cpu), b"ggml_backend_dev_get_extra_bufts"
    )
    if not address:
        return None
    table = ggml_backend_dev_get_extra_bufts_t(address)(cpu)
    return table or None


def buffer_type_name(buft: int) -> str:
    return _text(ggml_backend_buft_name, buft)
