"""Remote devices for the planner: llama.cpp `rpc-server`s on other machines, probed or described.

A device is written `HOST:PORT[=SIZE][@LINK]` (`stoke plan --rpc`, Settings > Hardware):

- `SIZE` (`128GiB`) is what Stoke may use there. With it the device is *described*: the plan
  uses it as given without connecting, so a machine that is not here can be planned for;
  loading still connects, and the server's free memory then caps it.
- `LINK` is the network to it: `1GbE`, `2.5GbE`, `10GbE`, `25GbE`, `40GbE`, `100GbE`, or a
  rate (`2.5Gbps`, `400MB/s`), optionally with a round trip (`10GbE/0.2ms`). Without it the
  plan assumes 1 GbE and says so; a probe measures the round trip.

Without a size the server is probed: its devices, their free and total memory, and the round
trip of a memory question. ggml-rpc ends its process when a server cannot be reached or goes
away (`GGML_ABORT`), so the probe connects in a child (`python -m app.hardware.rpc
--probe HOST:PORT`) after a plain TCP check, and a child that hangs is a server busy with
another client: an rpc-server serves one client at a time.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from app.engine.rpc_devices import device_name, split_endpoint, unreachable
from app.hardware.placement import DeviceBudget, Link

PROBE_TIMEOUT_S = 20.0
ASSUMED_LINK = Link(125_000_000, None, "1GbE (assumed)")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_RATE = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


@dataclass(frozen=True)
class RpcSpec:
    """One `HOST:PORT[=SIZE][@LINK]`."""

    endpoint: str
    size: int | None = None
    link: Link | None = None

    def __str__(self) -> str:
        text = self.endpoint
        if self.size is not None:
            text += f"={self.size / (1 << 30):g}GiB"
        if self.link is not None:
            text += f"@{self.link.name}"
        return text


@dataclass(frozen=True)
class ProbedDevice:
    index: int
    memory_free: int
    memory_total: int


@dataclass(frozen=True)
class Probe:
    """What an rpc-server answered, or why it did not (`problem`, in words)."""

    endpoint: str
    devices: tuple[ProbedDevice, ...] = ()
    rtt_s: float | None = None
    problem: str | None = None


def parse_size(text: str) -> int:
    """`128GiB`, `128G`, `500MiB` -> bytes (binary units, as memory is sold)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"not a size: {text!r} (try 128GiB)")
    return int(float(m[1]) * _UNITS[m[2]])


def parse_link(text: str) -> Link:
    """`10GbE`, `2.5Gbps`, `400MB/s` (bytes: a capital B), each optionally with a round trip
    `/0.2ms` -> bytes per second."""
    m = re.fullmatch(
        r"\s*([\d.]+)\s*([kmgtKMGT])(bps|[bB][eE]|b/s|B/s|bit/s)\s*(?:/\s*([\d.]+)\s*ms)?\s*",
        text,
    )
    if not m:
        raise ValueError(f"not a link: {text!r} (try 10GbE, 2.5Gbps or 400MB/s)")
    value = float(m[1]) * _RATE[m[2].lower()]
    per_second = value if m[3] == "B/s" else value / 8
    rtt_s = float(m[4]) / 1000 if m[4] else None
    return Link(int(per_second), rtt_s, text.strip())


def parse_specs(items: Iterable[str]) -> list[RpcSpec]:
    """`a:50052,b:50052=128GiB@10GbE` (items may hold several, comma-separated)."""
    specs = []
    for item in (s.strip() for text in items for s in text.split(",")):
        if not item:
            continue
        rest, _, link = item.partition("@")
        endpoint, _, size = rest.partition("=")
        split_endpoint(endpoint)  # raises in words
        specs.append(
            RpcSpec(
                endpoint.strip(),
                parse_size(size) if size else None,
                parse_link(link) if link else None,
            )
        )
    return specs


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> Probe:
    """Ask the rpc-server at `endpoint` for its devices and round trip (in a child process)."""
    problem = unreachable(endpoint)
    if problem:
        return Probe(endpoint, problem=problem)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "app.hardware.rpc", "--probe", endpoint],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=Path(__file__).resolve().parents[2],
        )
    except subprocess.TimeoutExpired:
        return Probe(
            endpoint,
            problem=f"{endpoint} accepts connections but did not answer within {timeout:g} s: "
            "an rpc-server serves one client at a time, so another one (a running engine) "
            "may hold it",
        )
    except OSError as exc:
        return Probe(endpoint, problem=f"could not start the probe ({exc})")
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            devices = tuple(ProbedDevice(**d) for d in data.get("devices", ()))
            return Probe(endpoint, devices, data.get("rtt_s"), data.get("problem"))
    tail = [ln for ln in out.stderr.splitlines() if ln.strip()][-1:] or ["no answer"]
    return Probe(endpoint, problem=f"{endpoint} ended the connection ({tail[0].strip()})")


def _probe_here(endpoint: str) -> dict[str, object]:
    """The probe child's work: connect through ggml-rpc, ask, time the asking."""
    from app.engine.llamacpp import rpc

    try:
        devices = rpc.add_server(endpoint)
    except RuntimeError as exc:
        return {"problem": str(exc)}
    rtt = min((rpc.round_trip_s(d) for d in devices), default=None)
    return {
        "devices": [
            {"index": d.index, "memory_free": d.memory_free, "memory_total": d.memory_total}
            for d in devices
        ],
        "rtt_s": rtt,
    }


def budgets(
    specs: Sequence[RpcSpec], *, connect: bool = True
) -> tuple[list[DeviceBudget], list[str], list[Probe]]:
    """The remote devices as planner budgets, with notes in words and the probes made. A spec
    with a size is used as given (described); one without is probed (when `connect`)."""
    devices: list[DeviceBudget] = []
    notes: list[str] = []
    probes: list[Probe] = []
    for spec in specs:
        link = spec.link or ASSUMED_LINK
        if spec.link is None:
            notes.append(
                f"The link to {spec.endpoint} is assumed to be 1 GbE; write "
                f"{spec.endpoint}@10GbE (or the real rate) to plan with yours."
            )
        if spec.size is not None and not connect:
            devices.append(_budget(spec.endpoint, 0, spec.size, spec.size, link))
            continue
        result = probe(spec.endpoint)
        probes.append(result)
        if result.problem:
            if spec.size is None:
                notes.append(f"Left out {spec.endpoint}: {result.problem}.")
                continue
            notes.append(f"{spec.endpoint} was described, not measured: {result.problem}.")
            devices.append(_budget(spec.endpoint, 0, spec.size, spec.size, link))
            continue
        if result.rtt_s is not None and link.rtt_s is None:
            link = Link(link.bandwidth, result.rtt_s, link.name)
        for d in result.devices:
            free = d.memory_free if spec.size is None else min(spec.size, d.memory_free)
            devices.append(_budget(spec.endpoint, d.index, free, d.memory_total, link))
    return devices, notes, probes


def _budget(endpoint: str, index: int, budget: int, total: int, link: Link) -> DeviceBudget:
    return DeviceBudget(
        device_name(endpoint, index),
        budget,
        backend="rpc",
        description=endpoint,
        total=total,
        machine=endpoint,  # ggml-rpc copies between devices of one server only
        link=link,
    )


def probe_to_dict(p: Probe) -> dict[str, object]:
    return asdict(p)


if __name__ == "__main__" and "--probe" in sys.argv:
    print(json.dumps(_probe_here(sys.argv[sys.argv.index("--probe") + 1])))
