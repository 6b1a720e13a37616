"""A benchmark's model placed as `stoke plan` places it on this machine: its GPUs' free
memory, its RAM, experts in RAM where they do not fit. `stoke bench engines --plan` and
`stoke bench kv --plan` load both of their sides so, and report the plan."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from app.engine.protocol import LoadOptions


def planned(options: LoadOptions) -> tuple[LoadOptions, dict[str, Any]]:
    """`options` with the placement `stoke plan` makes here for their context, and the plan
    as JSON data; a model that does not fit ends the run in words."""
    from app.engine.gguf_info import inspect_gguf
    from app.hardware.placement import budgets_here
    from app.hardware.planner import load_options, plan, plan_to_dict

    gpus, ram, _notes = budgets_here()
    placed = plan(inspect_gguf(options.model_path), gpus, ram_bytes=ram, n_ctx=options.n_ctx)
    if not placed.fits:
        raise SystemExit(f"{Path(options.model_path).name} does not fit this machine's plan")
    fields = {k: v for k, v in load_options(placed).items() if k != "n_seq_max"}
    return replace(options, **fields), plan_to_dict(placed)
