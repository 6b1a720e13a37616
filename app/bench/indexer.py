"""Issue 8's indexer acceptance on an NVIDIA GPU: the CUDA twin against the MLX reference.

Runs where MLX has CUDA (mlx-cuda; ../shared/device/README.md installs it on the H200
machine); nothing here is part of the app. In one run it

1. compiles both kernels on a tiny input and prints NVRTC's log if either fails;
2. checks exactness on integer-valued inputs at the model's shape (H = 64, D = 128): every
   (S, L, visibility) of the acceptance grid, the twin's indices against the reference's,
   plus its scores (visible columns) and its selector on the reference's scores, so a
   mismatch names the stage; then every scorer shape (cuda_indexer.ScorerShape) on every
   supported head dim (a small case) and at H = 64, D = 128 (S = 4096 and 16387): a shape
   that fails here, or does not compile, is left out of the timings;
3. checks random fp16 inputs: the selected sets agree except in rows whose cut is within
   twice the measured score difference (acceptance.set_agreement), and the selector alone is
   canonical on the twin's own scores;
4. times, at L = 2048, H = 64, D = 128, S in {4096, 16384, 32768} (the last chunk of a
   4S-token prompt): mlx-lm's indexer (matmul + ReLU + head sum + argpartition, in fp32 as
   in FIELD_NOTES and in fp16), the reference, and the twin (every exact scorer shape,
   selector), each stage alone and the whole op; medians after warm-up, mx.eval +
   mx.synchronize around each repetition.

--focus keeps a short device run to the scorer shapes: their exactness, then S = 16384 and
32768 with mlx-lm's fp32 path as the yardstick (no full grid, no random-input stage, no
reference or fp16 timings).

A failing stage is recorded with its error and the run goes on. Writes indexer.json and
indexer.md to --out (default $OUT, else ./out) after every stage.

    PYTHONPATH=/tmp/mlxsite python3 app/bench/indexer.py [--out DIR] [--reps N] [--quick] [--focus]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.engine.mlx.kernels import cuda_indexer  # noqa: E402
from app.engine.mlx.kernels.acceptance import (  # noqa: E402
    QUERY_COUNTS,
    ROW_COUNTS,
    VISIBILITIES,
    integer_inputs,
    random_inputs,
    set_agreement,
)
from app.engine.mlx.kernels.cuda_indexer import ScorerShape  # noqa: E402
from app.engine.mlx.kernels.reference import (  # noqa: E402
    canonical_top_k,
    reference_scores,
    selection_tolerance,
    to_fp16,
)

K = 512
HEADS, DIM, QUERIES = 64, 128, 2048
TIMED_ROWS = (4096, 16384, 32768)
FOCUS_ROWS = (16384, 32768)
# Scorer shapes tried, cuda_indexer's default first: 8 warps (256-row blocks: half the Q
# traffic, one block an SM); one 16-query tile's per-head sums live at a time (fewer
# registers), with a bound that asks for four blocks an SM; 64-query blocks (a Q fragment's
# shared-memory tile feeds twice the mma per barrier and cp.async batch), bounded to three.
SHAPES = (
    cuda_indexer.DEFAULT_SHAPE,
    ScorerShape(8, 2, 2),
    ScorerShape(4, 2, 1),
    ScorerShape(4, 2, 1, 4),
    ScorerShape(4, 4, 1),
    ScorerShape(4, 4, 2),
    ScorerShape(4, 4, 1, 3),
    ScorerShape(8, 4, 1),
)


def log(message: str) -> None:
    print(message, flush=True)


class Report:
    """Everything measured so far, written out after every stage."""

    def __init__(self, out: Path):
        self.out = out
        self.data: dict[str, Any] = {"environment": environment(), "stages": {}}

    def stage(self, name: str, fn: Callable[[], Any]) -> Any:
        log(f"== {name}")
        try:
            result = fn()
            self.data["stages"][name] = {"ok": True, "result": result}
        except Exception as error:  # a failed stage is a finding; the others still run
            text = f"{type(error).__name__}: {error}"
            log(f"!! {name} failed: {text}\n{traceback.format_exc()}")
            self.data["stages"][name] = {"ok": False, "error": text}
            result = None
        self.write()
        return result

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "indexer.json").write_text(json.dumps(self.data, indent=2) + "\n")
        (self.out / "indexer.md").write_text(markdown(self.data))


def environment() -> dict[str, Any]:
    gpu = ""
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,clocks.max.sm", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        gpu = "nvidia-smi unavailable"
    return {
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "cuda": cuda_indexer.available(),
        "gpu": gpu,
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def label(shape: ScorerShape) -> str:
    return f"cuda_{shape.name}"


_CPU_FALLBACK: list[str] = []


def reference_indices(scores: mx.array, nv: mx.array) -> mx.array:
    """The reference's selection; on the CPU stream if the GPU lacks an op it needs (uint64
    partition or sort), so the twin can still be checked."""
    if not _CPU_FALLBACK:
        try:
            out = canonical_top_k(scores, nv, K)
            mx.eval(out)
            return out
        except Exception as error:  # noted once, then the CPU stream answers
            _CPU_FALLBACK.append(f"{type(error).__name__}: {error}")
            log(f"!! reference selection failed on the GPU, using the CPU: {_CPU_FALLBACK[0]}")
    with mx.stream(mx.cpu):
        out = canonical_top_k(scores, nv, K)
        mx.eval(out)
    return out


def twin(
    q: mx.array, w: mx.array, keys: mx.array, nv: mx.array, shape: ScorerShape = SHAPES[0]
) -> mx.array:
    scores = cuda_indexer.scores(to_fp16(q), w, to_fp16(keys), nv, shape)
    return cuda_indexer.select(scores, nv, K)


# -- 1. compile ---------------------------------------------------------------------------


def compile_check() -> dict[str, Any]:
    inputs = integer_inputs(np.random.default_rng(0), 5, 40, 2, 32, "all")
    scores = cuda_indexer.scores(inputs.q, inputs.weights, inputs.keys, inputs.n_visible)
    mx.eval(scores)
    indices = cuda_indexer.select(scores, inputs.n_visible, K)
    mx.eval(indices)
    return {"scores_shape": list(scores.shape), "indices_shape": list(indices.shape)}


# -- 2. exactness on integer inputs ------------------------------------------------------


def first_bad_rows(got: np.ndarray, want: np.ndarray) -> list[int]:
    return np.flatnonzero((got != want).any(axis=1))[:5].tolist()


def exact_case(
    n_queries: int, n_rows: int, heads: int, dim: int, kind: str, shape: ScorerShape
) -> dict:
    rng = np.random.default_rng(n_queries * 7919 + n_rows * 31 + dim + shape.warps + shape.m_tiles)
    inputs = integer_inputs(rng, n_queries, n_rows, heads, dim, kind)
    q, w, keys, nv = inputs.args()
    ref_scores = reference_scores(q, w, keys)
    want = np.array(reference_indices(ref_scores, nv))
    tw_scores = cuda_indexer.scores(q, w, keys, nv, shape)
    got = np.array(cuda_indexer.select(tw_scores, nv, K))
    visible = np.arange(n_rows)[None, :] < np.array(nv)[:, None]
    score_ok = bool(np.array_equal(np.array(tw_scores)[visible], np.array(ref_scores)[visible]))
    select_only = np.array(cuda_indexer.select(ref_scores, nv, K))
    return {
        "queries": n_queries,
        "rows": n_rows,
        "heads": heads,
        "dim": dim,
        "visibility": kind,
        "config": label(shape),
        "indices_equal": bool(np.array_equal(got, want)),
        "scores_equal": score_ok,
        "selector_equal": bool(np.array_equal(select_only, want)),
        "bad_rows": first_bad_rows(got, want),
    }


def exact_grid(quick: bool) -> dict[str, Any]:
    cases = []
    for n_rows in ROW_COUNTS[:4] if quick else ROW_COUNTS:
        for n_queries in QUERY_COUNTS:
            for kind in VISIBILITIES:
                case = exact_case(n_queries, n_rows, HEADS, DIM, kind, SHAPES[0])
                cases.append(case)
                good = case["indices_equal"] and case["scores_equal"] and case["selector_equal"]
                log(f"   S={n_rows:>6} L={n_queries:>5} {kind:<8} {'ok' if good else case}")
    failed = [c for c in cases if not (c["indices_equal"] and c["scores_equal"])]
    return {
        "cases": len(cases),
        "failed": len(failed),
        "reference_selection_on_cpu": _CPU_FALLBACK[:1],
        "failures": failed[:20],
        "all": cases,
    }


def exact_shapes(focus: bool) -> dict[str, Any]:
    """Each scorer shape on every head dim (a small case) and at the model's shape; a shape
    that raises (NVRTC, launch) is a failed shape, not a failed stage."""
    dims = (DIM,) if focus else cuda_indexer.SUPPORTED_DIMS
    cases = [(77, 1500, 8, dim) for dim in dims]
    cases += [(256, 4096, HEADS, DIM), (32, 16387, HEADS, DIM)]
    passed, failed = [], {}
    for shape in SHAPES:
        try:
            for n_queries, n_rows, heads, dim in cases:
                case = exact_case(n_queries, n_rows, heads, dim, "resumed", shape)
                if not (case["indices_equal"] and case["scores_equal"]):
                    raise AssertionError(f"differs from the reference: {case}")
            passed.append(shape.name)
            log(f"   {label(shape)} exact on {len(cases)} cases")
        except Exception as error:  # one broken shape must not hide the others
            failed[shape.name] = f"{type(error).__name__}: {str(error)[:2000]}"
            log(f"!! {label(shape)}: {failed[shape.name]}")
    return {"cases": len(cases), "passed": passed, "failed": failed}


# -- 3. random fp16 ----------------------------------------------------------------------


def random_sets() -> dict[str, Any]:
    rng = np.random.default_rng(11)
    inputs = random_inputs(rng, QUERIES, 16384, HEADS, DIM, "resumed")
    q, w, keys, nv = inputs.args()
    ref = reference_scores(q, w, keys)
    want = np.array(reference_indices(ref, nv))
    tw_scores = cuda_indexer.scores(q, w, keys, nv)
    got = np.array(cuda_indexer.select(tw_scores, nv, K))
    result = set_agreement(np.array(ref), np.array(tw_scores), want, got, np.array(nv), K)
    # The selector alone has no tolerance: on the twin's own scores it must be canonical.
    own = np.array(reference_indices(tw_scores, nv))
    result["selector_rows_equal_on_own_scores"] = int((got == own).all(axis=1).sum())
    tolerance = np.array(selection_tolerance(q, w, keys))
    result["worst_case_tolerance_median"] = float(np.median(tolerance))
    # Two implementations are within half the worst-case tolerance of each other (reference.py).
    result["within_worst_case_bound"] = bool(result["max_score_difference"] <= tolerance.min() / 2)
    return result


# -- 4. timing ---------------------------------------------------------------------------


def median_ms(fn: Callable[[], mx.array], reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        mx.eval(fn())
    mx.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def mlx_lm_scores(q: mx.array, w: mx.array, keys: mx.array, nv: mx.array, dtype) -> mx.array:
    """mlx-lm 0.32's DeepSeek-V3.2 indexer: one matmul over all heads, ReLU, weights,
    a head sum, -inf where not visible."""
    qh = q.astype(dtype).transpose(1, 0, 2)  # [H, L, D]
    scores = mx.maximum(qh @ keys.astype(dtype).T[None], 0)  # [H, L, S]
    scores = (scores * w.astype(dtype).T[:, :, None]).sum(axis=0)
    visible = mx.arange(keys.shape[0])[None, :] < nv[:, None]
    return mx.where(visible, scores, -float("inf"))


def mlx_lm_select(scores: mx.array) -> mx.array:
    return mx.argpartition(scores, kth=-K, axis=-1)[..., -K:]


def timing(n_rows: int, reps: int, shapes: tuple[ScorerShape, ...], focus: bool) -> dict[str, Any]:
    inputs = random_inputs(np.random.default_rng(n_rows), QUERIES, n_rows, HEADS, DIM, "resumed")
    q, w, keys, nv = inputs.args()
    mx.eval(q, w, keys, nv)
    rows: dict[str, float | str] = {}

    def measure(name: str, fn: Callable[[], mx.array]) -> None:
        try:
            rows[name] = round(median_ms(fn, reps), 3)
            log(f"   S={n_rows:>6} {name:<28} {rows[name]:9.3f} ms")
        except Exception as error:  # one failing variant must not hide the others
            rows[name] = f"failed: {type(error).__name__}: {error}"
            log(f"!! S={n_rows} {name}: {rows[name]}")

    mlx_lm_paths = (("mlx_lm_fp32", mx.float32),) + (
        () if focus else (("mlx_lm_fp16", mx.float16),)
    )
    for path, dtype in mlx_lm_paths:
        scores = mlx_lm_scores(q, w, keys, nv, dtype)
        mx.eval(scores)
        measure(f"{path}.score", lambda d=dtype: mlx_lm_scores(q, w, keys, nv, d))
        measure(f"{path}.select", lambda s=scores: mlx_lm_select(s))
        measure(f"{path}.op", lambda d=dtype: mlx_lm_select(mlx_lm_scores(q, w, keys, nv, d)))
    if not focus:
        ref = reference_scores(q, w, keys)
        mx.eval(ref)
        measure("reference.score", lambda: reference_scores(q, w, keys))
        measure("reference.select", lambda r=ref: canonical_top_k(r, nv, K))
        measure("reference.op", lambda: canonical_top_k(reference_scores(q, w, keys), nv, K))
    for shape in shapes:
        measure(f"{label(shape)}.score", lambda c=shape: cuda_indexer.scores(q, w, keys, nv, c))
    tw = cuda_indexer.scores(q, w, keys, nv)
    mx.eval(tw)
    measure("cuda.select", lambda: cuda_indexer.select(tw, nv, K))
    # Integer-valued scores: heavy ties, so the radix levels run down into the index bits.
    ties = integer_inputs(np.random.default_rng(n_rows), QUERIES, n_rows, HEADS, DIM, "resumed")
    tie_scores = cuda_indexer.scores(*ties.args())
    mx.eval(tie_scores)
    measure("cuda.select_tied", lambda: cuda_indexer.select(tie_scores, ties.n_visible, K))
    for shape in shapes:
        measure(f"{label(shape)}.op", lambda c=shape: twin(q, w, keys, nv, c))
    flops = 2.0 * QUERIES * HEADS * DIM * n_rows
    visible = float(np.array(nv).astype(np.float64).sum()) / (QUERIES * n_rows)
    derived: dict[str, float] = {"gflop_all_rows": flops / 1e9, "visible_fraction": visible}
    paths = ("reference", "mlx_lm_fp32", "mlx_lm_fp16", *map(label, shapes))
    for name in (f"{path}.score" for path in paths):
        if isinstance(rows.get(name), float):
            derived[f"{name}_tflops"] = round(flops / (rows[name] * 1e-3) / 1e12, 1)
    if isinstance(rows.get("cuda.select"), float):
        derived["cuda.select_gbps"] = round(
            QUERIES * n_rows * 4 / (rows["cuda.select"] * 1e-3) / 1e9
        )
    return {"rows": n_rows, "ms": rows, "derived": derived}


# -- report ------------------------------------------------------------------------------


def markdown(data: dict[str, Any]) -> str:
    env = data["environment"]
    lines = [
        "# Lightning indexer: CUDA twin vs reference",
        "",
        f"GPU: {env['gpu']} - MLX {env['mlx']} ({env['device']}), Python {env['python']},"
        f" {env['when']}. L = {QUERIES}, H = {HEADS}, D = {DIM}, k = {K}; medians in ms.",
        "",
    ]
    for name, stage in data["stages"].items():
        if not stage["ok"]:
            lines += [f"## {name}: FAILED", "", "```", stage["error"][:4000], "```", ""]
            continue
        result = stage["result"]
        if name == "exact":
            lines += [
                "## Exactness (integer-valued inputs)",
                "",
                f"{result['cases'] - result['failed']} of {result['cases']} cases identical"
                " to the reference (indices, ties included; visible scores bit-equal).",
                "",
            ]
        elif name == "exact_shapes":
            lines += [
                "## Scorer shapes: exactness before timing",
                "",
                f"Exact on all {result['cases']} cases: {', '.join(result['passed']) or 'none'}."
                + "".join(f" {n} FAILED: {e[:300]}" for n, e in result["failed"].items()),
                "",
            ]
        elif name == "random":
            lines += [
                "## Random fp16 inputs (S = 16384, resumed)",
                "",
                f"{result['checked']} of {result['rows']} rows checked,"
                f" {result['differing_sets']} with a different set;"
                f" {result['skipped_near_ties']} near-tie rows skipped (the reference's 512th"
                f" and 513th scores within twice the row's measured |twin - reference|, max"
                f" {result['max_score_difference']:.3g}, median"
                f" {result['median_row_score_difference']:.3g}; worst-case bound median"
                f" {result['worst_case_tolerance_median']:.3g}, respected:"
                f" {result['within_worst_case_bound']});"
                f" {result['identical_rows_incl_order']} rows identical including order;"
                f" selector canonical on the twin's own scores in"
                f" {result['selector_rows_equal_on_own_scores']} of {result['rows']} rows.",
                "",
            ]
        elif name.startswith("time"):
            ms = result["ms"]
            lines += [
                f"## S = {result['rows']}",
                "",
                "| path | score | select | op |",
                "|---|---:|---:|---:|",
            ]
            for path in ("mlx_lm_fp32", "mlx_lm_fp16", "reference", *map(label, SHAPES)):
                select = ms.get(f"{path}.select", ms.get("cuda.select") if "cuda" in path else "")
                score, op = ms.get(f"{path}.score", ""), ms.get(f"{path}.op", "")
                lines.append(f"| {path} | {score} | {select} | {op} |")
            lines += [
                "",
                f"Selector on integer-valued (tie-heavy) scores: {ms.get('cuda.select_tied')} ms.",
                "",
                "Derived: " + json.dumps(result["derived"]),
                "",
            ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="smaller exactness grid")
    parser.add_argument(
        "--focus", action="store_true", help="scorer shapes only: exactness, S = 16384 and 32768"
    )
    args = parser.parse_args()
    report = Report(args.out)
    log(json.dumps(report.data["environment"]))
    if not cuda_indexer.available():
        log("MLX has no CUDA device here: nothing to measure.")
        report.write()
        sys.exit(2)
    if report.stage("compile", compile_check) is None:
        log("the kernels did not compile or run; the timings below cover the MLX paths only")
    if not args.focus:
        report.stage("exact", lambda: exact_grid(args.quick))
    checked = report.stage("exact_shapes", lambda: exact_shapes(args.focus)) or {}
    shapes = tuple(s for s in SHAPES if s.name in checked.get("passed", ()))
    if not args.focus:
        report.stage("random", random_sets)
    for n_rows in FOCUS_ROWS if args.focus else TIMED_ROWS:
        report.stage(f"time_S{n_rows}", lambda n=n_rows: timing(n, args.reps, shapes, args.focus))
    log((args.out / "indexer.md").read_text())


if __name__ == "__main__":
    main()
