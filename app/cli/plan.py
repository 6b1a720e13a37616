"""`stoke plan GGUF`: where each tensor of a model goes on this machine (or a described one).

Prints the per-device memory table and the llama-server command line that reproduces the
placement, or the plan as JSON. Without --devices it plans for the GPUs detected here, with
their free memory as budgets, and the command carries this CPU's buffer-type flag; --devices
describes another machine (`cuda:12GiB,cuda:12GiB`). --rpc adds llama.cpp rpc-servers on
other machines: `HOST:PORT` is asked for its memory, `HOST:PORT=128GiB@10GbE` describes one
that is not here (app/hardware/rpc.py).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from app.engine.protocol import EngineError
from app.hardware.memory import KV_TYPES
from app.hardware.placement import budgets_here
from app.hardware.planner import (
    PROFILES,
    DeviceBudget,
    Plan,
    dry_run_compute,
    plan,
    plan_to_dict,
    refine,
)
from app.hardware.rpc import budgets as rpc_budgets
from app.hardware.rpc import parse_specs
from app.units import gib

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_NAMES = {"cuda": "CUDA", "rocm": "ROCm", "hip": "ROCm", "metal": "MTL", "vulkan": "Vulkan"}


def parse_size(text: str) -> int:
    """`12GiB`, `12G`, `12 GB`, `500MiB`, `1.5T` -> bytes (binary units: memory is sold so)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 12GiB)")
    return int(float(m[1]) * _UNITS[m[2]])


def parse_devices(specs: list[str]) -> list[DeviceBudget]:
    """`cuda:12GiB,cuda:12GiB` (or `CUDA1:12GiB`) -> budgets named as llama.cpp names them."""
    devices: list[DeviceBudget] = []
    counters: dict[str, int] = {}
    for spec in (s for item in specs for s in item.split(",") if s.strip()):
        kind, sep, size = spec.strip().partition(":")
        if not sep:
            raise argparse.ArgumentTypeError(f"a device is KIND:SIZE, e.g. cuda:12GiB, not {spec}")
        named = re.fullmatch(r"([A-Za-z]+)(\d+)", kind)
        backend = (named[1] if named else kind).lower()
        backend = "rocm" if backend == "hip" else backend
        if backend not in _NAMES and backend.upper() != "MTL":
            raise argparse.ArgumentTypeError(f"unknown device kind {kind!r} (cuda, rocm, metal)")
        backend = "metal" if backend == "mtl" else backend
        index = int(named[2]) if named else counters.get(backend, 0)
        counters[backend] = index + 1
        devices.append(DeviceBudget(f"{_NAMES[backend]}{index}", parse_size(size), backend))
    return devices


def _experts(d) -> str:
    parts = []
    if d.expert_layers_full:
        parts.append(f"{len(d.expert_layers_full)} full")
    if d.expert_layers_partial:
        parts.append(f"{len(d.expert_layers_partial)} partial")
    return ", ".join(parts) or "-"


def render(p: Plan) -> str:
    """The plan as a table a person reads before loading 150 GB."""
    width = max(8, *(len(d.name) for d in p.devices))
    lines = [
        f"{Path(p.model).name} ({p.architecture}, {p.n_layer} layers): context {p.n_ctx:,}, "
        f"micro-batch {p.n_ubatch}, KV {p.kv_type}{'' if p.kv_offload else ' in RAM'}, "
        f"profile {p.profile}, margin {p.margin:.0%}",
        "",
        f"{'device':{width}} {'layers':>9} {'weights':>9} {'KV':>8} {'compute':>8} {'total':>9} "
        f"{'budget':>9}  expert layers",
    ]
    for d in p.devices:
        layers = f"{d.layers[0]}-{d.layers[1]}" if d.layers else "-"
        flag = "  OVER" if d.total > d.budget else ""
        weights, kv, compute, total, budget = (
            gib(n, 2, unit=False) for n in (d.weights, d.kv, d.compute, d.total, d.budget)
        )
        lines.append(
            f"{d.name:{width}} {layers:>9} {weights:>9} {kv:>8} {compute:>8} {total:>9} "
            f"{budget:>9}  {_experts(d)}{flag}"
        )
    lines.append("")
    if p.expert_bytes_total:
        lines.append(
            f"Experts on {'devices' if p.links else 'GPUs'}: "
            f"{p.expert_layers_on_gpu:.1f} of {p.n_layer} layers "
            f"({gib(p.expert_bytes_gpu, 2, unit=False)} of {gib(p.expert_bytes_total, 2)})."
        )
    lines += _network(p)
    lines.append("Fits." if p.fits else f"Does not fit. {p.minimum}")
    lines += [f"Note: {w}" for w in p.warnings]
    lines += ["", "llama-server command line:", p.command]
    return "\n".join(lines)


