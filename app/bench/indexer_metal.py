"""The indexer's Metal kernels on an Apple GPU: exactness over the acceptance grid, random-input
set agreement, then timings beside mlx-lm's indexer and the reference.

The Mac twin of app/bench/indexer.py (the CUDA acceptance run), reusing its helpers: at the
model's shape (H = 64, D = 128, k = 512), for both scorers (metal-tiled, metal-resident):

1. integer-valued inputs over every (S, L, visibility) of the acceptance grid: the indices
   must equal the reference's (ties included), the visible scores bit for bit, and the
   selector on the reference's scores alone must be canonical;
2. random fp16 inputs (L = 256, S = 16384, a resumed chunk): acceptance.set_agreement;
3. at L = 2048 and S in {4096, 16384, 32768}: medians (after warm-up) of mlx-lm's fp32 path
   (matmul + ReLU + head sum + argpartition), the reference and each Metal scorer, score and
   select timed apart and the whole op.

Writes indexer-metal.json and .md to --out (default $OUT, else ./out) after every stage.

    python -m app.bench.indexer_metal [--out DIR] [--reps N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from app.bench.indexer import (
    DIM,
    HEADS,
    QUERIES,
    TIMED_ROWS,
    K,
    median_ms,
    mlx_lm_scores,
    mlx_lm_select,
)
from app.engine.mlx.kernels import (
    canonical_top_k,
    metal_indexer,
    parts,
    reference_scores,
    reference_top_k,
)
from app.engine.mlx.kernels.acceptance import (
    QUERY_COUNTS,
    ROW_COUNTS,
    VISIBILITIES,
    integer_inputs,
    random_inputs,
    set_agreement,
)

SCORERS = ("metal-tiled", "metal-resident")


def environment() -> dict[str, Any]:
    info = mx.metal.device_info() if mx.metal.is_available() else {}
    return {
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "metal": bool(mx.metal.is_available()),
        "gpu": str(info.get("device_name", "")),
        "memory_gib": round(info.get("memory_size", 0) / 2**30, 1),
        "python": platform.python_version(),
        "macos": platform.mac_ver()[0],
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def exact_grid(quick: bool) -> dict[str, Any]:
    """Every grid case for both scorers; the failures by name."""
    rows = ROW_COUNTS[:4] if quick else ROW_COUNTS
    failed, cases = [], 0
    for n_rows in rows:
        for n_queries in QUERY_COUNTS:
            rng = np.random.default_rng(n_queries * 31 + n_rows)
            for kind in VISIBILITIES:
                inputs = integer_inputs(rng, n_queries, n_rows, HEADS, DIM, kind)
                q, w, keys, nv = inputs.args()
                ref = reference_scores(q, w, keys)
                want = canonical_top_k(ref, nv, K)
                visible = mx.arange(n_rows)[None, :] < nv[:, None]
                for name in SCORERS:
                    cases += 1
                    stages = parts(name, DIM, K)
                    scores = stages.scores(q, w, keys, nv)
                    checks = {
                        "scores": mx.array_equal(
                            mx.where(visible, scores, 0), mx.where(visible, ref, 0)
                        ),
                        "selector": mx.array_equal(stages.select(ref, nv, K), want),
                        "indices": mx.array_equal(stages.select(scores, nv, K), want),
                    }
                    bad = [stage for stage, ok in checks.items() if not bool(ok)]
                    if bad:
                        failed.append(f"{name} S={n_rows} L={n_queries} {kind}: {', '.join(bad)}")
    return {"cases": cases, "failed": failed}


def random_sets() -> dict[str, Any]:
    inputs = random_inputs(np.random.default_rng(9), 256, 16384, HEADS, DIM, "resumed")
    q, w, keys, nv = inputs.args()
    ref = np.array(reference_scores(q, w, keys))
    want = np.array(reference_top_k(q, w, keys, nv, K))
    found = {}
    for name in SCORERS:
        stages = parts(name, DIM, K)
        scores = stages.scores(q, w, keys, nv)
        got = np.array(stages.select(scores, nv, K))
        found[name] = set_agreement(ref, np.array(scores), want, got, np.array(nv), K)
    return found


def timing(n_rows: int, reps: int) -> dict[str, float]:
    inputs = random_inputs(np.random.default_rng(n_rows), QUERIES, n_rows, HEADS, DIM, "resumed")
    q, w, keys, nv = inputs.args()
    q16, k16 = q.astype(mx.float16), keys.astype(mx.float16)
    ms = {
        "mlx_lm_fp32": median_ms(
            lambda: mlx_lm_select(mlx_lm_scores(q, w, keys, nv, mx.float32)), reps
        ),
        "reference": median_ms(lambda: reference_top_k(q, w, keys, nv, K), reps),
    }
    for name in SCORERS:
        stages = parts(name, DIM, K)
        scores = stages.scores(q16, w, k16, nv)
        mx.eval(scores)
        ms[f"{name}_score"] = median_ms(lambda s=stages: s.scores(q16, w, k16, nv), reps)
        ms[f"{name}_select"] = median_ms(lambda s=stages, x=scores: s.select(x, nv, K), reps)
        ms[name] = median_ms(lambda s=stages: s.select(s.scores(q16, w, k16, nv), nv, K), reps)
    return {key: round(value, 3) for key, value in ms.items()}


def markdown(data: dict[str, Any]) -> str:
    env = data["environment"]
    lines = [
        "# Lightning indexer: Metal kernels vs reference",
        "",
        f"{env['gpu']} ({env['memory_gib']} GiB) · macOS {env['macos']} · MLX {env['mlx']}",
        "",
    ]
    for name, stage in data["stages"].items():
        if not stage["ok"]:
            lines += [f"{name}: failed: {stage['error']}", ""]
        elif not name.startswith("time_"):
            lines += [f"{name}: `{json.dumps(stage['result'])[:1500]}`", ""]
    timed = {n: s["result"] for n, s in data["stages"].items() if n.startswith("time_") and s["ok"]}
    if timed:
        columns = list(next(iter(timed.values())))
        lines += [
            f"Medians, ms (L = {QUERIES}, H = {HEADS}, D = {DIM}, k = {K}):",
            "",
            "| S | " + " | ".join(columns) + " |",
            "|---:|" + "---:|" * len(columns),
        ]
        for name, result in timed.items():
            row = " | ".join(f"{result[c]:.2f}" for c in columns)
            lines.append(f"| {int(name.removeprefix('time_S')):,} | {row} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="smaller exactness grid")
    args = parser.parse_args()
    data: dict[str, Any] = {"environment": environment(), "stages": {}}

    def write() -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "indexer-metal.json").write_text(json.dumps(data, indent=2) + "\n")
        (args.out / "indexer-metal.md").write_text(markdown(data))

    print(json.dumps(data["environment"]), flush=True)
    if not metal_indexer.available():
        print("MLX has no Metal device here (an Apple GPU is needed): nothing to measure.")
        write()
        sys.exit(2)
    stages = [("exact", lambda: exact_grid(args.quick)), ("random", random_sets)]
    stages += [(f"time_S{n}", lambda n=n: timing(n, args.reps)) for n in TIMED_ROWS]
    for name, fn in stages:
        print(f"== {name}", flush=True)
        try:
            data["stages"][name] = {"ok": True, "result": fn()}
        except Exception as error:  # a failed stage is a finding; the others still run
            text = f"{type(error).__name__}: {error}"
            print(f"!! {name} failed: {text}\n{traceback.format_exc()}", flush=True)
            data["stages"][name] = {"ok": False, "error": text}
        write()
    print((args.out / "indexer-metal.md").read_text())


if __name__ == "__main__":
    main()
