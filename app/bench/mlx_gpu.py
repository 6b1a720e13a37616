"""Issue 20: the MLX engine on an NVIDIA GPU (mlx-cuda) beside llama.cpp CUDA, same files.

bench/device/mlx_gpu.sh runs this on the H200 machine after the e2e engine suite's core has
run on the MLX backend there (its JUnit XML, --junit, is summarized into the results).

Each engine runs in a process of its own (`--stage mlx`, `--stage llama.cpp`, started by this
one with a time limit each): the CUDA builds of llama.cpp and MLX crashed when one process
loaded both (llama.cpp's std::regex split of the vocabulary segfaulted once numpy and MLX were
in; with llama.cpp first, the PyTorch that transformers pulled in crashed). The MLX stage never
imports llama.cpp (its GGUF tokenizer is mlx/gguf_vocab.py) nor transformers (mlx/lm.py). The
MLX stage

1. checks that MLX computes on the GPU and keeps the default model quantized there (q_proj
   a 4-bit QuantizedLinear, the embedding a QuantizedEmbedding: fit.fit_device expands
   them only on a CPU), timing the load and the first and second forward (the first compiles
   MLX's CUDA kernels);
2. on the DeepSeek V4 scaled GGUF (synthetic, random Q8_0 weights, gpt-2 pre-tokenizer, which
   llama.cpp's CUDA build loads; written once by this process), checks that the indexer's
   dispatcher picks the CUDA twin for its shape, runs an MLX engine turn counting the twin's
   scorer and selector calls, and compares its greedy tokens with the reference indexer's;
3. times prefill and decode on each file, as the llama.cpp stage does (every layer on the
   GPU): per repetition a fresh random prompt (cold prefill) then --decode tokens with the
   end-of-generation tokens banned, medians of --reps after one warm-up.

Writes mlx-engine-h200.json and .md to --out (default $OUT, else ./out) after every stage; a
stage that fails or runs out of time is recorded with its error and the rest still run.
Without CUDA (a CPU smoke test, e.g. --quick here) the GPU checks are recorded as failed, the
timings still run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.engine.protocol import Engine, GenerationStats, LoadOptions, SamplingParams, TokenEvent

RESULTS = "mlx-engine-h200"


def gpu_name() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return done.stdout.strip() or "no GPU listed"
    except (OSError, subprocess.SubprocessError):
        return "no nvidia-smi"


def junit_summary(path: Path) -> dict[str, Any]:
    """Each test's outcome from pytest's JUnit XML."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = f"{tag}: {(found.get('message') or '')[:300]}"
        cases[f"{case.get('classname')}::{case.get('name')}"] = {
            "outcome": outcome,
            "seconds": round(float(case.get("time") or 0), 2),
        }
    passed = sum(1 for c in cases.values() if c["outcome"] == "passed")
    return {"passed": passed, "total": len(cases), "tests": cases}


def kept_quantized(model_path: str) -> dict[str, Any]:
    import mlx.core as mx
    import mlx.nn as nn

    from app.engine.mlx.models import load_model

    started = time.perf_counter()
    model = load_model(model_path).model
    seconds = {"load": time.perf_counter() - started}
    tokens = mx.array([list(range(100, 116))])
    for name in ("first_forward", "second_forward"):  # the first compiles the kernels
        started = time.perf_counter()
        mx.eval(model(tokens))
        seconds[name] = time.perf_counter() - started
    q_proj = model.model.layers[0].self_attn.q_proj
    found = {
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "default_device": str(mx.default_device()),
        "cuda_available": bool(mx.cuda.is_available()),
        "q_proj": type(q_proj).__name__,
        "q_proj_bits": getattr(q_proj, "bits", None),
        "embedding": type(model.model.embed_tokens).__name__,
    }
    found["ok"] = (
        found["cuda_available"]
        and mx.default_device() == mx.gpu
        and isinstance(q_proj, nn.QuantizedLinear)
        and q_proj.bits == 4
        and isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    )
    return found


def _engine(backend: str) -> Engine:
    if backend == "mlx":
        from app.engine.mlx.backend import MlxEngine

        return MlxEngine()
    from app.engine.llamacpp.backend import LlamaCppEngine

    return LlamaCppEngine()


