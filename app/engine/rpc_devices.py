"""Which rpc-servers a load uses, told apart without llama.cpp: plain sockets and LoadOptions.

The engine host lives in the app's process, which must not load llama.cpp, yet it has to
know, when its engine process dies, whether an rpc-server went away (ggml-rpc ends the engine
process on a lost server; `llamacpp/rpc.py`), and then load again without it. So the
endpoint checks and the options without a lost server are here, in plain Python.

Without a lost server, every remaining device keeps the number of layers it had (its memory
was planned for them) and this machine takes the lost one's: llama.cpp keeps the first
`n_layer + 1 - n_gpu_layers` layers on the CPU, so lowering n_gpu_layers by the lost count
moves exactly that many layers here. Expert overrides that named the lost devices go; their
experts follow their layers.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import replace

from app.engine.protocol import LoadOptions

CONNECT_TIMEOUT_S = 3.0
DROP_CHOICES = ("reload", "wait")


def device_name(endpoint: str, index: int) -> str:
    """An RPC device as its buffer type is named: stable in any order of servers, and what
    llama-server's `-ot` accepts."""
    return f"RPC{index}[{endpoint}]"


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """`host:port` -> (host, port); ValueError in words when it is not one."""
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{endpoint!r} is not HOST:PORT (an rpc-server's address, e.g. mac:50052)")
    return host.strip("[]"), int(port)


def unreachable(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when something listens at `endpoint`, else why not, in words. A bare TCP connect,
    closed at once: an rpc-server drops such a client and accepts the next."""
    try:
        host, port = split_endpoint(endpoint)
    except ValueError as exc:
        return str(exc)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror:
        return f"no machine is called {host!r} (the name does not resolve)"
    except ConnectionRefusedError:
        return f"nothing listens at {endpoint} (is rpc-server running there?)"
    except TimeoutError:
        return f"{endpoint} did not answer within {timeout:g} s"
    except OSError as exc:
        return f"{endpoint} cannot be reached ({exc.strerror or exc})"


def lost_servers(options: LoadOptions, timeout: float = CONNECT_TIMEOUT_S) -> list[str]:
    """The options' rpc-servers that no longer answer."""
    return [e for e in options.rpc_servers if unreachable(e, timeout) is not None]


def without(options: LoadOptions, lost: Iterable[str]) -> LoadOptions:
    """`options` with the `lost` servers' devices taken out (see the module docstring)."""
    lost = set(lost)
    gone = {n for n in options.devices if any(n.endswith(f"[{e}]") for e in lost)}
    if options.tensor_split and len(options.tensor_split) == len(options.devices):
        pairs = list(zip(options.devices, options.tensor_split, strict=True))
    else:  # one device held every offloaded layer
        pairs = [(n, float(options.n_gpu_layers)) for n in options.devices]
    kept = [(n, c) for n, c in pairs if n not in gone]
    freed = round(sum(c for n, c in pairs if n in gone))
    return replace(
        options,
        rpc_servers=tuple(e for e in options.rpc_servers if e not in lost),
        devices=tuple(n for n, _ in kept),
        tensor_split=tuple(c for _, c in kept) if len(kept) > 1 else (),
        n_gpu_layers=max(0, options.n_gpu_layers - freed) if kept else 0,
        overrides=tuple(o for o in options.overrides if o[1] not in gone),
    )