def on_this_cpu(p: Plan) -> Plan:
    """The plan's llama-server command as this machine's CPU must run it: llama-server has one
    switch for llama.cpp's extra CPU buffer types, which a machine whose AMX buffers crash
    (the probed verdict, engine/llamacpp/cpu_buffers.py) needs or it dies at warm-up."""
    try:
        from app.engine.llamacpp import cpu_buffers
    except ImportError:  # no llama.cpp here (an MLX-only install): nothing probed
        return p
    args = shlex.split(p.command)
    flags = [flag for flag in cpu_buffers.server_flags() if flag not in args]
    return replace(p, command=shlex.join([*args, *flags])) if flags else p


def _network(p: Plan) -> list[str]:
    """Each remote link's predicted traffic: per decoded token, and per prefill micro-batch."""
    lines = []
    for t in p.links:
        rtt = f", round trip {t.rtt_s * 1000:.2f} ms" if t.rtt_s is not None else ""
        lines.append(
            f"Link to {t.machine} ({t.link}{rtt}): {t.bytes_per_token / 1024:,.0f} KiB per token "
            f"({t.round_trips} round trip(s)), {t.seconds_per_token * 1000:.2f} ms per token; "
            f"a {p.n_ubatch}-token micro-batch sends {t.prefill_bytes / (1 << 20):,.0f} MiB "
            f"in {t.prefill_seconds:.2f} s."
        )
    return lines


def run(args: argparse.Namespace) -> int:
    from app.engine.gguf_info import inspect_gguf

    try:
        info = inspect_gguf(args.gguf)
    except EngineError as exc:
        print(f"stoke plan: {exc}", file=sys.stderr)
        return 2
    notes: list[str] = []
    if args.devices is None:
        devices, ram, notes = budgets_here()
    else:
        devices, ram = parse_devices(args.devices), 0
    if args.rpc:
        try:
            specs = parse_specs(args.rpc)
        except ValueError as exc:
            print(f"stoke plan: {exc}", file=sys.stderr)
            return 2
        remote, rpc_notes, _ = rpc_budgets(specs, connect=False)
        devices, notes = [*devices, *remote], [*notes, *rpc_notes]
    if args.ram is not None:
        ram = args.ram
    elif args.devices is not None:
        from app.hardware.detect import system_memory

        ram = system_memory().available
    n_ctx = args.ctx or min(65_536, info.context_length or 65_536)
    if args.measure and args.devices is not None:
        print(
            "stoke plan: --measure runs on this machine's GPUs; leave out --devices",
            file=sys.stderr,
        )
        return 2
    asked = {
        "ram_bytes": ram,
        "n_ctx": n_ctx,
        "n_ubatch": args.ubatch,
        "kv_type": args.kv_type,
        "profile": args.profile,
        "margin": args.margin,
    }
    try:
        if args.measure and devices:
            result = refine(info, devices, dry_run_compute, **asked)
        else:
            result = plan(info, devices, **asked)
    except (ValueError, RuntimeError) as exc:
        print(f"stoke plan: {exc}", file=sys.stderr)
        return 2
    if args.devices is None:
        result = on_this_cpu(result)
    if args.json:
        print(json.dumps({**plan_to_dict(result), "notes": notes}, indent=2))
    else:
        print(render(result))
        for note in notes:
            print(f"Note: {note}")
    return 0 if result.fits else 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """`stoke plan`: the expert-offload plan for a GGUF model."""
    parser = subparsers.add_parser(
        "plan",
        help="where each tensor of a model goes (GPUs, RAM), and the llama-server command",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("gguf", type=Path, help="the model (any part of a split model)")
    parser.add_argument(
        "--devices",
        action="append",
        metavar="KIND:SIZE,...",
        help="GPUs and their budgets, e.g. cuda:12GiB,cuda:12GiB (default: the GPUs here)",
    )
    parser.add_argument(
        "--rpc",
        action="append",
        metavar="HOST:PORT[=SIZE][@LINK],...",
        help="rpc-servers to split over: probed, or described (mac:50052=128GiB@10GbE)",
    )
    parser.add_argument("--ram", type=parse_size, help="RAM budget (default: available here)")
    parser.add_argument("--ctx", type=int, help="context length (default 65,536 or the model's)")
    parser.add_argument("--ubatch", type=int, help="micro-batch (default: chosen for the profile)")
    parser.add_argument("--kv-type", choices=KV_TYPES, default="f16")
    parser.add_argument("--profile", choices=PROFILES, default="balanced")
    parser.add_argument(
        "--margin", type=float, default=0.05, help="safety fraction of each budget (0.05)"
    )
    parser.add_argument(
        "--measure",
        action="store_true",
        help="check the compute buffers with llama.cpp's own dry run here, and repack",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(run=run)