def _options(backend: str, path: Path, n_ctx: int) -> LoadOptions:
    layers = 999 if backend == "llama.cpp" else 0
    return LoadOptions(str(path), n_ctx=n_ctx, n_gpu_layers=layers, snapshots=False)


def _no_end(backend: str, path: Path) -> SamplingParams:
    """Greedy with every end-of-generation token banned, so each run decodes in full."""
    if backend == "mlx":
        from app.engine.mlx.models import gguf_vocab

        eog = gguf_vocab(path).eog_ids()
    else:
        from app.engine.llamacpp.backend import load_vocab

        eog = load_vocab(str(path)).eog_ids()
    bias = tuple((t, -1e9) for t in sorted(eog))
    return dataclasses.replace(SamplingParams.greedy(), logit_bias=bias)


def _run(engine: Engine, prompt: list[int], sampling: SamplingParams, n: int) -> tuple:
    tokens, stats = [], None
    for event in engine.generate(prompt, sampling, n, slot="bench"):
        if isinstance(event, TokenEvent):
            tokens.append(event.token_id)
        elif isinstance(event, GenerationStats):
            stats = event
    return tokens, stats


def rates(backend: str, path: Path, prompt_len: int, decode: int, reps: int) -> dict[str, Any]:
    """Prefill and decode tok/s, medians of `reps` after a warm-up, each a cold prompt."""
    import numpy as np

    engine = _engine(backend)
    engine.load(_options(backend, path, prompt_len + decode + 64))
    sampling = _no_end(backend, path)
    rng = np.random.default_rng(0)
    runs = []
    try:
        for i in range(reps + 1):
            # a fresh first token each time, so nothing of the last prompt is reused
            prompt = [100 + i, *rng.integers(100, 400, prompt_len - 1).tolist()]
            stats = _run(engine, prompt, sampling, decode)[1]
            if i:
                runs.append(stats)
    finally:
        engine.unload()
    return {
        "prompt_tokens": prompt_len,
        "prefilled_tokens": [s.prefilled_tokens for s in runs],
        "generated_tokens": [s.generated_tokens for s in runs],
        "prefill_tok_s": round(statistics.median(s.prefill_tok_s for s in runs), 1),
        "decode_tok_s": round(statistics.median(s.decode_tok_s for s in runs), 1),
        "ttft_s": round(statistics.median(s.ttft_s for s in runs), 4),
        "runs_prefill_tok_s": [round(s.prefill_tok_s, 1) for s in runs],
        "runs_decode_tok_s": [round(s.decode_tok_s, 1) for s in runs],
    }


