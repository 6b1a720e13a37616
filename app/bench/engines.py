"""`stoke bench engines`: Stoke's engines beside the runtimes they wrap, on the same model.

- llama.cpp: Stoke's engine vs llama-cpp-python's own `Llama` (its `eval` and `sample`, as a
  program using the bindings directly would): the same GGUF, threads, batch, one sequence of
  the same context and KV type, flash attention alike.
- llama-server: Stoke's llama.cpp engine vs llama.cpp's own server (`make llama-tools`) on
  the same file and flags (bench/llama_server.py), its figures the server's own timings; the
  row says why it did not run where the server is not built.
- MLX: Stoke's engine vs mlx-lm's `generate_step` on the very model object Stoke loaded, with
  a fresh mlx-lm prompt cache per run.

Each run reads a fresh prompt of the same ids (a new slot for Stoke, snapshots and speculation
off, so only the engine's own overhead differs), then decodes `--decode` tokens greedily
(Stoke with the end-of-generation tokens banned, so it does not stop; the runtimes' own loops
never stop on one). Prefill tok/s is the prompt over the
time to its last logits; decode tok/s the tokens after the first over the time after it.
Rounds interleave the sides (a busy machine slows both alike); the table shows medians and
Stoke / runtime ratios of the same run. What is measured is overhead: the same kernels run
underneath.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.bench.output import emit
from app.engine.protocol import GenerationStats, LoadOptions, SamplingParams

Side = Callable[[list[int], int], tuple[float, float]]  # (prompt, n) -> prefill, decode tok/s


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "engines", help="Stoke's engines beside llama-cpp-python's Llama and mlx-lm"
    )
    parser.add_argument("--model", help="a GGUF (default: the default model)")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens per run")
    parser.add_argument("--decode", type=int, default=64, help="decoded tokens per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side (median)")
    parser.add_argument("--threads", type=int, help="llama.cpp threads (default: all cores)")
    parser.add_argument(
        "--engines",
        default="llama.cpp,llama-server,mlx",
        help="which engines to compare: llama.cpp (beside llama-cpp-python), llama-server "
        "(Stoke's llama.cpp engine beside llama.cpp's own server, `make llama-tools`), mlx "
        "(needs MLX installed)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.set_defaults(run=main)


def _prompt(n_vocab: int, n: int) -> list[int]:
    """Ordinary ids spread over the vocabulary, the same every run."""
    return [(11 + 97 * i) % (n_vocab - 1) + 1 for i in range(n)]


def _stoke(engine: Any, banned: tuple[int, ...]) -> Side:
    sampling = SamplingParams(
        temperature=0.0, top_p=1.0, min_p=0.0, seed=0, logit_bias=tuple((t, -1e9) for t in banned)
    )
    runs = itertools.count()

    def run(prompt: list[int], n: int) -> tuple[float, float]:
        slot = f"bench-{next(runs)}"
        prefill = engine.prefill(prompt, slot=slot)
        *_, stats = engine.generate(prompt, sampling, n, slot=slot)
        assert isinstance(stats, GenerationStats) and stats.generated_tokens == n
        return prefill.prefill_tok_s, stats.decode_tok_s

    return run


def _llama(model: str, options: LoadOptions) -> tuple[Side, Any]:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=model,
        n_ctx=options.n_ctx,
        n_batch=options.n_batch,
        n_ubatch=options.n_ubatch,
        n_threads=options.n_threads,
        n_threads_batch=options.n_threads,
        flash_attn=options.flash_attn,
        verbose=False,
    )

    def run(prompt: list[int], n: int) -> tuple[float, float]:
        llm.reset()
        began = time.perf_counter()
        llm.eval(prompt)
        prefill_s = time.perf_counter() - began
        token = llm.sample(temp=0.0)
        began = time.perf_counter()
        for _ in range(n - 1):  # an end token is evaluated like any other: nothing stops here
            llm.eval([token])
            token = llm.sample(temp=0.0)
        return len(prompt) / prefill_s, (n - 1) / (time.perf_counter() - began)

    return run, llm


def _beside_llama_server(
    stoke: Side, options: LoadOptions, prompt: list[int], args: argparse.Namespace
) -> tuple[dict[str, Any] | None, str]:
    """Stoke's llama.cpp engine beside llama.cpp's own llama-server on the same file and
    flags (its in-server timings); None and why when llama-server is not built."""
    from app.bench import llama_server
    from app.engine.llamacpp.tools import find_tools

    tools, reason = find_tools()
    if tools is None:
        return None, reason
    with (
        tempfile.TemporaryDirectory() as tmp,
        llama_server.running(tools.llama_server, options, Path(tmp) / "server.log") as server,
    ):

        def run(ids: list[int], n: int) -> tuple[float, float]:
            timings = server.complete(ids, n)
            return timings["prompt_per_second"], timings["predicted_per_second"]

        return {"beside": "llama.cpp llama-server", **_compare(stoke, run, prompt, args)}, ""


def _mlx_lm(engine: Any) -> Side:
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    model = engine._loaded.model  # the object Stoke loaded: the same weights, the same code

    def run(prompt: list[int], n: int) -> tuple[float, float]:
        steps = generate_step(
            mx.array(prompt),
            model,
            max_tokens=n,
            sampler=lambda logprobs: mx.argmax(logprobs, axis=-1),  # never stops on an end
            prompt_cache=make_prompt_cache(model),
        )
        began = time.perf_counter()
        next(steps)
        first = time.perf_counter()
        count = sum(1 for _ in steps)
        return len(prompt) / (first - began), count / (time.perf_counter() - first)

    return run


def _mlx_device(device: Any) -> str:
    """MLX's device, with the GPU's name where it is an NVIDIA one (MLX's CUDA build)."""
    name = str(device)
    if "gpu" not in name or shutil.which("nvidia-smi") is None:
        return name
    from app.bench.mlx_gpu import gpu_name

    return f"{name}: {gpu_name()}"


def _compare(stoke: Side, runtime: Side, prompt: list[int], args: argparse.Namespace) -> dict:
    runs: dict[str, list[tuple[float, float]]] = {"stoke": [], "runtime": []}
    for _ in range(args.rounds + 1):  # the first round warms both up and is dropped
        runs["stoke"].append(stoke(prompt, args.decode))
        runs["runtime"].append(runtime(prompt, args.decode))
    medians = {
        side: {
            "prefill_tok_s": statistics.median(r[0] for r in values[1:]),
            "decode_tok_s": statistics.median(r[1] for r in values[1:]),
        }
        for side, values in runs.items()
    }
    return {
        **medians,
        "ratio": {
            key: medians["stoke"][key] / medians["runtime"][key]
            for key in ("prefill_tok_s", "decode_tok_s")
        },
        "runs": {side: values[1:] for side, values in runs.items()},
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Each engine asked for, in turn. llama.cpp is imported only when asked: a process that
    holds MLX's CUDA build and llama.cpp's crashed (app/bench/mlx_gpu.py), so on a GPU each
    engine runs in a process of its own (`--engines mlx`, then `--engines llama.cpp`)."""
    from app.engine.safe_mode import cpu_identity
    from app.models.default import default_model_path

    model = args.model or str(default_model_path())
    threads = args.threads or os.cpu_count() or 1
    options = LoadOptions(
        model,
        n_ctx=max(args.prompt + args.decode + 64, 512),
        n_seq_max=1,
        n_threads=threads,
        snapshots=False,
        speculation="off",
    )
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    rows: dict[str, Any] = {}
    skipped: dict[str, str] = {}  # an engine asked for that cannot run here, and why
    if {"llama.cpp", "llama-server"} & set(engines):
        from app.engine.llamacpp.openmp import spin_briefly

        spin_briefly()  # before llama.cpp loads, as the engine process does (a busy box stalls)
        from app.engine.llamacpp.backend import LlamaCppEngine

        engine = LlamaCppEngine()
        info = engine.load(options)
        prompt = _prompt(info.n_vocab, args.prompt)
        stoke = _stoke(engine, info.eog_ids)
        try:
            if "llama.cpp" in engines:
                runtime, llm = _llama(model, options)
                try:
                    rows["llama.cpp"] = {
                        "beside": "llama-cpp-python Llama",
                        **_compare(stoke, runtime, prompt, args),
                    }
                finally:
                    llm.close()
            if "llama-server" in engines:
                row, reason = _beside_llama_server(stoke, options, prompt, args)
                if row is not None:
                    rows["llama-server"] = row
                else:
                    skipped["llama-server"] = reason
        finally:
            engine.unload()
    if "mlx" in engines and importlib.util.find_spec("mlx") is not None:
        import mlx.core as mx

        from app.engine.mlx.backend import MlxEngine

        engine = MlxEngine()
        info = engine.load(options)
        prompt = _prompt(info.n_vocab, args.prompt)
        try:
            rows["mlx"] = {
                "beside": "mlx-lm generate_step",
                "device": _mlx_device(mx.default_device()),
                **_compare(_stoke(engine, info.eog_ids), _mlx_lm(engine), prompt, args),
            }
        finally:
            engine.unload()
    return {
        "benchmark": "engines",
        "machine": {**cpu_identity(), "cores": os.cpu_count(), "system": platform.platform()},
        "model": Path(model).name,
        "threads": threads,
        "prompt_tokens": args.prompt,
        "decode_tokens": args.decode,
        "rounds": args.rounds,
        "rows": rows,
        "skipped": skipped,
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['model']} on {report['machine']['model']} ({report['threads']} threads): "
        f"{report['prompt_tokens']}-token prompt, {report['decode_tokens']} decoded, "
        f"medians of {report['rounds']}",
        "",
        "| engine | beside | prefill tok/s Stoke / runtime | ratio "
        "| decode tok/s Stoke / runtime | ratio |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, row in report["rows"].items():
        s, r, x = row["stoke"], row["runtime"], row["ratio"]
        where = f" ({row['device']})" if "device" in row else ""
        lines.append(
            f"| {name}{where} | {row['beside']} "
            f"| {s['prefill_tok_s']:.1f} / {r['prefill_tok_s']:.1f} | {x['prefill_tok_s']:.2f}x "
            f"| {s['decode_tok_s']:.1f} / {r['decode_tok_s']:.1f} | {x['decode_tok_s']:.2f}x |"
        )
    lines += [f"{name}: not run: {why}" for name, why in report.get("skipped", {}).items()]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    report = measure(args)
    return emit(report, table(report), args.json)
