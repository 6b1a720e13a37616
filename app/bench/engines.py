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
underneath. `--prompt` takes several lengths (a row each: prefill of that many tokens and
decode at that depth). `--one-at-a-time` loads one side, runs all its rounds, unloads it and
then does the same for the other: a model that fits a machine once (DeepSeek V4 Flash at full
size on one GPU) cannot be held twice, at the cost of the interleaving.
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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from app.bench.output import emit
from app.bench.placed import planned
from app.engine.protocol import GenerationStats, LoadOptions, SamplingParams

Side = Callable[[int, int], tuple[float, float]]  # (prompt tokens, n) -> prefill, decode tok/s
Opener = Callable[[], AbstractContextManager[Side]]  # loads a side for a while


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "engines", help="Stoke's engines beside llama-cpp-python, llama-server and mlx-lm"
    )
    parser.add_argument("--model", help="a GGUF (default: the default model)")
    parser.add_argument(
        "--prompt",
        default="512",
        help="prompt tokens per run; several, comma-separated, give a row each (4096,32768)",
    )
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
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="hold one side at a time (a model too large to load twice), not interleaved",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="place the model as `stoke plan` does on this machine (GPUs, experts in RAM where "
        "they do not fit), for the longest prompt; both sides load it so",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.set_defaults(run=main)


def _prompt(n_vocab: int, n: int) -> list[int]:
    """Ordinary ids spread over the vocabulary, the same every run."""
    return [(11 + 97 * i) % (n_vocab - 1) + 1 for i in range(n)]


def _stoke(engine: Any, info: Any) -> Side:
    """A fresh slot per run: prefill, then `n` greedy tokens with the end tokens banned."""
    banned = info.eog_ids
    sampling = SamplingParams(
        temperature=0.0, top_p=1.0, min_p=0.0, seed=0, logit_bias=tuple((t, -1e9) for t in banned)
    )
    runs = itertools.count()

    def run(length: int, n: int) -> tuple[float, float]:
        prompt = _prompt(info.n_vocab, length)
        slot = f"bench-{next(runs)}"
        prefill = engine.prefill(prompt, slot=slot)
        *_, stats = engine.generate(prompt, sampling, n, slot=slot)
        assert isinstance(stats, GenerationStats) and stats.generated_tokens == n
        return prefill.prefill_tok_s, stats.decode_tok_s

    return run


@contextmanager
def _stoke_engine(make: Callable[[], Any], options: LoadOptions) -> Iterator[tuple[Any, Any]]:
    """A Stoke engine (`make()`) loaded with `options`, unloaded after."""
    engine = make()
    info = engine.load(options)
    try:
        yield engine, info
    finally:
        engine.unload()


@contextmanager
def _stoke_side(engine: str, options: LoadOptions) -> Iterator[Side]:
    """Stoke's `engine` ("llama.cpp" or "mlx"), loaded for the runs."""
    if engine == "mlx":
        from app.engine.mlx.backend import MlxEngine as make
    else:
        from app.engine.llamacpp.backend import LlamaCppEngine as make

    with _stoke_engine(make, options) as (loaded, info):
        yield _stoke(loaded, info)


@contextmanager
def _llama(options: LoadOptions) -> Iterator[Side]:
    """llama-cpp-python's own `Llama`: its `eval` and `sample`, as a program using the
    bindings directly would."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=options.model_path,
        n_ctx=options.n_ctx,
        n_batch=options.n_batch,
        n_ubatch=options.n_ubatch,
        n_threads=options.n_threads,
        n_threads_batch=options.n_threads,
        flash_attn=options.flash_attn,
        verbose=False,
    )

    def run(length: int, n: int) -> tuple[float, float]:
        prompt = _prompt(llm.n_vocab(), length)
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

    try:
        yield run
    finally:
        llm.close()


@contextmanager
def _llama_server(binary: Path, options: LoadOptions) -> Iterator[Side]:
    """llama.cpp's own llama-server on the same file and flags; its in-server timings."""
    from app.bench import llama_server
    from app.engine.gguf_info import inspect_gguf

    n_vocab = inspect_gguf(options.model_path).vocab_size
    if not n_vocab:
        raise SystemExit(f"{options.model_path} has no vocabulary to draw a prompt from")
    with (
        tempfile.TemporaryDirectory() as tmp,
        llama_server.running(binary, options, Path(tmp) / "server.log") as server,
    ):

        def run(length: int, n: int) -> tuple[float, float]:
            timings = server.complete(_prompt(n_vocab, length), n)
            return timings["prompt_per_second"], timings["predicted_per_second"]

        yield run


