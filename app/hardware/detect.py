"""What this machine has to run a model with: cores, memory, disk, GPUs, unified memory.

The planner and the hardware wizard need budgets, not brand names, so everything here ends
in bytes. GPUs are listed the way llama.cpp will see them (ggml's device registry, with each
device's free and total memory), because a plan names those devices ("CUDA0") in its
overrides. Asking a CUDA device for its memory creates a CUDA context in the asking process
(`ggml.list_devices`), which the GUI process must not carry around, so that question goes to
a short-lived subprocess. NVML and MLX add details where they exist and are skipped silently
where they do not. No psutil: /proc/meminfo and sysctl say enough.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from app import paths

LLAMA_CPP_VERSION = "0.3.36"
_SUBPROCESS_TIMEOUT_S = 120


@dataclass(frozen=True)
class CpuInfo:
    name: str
    logical_cores: int
    physical_cores: int | None


@dataclass(frozen=True)
class MemoryInfo:
    total: int
    available: int


@dataclass(frozen=True)
class GpuInfo:
    """One ggml device other than the CPU: `name` is what a plan's overrides name."""

    index: int
    name: str
    description: str
    kind: str  # "gpu", "igpu", "accel"
    backend: str  # "cuda", "rocm", "metal", "vulkan", "sycl", ... (from the device name)
    memory_free: int
    memory_total: int


@dataclass(frozen=True)
class NvmlInfo:
    driver_version: str
    gpus: tuple[tuple[str, int, int], ...]  # (name, total, free) per NVIDIA GPU


@dataclass(frozen=True)
class AppleInfo:
    chip: str
    unified_memory: int
    metal_working_set: int | None  # what Metal lets one process keep resident


@dataclass(frozen=True)
class Hardware:
    os: str
    machine: str
    cpu: CpuInfo
    memory: MemoryInfo
    models_dir: str
    disk_free: int
    gpus: tuple[GpuInfo, ...]
    gpu_offload: bool
    rebuild_hint: str | None
    nvml: NvmlInfo | None = None
    apple: AppleInfo | None = None
    notes: tuple[str, ...] = field(default=())


# -- CPU, RAM, disk ---------------------------------------------------------------------------


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _cpu() -> CpuInfo:
    logical = os.cpu_count() or 1
    if sys.platform == "darwin":
        physical = _sysctl("hw.physicalcpu")
        return CpuInfo(
            _sysctl("machdep.cpu.brand_string") or platform.processor() or "unknown",
            logical,
            int(physical) if physical and physical.isdigit() else None,
        )
    name, cores = platform.processor() or "unknown", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return CpuInfo(name, logical, None)
    phys = core = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name":
            name = value
        elif key == "physical id":
            phys = value
        elif key == "core id":
            core = value
        elif not key and core is not None:
            cores.add((phys, core))
            phys = core = None
    if core is not None:
        cores.add((phys, core))
    return CpuInfo(name, logical, len(cores) or None)


def _meminfo(text: str) -> MemoryInfo:
    """MemTotal and MemAvailable from /proc/meminfo (kB)."""
    values = {}
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+)\s*kB", line)
        if m:
            values[m[1]] = int(m[2]) * 1024
    total = values.get("MemTotal", 0)
    available = values.get("MemAvailable", values.get("MemFree", 0))
    return MemoryInfo(total, available)


def system_memory() -> MemoryInfo:
    """RAM in all and available now (MemAvailable; on a Mac free + inactive + speculative):
    the one figure every place that names free RAM shows."""
    if sys.platform == "darwin":
        total = int(_sysctl("hw.memsize") or 0)
        return MemoryInfo(total, _darwin_available() or total)
    try:
        return _meminfo(Path("/proc/meminfo").read_text())
    except OSError:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return MemoryInfo(pages * size, pages * size)


