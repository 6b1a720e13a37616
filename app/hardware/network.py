"""What a split over several machines costs on the network, token by token.

llama.cpp's RPC client is the hub of a star: every tensor that moves between two devices of
different machines goes through this machine (ggml-rpc copies tensors server-side only within
one server, `ggml_backend_rpc_buffer_cpy_tensor`; otherwise the scheduler reads the tensor back
and sends it on). So, with each machine holding one contiguous range of layers:

- the residual stream crosses a remote machine's link once on the way in and once on the
  way out: `hidden x 4 bytes` (f32 activations; DeepSeek V4 carries `hyper_connection.count`
  streams of it) each time, and the way out is a synchronous read, one round trip;
- a layer whose experts stay on another machine than the layer sends its activations there
  and back for that layer alone;
- when the output layer is remote, the logits (`vocab x 4 bytes`) come back instead of the
  residual (for a prefill batch, only its last row's).

A prefill micro-batch of N tokens moves N times the bytes with the same number of round trips.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.engine.gguf_info import GGUFInfo
from app.hardware.placement import DeviceBudget, Group, Link, layer_ranges

F32 = 4


@dataclass(frozen=True)
class LinkTraffic:
    """One remote machine's link: what one decoded token sends over it and how long that takes."""

    machine: str
    link: str  # as written ("10GbE", "1GbE (assumed)")
    bandwidth: int  # bytes per second
    rtt_s: float | None
    bytes_per_token: int
    round_trips: int  # synchronous reads per token
    seconds_per_token: float  # bytes at the link's rate, plus the round trips where known
    prefill_bytes: int  # for one micro-batch
    prefill_seconds: float


def residual_bytes(info: GGUFInfo) -> int:
    """Bytes of one token's residual stream between two layers (f32)."""
    streams = int(info.metadata.get(f"{info.architecture}.hyper_connection.count", 1) or 1)
    return (info.embedding_length or 0) * streams * F32


def unit_machines(
    devices: Sequence[DeviceBudget], counts: Sequence[int], n_units: int
) -> list[str]:
    """The machine of each unit (layers, then the output) under a split; "" is this one."""
    machines = [""] * n_units
    for device, r in zip(devices, layer_ranges(counts), strict=True):
        for u in r:
            if u < n_units:
                machines[u] = device.machine
    return machines


def traffic(
    info: GGUFInfo,
    devices: Sequence[DeviceBudget],
    counts: Sequence[int],
    expert_home: dict[int, str],
    n_ubatch: int,
) -> tuple[list[LinkTraffic], list[int]]:
    """Per remote machine, what one token and one micro-batch send over its link; and the
    layers whose experts live on another machine than the layer (`expert_home`: layer ->
    the machine of most of its expert bytes)."""
    n_units = (info.block_count or 0) + 1
    machines = unit_machines(devices, counts, n_units)
    hidden = residual_bytes(info)
    logits = (info.vocab_size or 0) * F32
    sent: dict[str, int] = {}  # per token, every row of a batch moving it
    once: dict[str, int] = {}  # per batch: the logits of its last row only
    trips: dict[str, int] = {}

    def cross(a: str, b: str, size: int, into: dict[str, int] = sent) -> None:
        """`size` bytes from machine a to machine b, through this machine."""
        if a == b:
            return
        if a:
            into[a] = into.get(a, 0) + size
            trips[a] = trips.get(a, 0) + 1
        if b:
            into[b] = into.get(b, 0) + size

    prev = ""  # the input embedding is on this machine's CPU
    away = []
    for u in range(n_units - 1):
        cross(prev, machines[u], hidden)
        home = expert_home.get(u, machines[u])
        if home != machines[u]:
            away.append(u)
            cross(machines[u], home, hidden)
            cross(home, machines[u], hidden)
        prev = machines[u]
    cross(prev, machines[-1], hidden)
    cross(machines[-1], "", logits, once)  # the sampler reads the logits here
    links = {d.machine: d.link for d in devices if d.machine}
    out = []
    for machine in dict.fromkeys([*sent, *once]):
        size, last = sent.get(machine, 0), once.get(machine, 0)
        link = links.get(machine) or Link(125_000_000, None, "1GbE (assumed)")
        n_trips = trips.get(machine, 0)
        wait = n_trips * (link.rtt_s or 0.0)
        out.append(
            LinkTraffic(
                machine=machine,
                link=link.name,
                bandwidth=link.bandwidth,
                rtt_s=link.rtt_s,
                bytes_per_token=size + last,
                round_trips=n_trips,
                seconds_per_token=(size + last) / link.bandwidth + wait,
                prefill_bytes=size * n_ubatch + last,
                prefill_seconds=(size * n_ubatch + last) / link.bandwidth + wait,
            )
        )
    return out, away


def expert_homes(
    devices: Sequence[DeviceBudget], placed: Sequence[Sequence[Group]], host: Sequence[Group]
) -> dict[int, str]:
    """Each MoE layer's expert machine: where most of its expert bytes are ("" here)."""
    by_layer: dict[int, dict[str, int]] = {}
    for device, groups in zip(devices, placed, strict=True):
        for g in groups:
            spot = by_layer.setdefault(g.layer, {})
            spot[device.machine] = spot.get(device.machine, 0) + g.n_bytes
    for g in host:
        spot = by_layer.setdefault(g.layer, {})
        spot[""] = spot.get("", 0) + g.n_bytes
    return {layer: max(spots, key=lambda m: spots[m]) for layer, spots in by_layer.items()}