@contextmanager
def counted(module: Any, names: tuple[str, ...]) -> Iterator[Counter]:
    """Counts calls of module-level functions while the block runs."""
    calls: Counter = Counter()
    originals = {name: getattr(module, name) for name in names}

    def wrap(name: str, fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return call

    for name, fn in originals.items():
        setattr(module, name, wrap(name, fn))
    try:
        yield calls
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


def deepseek_twin(path: Path, prompt_len: int, decode: int) -> dict[str, Any]:
    """The scaled DeepSeek V4 on the MLX engine: the dispatcher's choice, the twin's calls,
    and its greedy tokens beside the reference indexer's."""
    import mlx.core as mx
    import numpy as np

    from app.engine.mlx.gguf_deepseek_v4 import model_args
    from app.engine.mlx.kernels import IMPLEMENTATION_ENV, choose_implementation, cuda_indexer

    args = model_args(mx.load(str(path), return_metadata=True)[1])
    shape = {"index_head_dim": args.index_head_dim, "index_topk": args.index_topk}
    chosen = choose_implementation(512, args.index_head_dim, args.index_topk)
    prompt = np.random.default_rng(7).integers(2, 400, prompt_len).tolist()
    sampling = SamplingParams.greedy()
    tokens = {}
    with counted(cuda_indexer, ("scores", "select")) as calls:
        for name in ("dispatcher", "reference"):
            if name == "reference":
                os.environ[IMPLEMENTATION_ENV] = "reference"
            engine = _engine("mlx")
            engine.load(_options("mlx", path, prompt_len + decode + 64))
            try:
                tokens[name] = _run(engine, prompt, sampling, decode)[0]
            finally:
                engine.unload()
                os.environ.pop(IMPLEMENTATION_ENV, None)
            if name == "dispatcher":
                twin_calls = dict(calls)
    same = sum(a == b for a, b in zip(tokens["dispatcher"], tokens["reference"], strict=False))
    return {
        "indexer_shape": shape,
        "dispatcher_choice": chosen,
        "twin_calls_in_turn": twin_calls,
        "greedy_tokens_equal_reference": f"{same}/{len(tokens['reference'])}",
        "ok": chosen == "cuda" and twin_calls.get("scores", 0) > 0,
    }


def write(out: Path, results: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{RESULTS}.json").write_text(json.dumps(results, indent=1))
    lines = [f"# MLX engine on {results['gpu']}", "", results["software"], ""]
    for backend, ran in results.get("stages", {}).items():
        lines.append(f"- {backend} stage: {ran.get('ended', 'done')} in {ran.get('seconds')} s")
    lines.append("")
    suite = results.get("e2e_mlx")
    if isinstance(suite, dict) and "tests" in suite:
        lines += [f"e2e engine suite on MLX: {suite['passed']}/{suite['total']} passed", ""]
        lines += ["| test | outcome | s |", "|---|---|---:|"]
        lines += [f"| {k} | {v['outcome']} | {v['seconds']} |" for k, v in suite["tests"].items()]
        lines.append("")
    for key in ("quantized_on_gpu", "deepseek_v4_twin"):
        if key in results:
            lines += [f"{key}: `{json.dumps(results[key])}`", ""]
    lines += [
        "| model | engine | prompt | prefill tok/s | decode tok/s | ttft s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for model, engines in results.get("rates", {}).items():
        for engine, r in engines.items():
            if "error" in r:
                lines.append(f"| {model} | {engine} | | error: {r['error'][:80]} | | |")
            else:
                lines.append(
                    f"| {model} | {engine} | {r['prompt_tokens']} | {r['prefill_tok_s']:,} "
                    f"| {r['decode_tok_s']:,} | {r['ttft_s']} |"
                )
    (out / f"{RESULTS}.md").write_text("\n".join(lines) + "\n")


def stage(results: dict[str, Any], key: str, write_out: Callable, fn: Callable[[], Any]) -> None:
    """Runs one stage, recording its result or its error, and writes what there is so far."""
    started = time.perf_counter()
    try:
        results[key] = fn()
    except Exception as exc:  # a failed stage is a result too; the others still run
        results[key] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
    print(f"{key} ({time.perf_counter() - started:.1f} s): {json.dumps(results[key])[:400]}")
    write_out()


FILES = (("SmolLM2-135M Q4_1", "default"), ("DeepSeek V4 scaled Q8_0", "dsv4"))
ENGINES = ("mlx", "llama.cpp")


def engine_stage(backend: str, opts: argparse.Namespace) -> None:
    """One engine's part, in this process alone: its checks (MLX) and its rates, written to
    --part as JSON after each step, so a stage stopped at its limit keeps what it measured.
    llama.cpp's libraries load before anything else in its process: on the H200 image its CUDA
    build segfaulted in the vocabulary's std::regex split when numpy had been imported first
    (this module imports numpy only inside its functions for that reason)."""
    if backend == "llama.cpp":
        import llama_cpp  # noqa: F401

    from app.models.default import default_model_path

    files = {"default": Path(default_model_path()), "dsv4": opts.dsv4}
    part: dict[str, Any] = {"rates": {}}

    def save() -> None:
        opts.part.write_text(json.dumps(part, indent=1))

    def timed(label: str, key: str) -> None:
        prompt = opts.prompt if key == "default" else min(opts.prompt, 2048)
        run = lambda: rates(backend, files[key], prompt, opts.decode, opts.reps)  # noqa: E731
        stage(part["rates"], label, save, run)

    (default_label, _), (dsv4_label, _) = FILES
    if backend == "mlx":
        import mlx.core as mx

        part["software"] = f"MLX {mx.__version__} ({mx.default_device()})"
        print(f"mlx {mx.__version__}, default device {mx.default_device()}", flush=True)
        stage(part, "quantized_on_gpu", save, lambda: kept_quantized(str(files["default"])))
    timed(default_label, "default")
    if backend == "mlx":
        stage(part, "deepseek_v4_twin", save, lambda: deepseek_twin(opts.dsv4, 600, 16))
    timed(dsv4_label, "dsv4")
    # what this process loaded: the MLX stage must hold neither llama.cpp nor PyTorch
    part["imported"] = [m for m in ("llama_cpp", "transformers", "torch") if m in sys.modules]
    save()


def run_stage(backend: str, opts: argparse.Namespace, scratch: Path, limit: float) -> dict:
    """One engine's stage in a child process, within `limit` seconds; what it wrote."""
    part = scratch / f"{backend}.json"
    command = [sys.executable, "-m", "app.bench.mlx_gpu", "--stage", backend, "--part", str(part)]
    command += ["--dsv4", str(opts.dsv4), "--reps", str(opts.reps)]
    command += ["--prompt", str(opts.prompt), "--decode", str(opts.decode)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, timeout=limit, check=False)
        ending = None if done.returncode == 0 else f"exited with status {done.returncode}"
    except subprocess.TimeoutExpired:
        ending = f"stopped at its {limit:.0f} s limit"
    got = json.loads(part.read_text()) if part.exists() else {}
    if ending:
        got["ended"] = ending
    got["seconds"] = round(time.perf_counter() - started, 1)
    print(f"stage {backend}: {ending or 'done'} in {got['seconds']} s", flush=True)
    return got


def merge(results: dict[str, Any], backend: str, got: dict[str, Any]) -> None:
    """An engine stage's findings into the results: its checks, and its rates per file."""
    keys = ("ended", "seconds", "imported")
    results["stages"][backend] = {k: got[k] for k in keys if k in got}
    if "software" in got and got["software"] not in results["software"]:
        results["software"] = f"{got['software']}, {results['software']}"
    for key in ("quantized_on_gpu", "deepseek_v4_twin"):
        if key in got:
            results[key] = got[key]
    for label, _ in FILES:
        rate = got.get("rates", {}).get(label, {"error": got.get("ended", "not run")})
        results["rates"].setdefault(label, {})[backend] = rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--junit", type=Path, help="pytest's JUnit XML of the e2e run")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens per timing run")
    parser.add_argument("--decode", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="a small CPU smoke test")
    parser.add_argument("--limits", default="300,150", help="seconds for the mlx, llama.cpp stages")
    parser.add_argument(
        "--stages",
        default="mlx,llama.cpp",
        help="engine stages to run now ('none': only --junit); results from an earlier run in "
        "--out are kept, so the stages can run in separate calls on the same files",
    )
    parser.add_argument("--scratch", type=Path, help="where the DeepSeek V4 file is written once")
    parser.add_argument("--stage", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--part", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dsv4", type=Path, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.quick:
        opts.reps, opts.prompt, opts.decode = 1, 64, 8
    if opts.stage:
        engine_stage(opts.stage, opts)
        return

    from app.hardware.synthetic_gguf import write_deepseek4

    earlier = opts.out / f"{RESULTS}.json"
    results: dict[str, Any] = json.loads(earlier.read_text()) if earlier.exists() else {}
    results.setdefault("gpu", gpu_name())
    results.setdefault(
        "software",
        f"Python {platform.python_version()}, median of {opts.reps} after a warm-up, "
        f"{opts.prompt}-token prompts, {opts.decode} decoded tokens, each engine in a process "
        "of its own",
    )
    results.setdefault("stages", {})
    results.setdefault("rates", {})
    if opts.junit:
        summary = lambda: junit_summary(opts.junit)  # noqa: E731
        stage(results, "e2e_mlx", lambda: write(opts.out, results), summary)
    scratch = opts.scratch or Path(tempfile.mkdtemp(prefix="mlx-gpu-"))
    scratch.mkdir(parents=True, exist_ok=True)
    opts.dsv4 = scratch / "dsv4-scaled.gguf"
    limits = dict(zip(ENGINES, (float(x) for x in opts.limits.split(",")), strict=True))
    for backend in (b for b in ENGINES if b in opts.stages.split(",")):
        if not opts.dsv4.exists():  # one file for both engines, also across calls
            write_deepseek4(opts.dsv4, mode="scaled", tokenizer_pre="gpt-2")
        merge(results, backend, run_stage(backend, opts, scratch, limits[backend]))
        write(opts.out, results)
    write(opts.out, results)


if __name__ == "__main__":
    main()
