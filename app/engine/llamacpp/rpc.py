"""llama.cpp's RPC devices: an `rpc-server` on another machine, as devices of this process.

ggml-rpc (`ggml/src/ggml-rpc`, llama-cpp-python 0.3.36) adds a server through the RPC
backend's proc address `ggml_backend_rpc_add_server(endpoint)`, which connects, says HELLO,
asks how many devices the server has and returns a backend registry holding them; each device
answers `ggml_backend_dev_memory` with one round trip. It has no error path: a server that
cannot be reached, or that dies while a graph runs, ends the whole process in `GGML_ABORT`
("Remote RPC server crashed or returned malformed response"). So this module first asks the
operating system whether anything listens (`rpc_devices.unreachable`), and the callers keep every
connection in a process that may die: the engine worker (its host turns the death into
words) or the probe child of `app/hardware/rpc.py`.

Devices are named as their buffer types are, `RPC<index on its server>[host:port]`: stable
whatever order the servers are added in, and what llama-server's `-ot` accepts.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from dataclasses import dataclass

from app.engine.llamacpp import ggml
from app.engine.protocol import ModelLoadError
from app.engine.rpc_devices import device_name, unreachable


@dataclass(frozen=True)
class RpcDevice:
    """One device of an rpc-server, with its handle in this process."""

    name: str  # "RPC0[host:port]"
    endpoint: str
    index: int  # on its server
    handle: int  # ggml_backend_dev_t
    memory_free: int
    memory_total: int


_servers: dict[str, list[RpcDevice]] = {}


def add_server(endpoint: str) -> list[RpcDevice]:
    """The devices of the rpc-server at `endpoint`, connected in this process (once per
    endpoint). Raises RuntimeError in words when the build or the server cannot; check
    `unreachable` first: a server that goes away between the two ends the process."""
    if endpoint in _servers:
        return _servers[endpoint]
    if not ggml.rpc_supported():
        raise RuntimeError(
            "This llama-cpp-python was built without RPC, so it cannot use rpc-server "
            "devices. Rebuild it with RPC: `python packaging/llama_build.py install` in "
            'Stoke\'s checkout, or CMAKE_ARGS="-DGGML_RPC=ON" pip install --force-reinstall '
            "--no-cache-dir llama-cpp-python==0.3.36."
        )
    needed = (ggml.ggml_backend_reg_by_name, ggml.ggml_backend_reg_get_proc_address)
    if any(f is None for f in needed) or ggml.ggml_backend_reg_dev_get is None:
        raise RuntimeError("This ggml library does not export the RPC registry calls.")
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not reg or not address:
        raise RuntimeError("This ggml library has no ggml_backend_rpc_add_server.")
    server = ggml.ggml_backend_rpc_add_server_t(address)(endpoint.encode())
    if not server:
        raise RuntimeError(f"The rpc-server at {endpoint} reports no devices.")
    devices = []
    for index in range(ggml.ggml_backend_reg_dev_count(server)):
        handle = ggml.ggml_backend_reg_dev_get(server, index)
        free, total = _memory(handle)
        devices.append(
            RpcDevice(device_name(endpoint, index), endpoint, index, handle, free, total)
        )
    _servers[endpoint] = devices
    return devices


def _memory(handle: int) -> tuple[int, int]:
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    ggml.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def round_trip_s(device: RpcDevice, n: int = 9) -> float:
    """The median time of a device-memory question: one request and its answer, the link's
    round trip plus the server's (tiny) work."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        _memory(device.handle)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def connect(endpoints: tuple[str, ...]) -> dict[str, int]:
    """Every device of these rpc-servers, by name, for a model load; ModelLoadError in words
    when one cannot be reached (checked first: ggml-rpc would end the process)."""
    devices: dict[str, int] = {}
    for endpoint in endpoints:
        problem = unreachable(endpoint)
        if problem:
            raise ModelLoadError(f"The rpc-server at {endpoint} cannot be used: {problem}.")
        try:
            devices.update((d.name, d.handle) for d in add_server(endpoint))
        except RuntimeError as exc:
            raise ModelLoadError(str(exc)) from None
    return devices