@contextmanager
def _mlx_lm(options: LoadOptions) -> Iterator[Side]:
    """mlx-lm's `generate_step` on the model object Stoke's MLX engine loads (the same
    weights, the same code), with a fresh mlx-lm prompt cache per run."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    from app.engine.mlx.backend import MlxEngine

    with _stoke_engine(MlxEngine, options) as (engine, info):
        model = engine._loaded.model

        def run(length: int, n: int) -> tuple[float, float]:
            steps = generate_step(
                mx.array(_prompt(info.n_vocab, length)),
                model,
                max_tokens=n,
                sampler=lambda logprobs: mx.argmax(logprobs, axis=-1),  # never stops on an end
                prompt_cache=make_prompt_cache(model),
            )
            began = time.perf_counter()
            next(steps)
            first = time.perf_counter()
            count = sum(1 for _ in steps)
            return length / (first - began), count / (time.perf_counter() - first)

        yield run


def _mlx_device(device: Any) -> str:
    """MLX's device, with the GPU's name where it is an NVIDIA one (MLX's CUDA build)."""
    name = str(device)
    if "gpu" not in name or shutil.which("nvidia-smi") is None:
        return name
    from app.bench.mlx_gpu import gpu_name

    return f"{name}: {gpu_name()}"


def _rounds(side: Side, length: int, args: argparse.Namespace) -> list[tuple[float, float]]:
    return [side(length, args.decode) for _ in range(args.rounds + 1)]


def _compare(stoke: Opener, runtime: Opener, lengths: list[int], args: argparse.Namespace) -> dict:
    """Both sides at each length: interleaved rounds (both held at once), or with
    --one-at-a-time every round of one side, then of the other. The first round of each
    side and length warms up and is dropped."""
    runs: dict[int, dict[str, list[tuple[float, float]]]] = {n: {} for n in lengths}
    if args.one_at_a_time:
        for name, opener in (("stoke", stoke), ("runtime", runtime)):
            with opener() as side:
                for n in lengths:
                    runs[n][name] = _rounds(side, n, args)
    else:
        with stoke() as ours, runtime() as theirs:
            for n in lengths:
                runs[n] = {"stoke": [], "runtime": []}
                for _ in range(args.rounds + 1):
                    runs[n]["stoke"].append(ours(n, args.decode))
                    runs[n]["runtime"].append(theirs(n, args.decode))
    return {n: _summary(by_side) for n, by_side in runs.items()}


def _summary(runs: dict[str, list[tuple[float, float]]]) -> dict[str, Any]:
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


def _pairs(
    engines: list[str], options: LoadOptions
) -> tuple[list[tuple[str, str, Opener, Opener, dict[str, str]]], dict[str, str]]:
    """(engine, beside, Stoke's side, the runtime's side, extra fields) for each engine
    asked for that can run here; the others with why not. llama.cpp is imported only when
    asked: a process that holds MLX's CUDA build and llama.cpp's crashed
    (app/bench/mlx_gpu.py), so on a GPU each engine runs in a process of its own."""
    pairs, skipped = [], {}
    if {"llama.cpp", "llama-server"} & set(engines):
        from app.engine.llamacpp.openmp import spin_briefly

        spin_briefly()  # before llama.cpp loads, as the engine process does (a busy box stalls)
    ours = lambda: _stoke_side("llama.cpp", options)  # noqa: E731
    if "llama.cpp" in engines:
        pairs.append(("llama.cpp", "llama-cpp-python Llama", ours, lambda: _llama(options), {}))
    if "llama-server" in engines:
        from app.engine.llamacpp.tools import find_tools

        tools, reason = find_tools()
        if tools is None:
            skipped["llama-server"] = reason
        else:
            server = lambda: _llama_server(tools.llama_server, options)  # noqa: E731
            pairs.append(("llama-server", "llama.cpp llama-server", ours, server, {}))
    if "mlx" in engines:
        if importlib.util.find_spec("mlx") is None:
            skipped["mlx"] = "MLX is not installed"
        else:
            import mlx.core as mx

            device = {"device": _mlx_device(mx.default_device())}
            mlx_ours, mlx_lm = (lambda: _stoke_side("mlx", options)), (lambda: _mlx_lm(options))
            pairs.append(("mlx", "mlx-lm generate_step", mlx_ours, mlx_lm, device))
    return pairs, skipped


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Each engine asked for, in turn, at each prompt length."""
    from app.engine.safe_mode import cpu_identity
    from app.models.default import default_model_path

    model = args.model or str(default_model_path())
    threads = args.threads or os.cpu_count() or 1
    lengths = [int(n) for n in str(args.prompt).split(",") if n.strip()]
    options = LoadOptions(
        model,
        n_ctx=max(max(lengths) + args.decode + 64, 512),
        n_seq_max=1,
        n_threads=threads,
        snapshots=False,
        speculation="off",
    )
    placed = planned(options) if args.plan else None
    if placed is not None:
        options = placed[0]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    pairs, skipped = _pairs(engines, options)
    rows = []
    for name, beside, stoke, runtime, extra in pairs:
        for length, result in _compare(stoke, runtime, lengths, args).items():
            rows.append({"engine": name, "beside": beside, "prompt_tokens": length, **extra})
            rows[-1].update(result)
    return {
        "benchmark": "engines",
        "machine": {**cpu_identity(), "cores": os.cpu_count(), "system": platform.platform()},
        "model": Path(model).name,
        "threads": threads,
        "prompt_tokens": lengths,
        "decode_tokens": args.decode,
        "rounds": args.rounds,
        "one_at_a_time": bool(args.one_at_a_time),
        "plan": placed[1] if placed is not None else None,
        "rows": rows,
        "skipped": skipped,
    }


def table(report: dict[str, Any]) -> str:
    how = "one side at a time" if report.get("one_at_a_time") else "rounds interleaved"
    lines = [
        f"{report['model']} on {report['machine']['model']} ({report['threads']} threads): "
        f"{report['decode_tokens']} decoded after each prompt, medians of {report['rounds']}, "
        f"{how}",
        "",
        "| engine | beside | prompt | prefill tok/s Stoke / runtime | ratio "
        "| decode tok/s Stoke / runtime | ratio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        s, r, x = row["stoke"], row["runtime"], row["ratio"]
        where = f" ({row['device']})" if "device" in row else ""
        lines.append(
            f"| {row['engine']}{where} | {row['beside']} | {row['prompt_tokens']:,} "
            f"| {s['prefill_tok_s']:.1f} / {r['prefill_tok_s']:.1f} | {x['prefill_tok_s']:.2f}x "
            f"| {s['decode_tok_s']:.1f} / {r['decode_tok_s']:.1f} | {x['decode_tok_s']:.2f}x |"
        )
    lines += [f"{name}: not run: {why}" for name, why in report.get("skipped", {}).items()]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    report = measure(args)
    return emit(report, table(report), args.json)