def _darwin_available() -> int | None:
    """Free + inactive + speculative pages: what macOS hands out without swapping."""
    try:
        out = subprocess.run(["vm_stat"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    page = re.search(r"page size of (\d+) bytes", out)
    counts = dict(re.findall(r"Pages (free|inactive|speculative):\s+(\d+)", out))
    if not page or not counts:
        return None
    return int(page[1]) * sum(int(v) for v in counts.values())


# -- GPUs -------------------------------------------------------------------------------------


def _backend_of(name: str) -> str:
    for prefix, backend in (
        ("CUDA", "cuda"),
        ("ROCm", "rocm"),
        ("HIP", "rocm"),
        ("MTL", "metal"),
        ("Metal", "metal"),
        ("Vulkan", "vulkan"),
        ("SYCL", "sycl"),
        ("OpenCL", "opencl"),
        ("RPC", "rpc"),
    ):
        if name.startswith(prefix):
            return backend
    return name.rstrip("0123456789").lower() or "unknown"


def _local_devices() -> dict[str, object]:
    """ggml devices and GPU support, asked in this process (creates GPU contexts)."""
    from app.engine.llamacpp import ggml

    devices = [
        {
            "index": d.index,
            "name": d.name,
            "description": d.description,
            "kind": d.kind,
            "memory_free": d.memory_free,
            "memory_total": d.memory_total,
        }
        for d in ggml.list_devices()
    ]
    return {"devices": cpu_as_system(devices), "gpu_offload": ggml.gpu_offload_supported()}


def cpu_as_system(devices: list[dict[str, object]]) -> list[dict[str, object]]:
    """The CPU device's memory as `system_memory` counts it: ggml's own figure (free pages,
    not what the system can hand out) put 19.4 GiB beside the wizard's 23.5 GiB."""
    ram = system_memory()
    return [
        {**d, "memory_free": ram.available, "memory_total": ram.total} if d["kind"] == "cpu" else d
        for d in devices
    ]


def _devices_in_subprocess() -> tuple[dict[str, object], str | None]:
    """`_local_devices` in a child process, so no GPU context stays in this one."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "app.hardware.detect", "--ggml-devices"],
            capture_output=True,
            text=True,
            timeout=_SUBPROCESS_TIMEOUT_S,
            cwd=Path(__file__).resolve().parents[2],
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"devices": [], "gpu_offload": False}, f"could not list GPUs: {exc}"
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line), None
    reason = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return {"devices": [], "gpu_offload": False}, f"could not list GPUs: {reason}"


def _nvml() -> NvmlInfo | None:
    """Driver version and GPUs from NVML, which needs no CUDA context; None without it."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None

    class Memory(ctypes.Structure):
        _fields_ = [
            ("total", ctypes.c_ulonglong),
            ("free", ctypes.c_ulonglong),
            ("used", ctypes.c_ulonglong),
        ]

    try:
        if lib.nvmlInit_v2() != 0:
            return None
    except AttributeError:
        return None
    try:
        buf = ctypes.create_string_buffer(96)
        driver = buf.value.decode() if lib.nvmlSystemGetDriverVersion(buf, 96) == 0 else ""
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return NvmlInfo(driver, ())
        gpus = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue
            name = ctypes.create_string_buffer(96)
            lib.nvmlDeviceGetName(handle, name, 96)
            mem = Memory()
            lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem))
            gpus.append((name.value.decode("utf-8", "replace"), mem.total, mem.free))
        return NvmlInfo(driver, tuple(gpus))
    except (AttributeError, OSError):
        return None
    finally:
        lib.nvmlShutdown()


def _apple() -> AppleInfo | None:
    """Apple Silicon: the chip, unified memory, and Metal's working-set limit (from MLX)."""
    if sys.platform != "darwin" or platform.machine() != "arm64":
        return None
    chip = _sysctl("machdep.cpu.brand_string") or "Apple Silicon"
    memory = int(_sysctl("hw.memsize") or 0)
    working_set = None
    try:
        import mlx.core as mx

        info = mx.metal.device_info()
        working_set = int(info.get("max_recommended_working_set_size", 0)) or None
        memory = int(info.get("memory_size", memory))
    except Exception:  # MLX missing, or built without Metal: the sysctl numbers stand
        pass
    return AppleInfo(chip, memory, working_set)


def rebuild_hint(nvml: NvmlInfo | None = None) -> str:
    """How to reinstall llama-cpp-python with GPU offload for this machine, in plain words."""
    pip = f"pip install --force-reinstall --no-cache-dir llama-cpp-python=={LLAMA_CPP_VERSION}"
    if sys.platform == "darwin":
        return (
            "This llama-cpp-python cannot use the GPU. Reinstall it with Metal: "
            f'CMAKE_ARGS="-DGGML_METAL=on" {pip}'
        )
    if nvml is not None or Path("/proc/driver/nvidia").exists():
        return (
            "This llama-cpp-python was built without GPU support, so the NVIDIA GPU sits idle. "
            f'Reinstall it with CUDA (needs the CUDA toolkit): CMAKE_ARGS="-DGGML_CUDA=on" {pip}'
        )
    if Path("/dev/kfd").exists() or Path("/opt/rocm").exists():
        return (
            "This llama-cpp-python was built without GPU support, so the AMD GPU sits idle. "
            f'Reinstall it with ROCm: CMAKE_ARGS="-DGGML_HIP=on" {pip}'
        )
    return (
        "This llama-cpp-python runs on the CPU only. With an NVIDIA GPU reinstall it with "
        f'CMAKE_ARGS="-DGGML_CUDA=on" {pip}; AMD: CMAKE_ARGS="-DGGML_HIP=on"; '
        'Apple: CMAKE_ARGS="-DGGML_METAL=on".'
    )


def detect(*, in_process: bool = False) -> Hardware:
    """Everything the planner and the wizard need. `in_process` asks ggml here instead of in
    a subprocess (the engine host, or a command that exits right after)."""
    notes: list[str] = []
    if in_process:
        ggml_info: dict[str, object] = _local_devices()
    else:
        ggml_info, problem = _devices_in_subprocess()
        if problem:
            notes.append(problem)
    gpus = tuple(
        GpuInfo(
            index=int(d["index"]),
            name=str(d["name"]),
            description=str(d["description"]),
            kind=str(d["kind"]),
            backend=_backend_of(str(d["name"])),
            memory_free=int(d["memory_free"]),
            memory_total=int(d["memory_total"]),
        )
        for d in ggml_info.get("devices", [])  # type: ignore[union-attr]
        if d["kind"] in ("gpu", "igpu", "accel")
    )
    nvml = _nvml()
    offload = bool(ggml_info.get("gpu_offload"))
    models = paths.models_dir()
    return Hardware(
        os=platform.system(),
        machine=platform.machine(),
        cpu=_cpu(),
        memory=system_memory(),
        models_dir=str(models),
        disk_free=shutil.disk_usage(models).free,
        gpus=gpus,
        gpu_offload=offload,
        rebuild_hint=None if offload else rebuild_hint(nvml),
        nvml=nvml,
        apple=_apple(),
        notes=tuple(notes),
    )


if __name__ == "__main__" and "--ggml-devices" in sys.argv:
    print(json.dumps(_local_devices()))
