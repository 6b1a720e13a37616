"""`stoke bench dsv4-reference`: Stoke's DeepSeek V4 model beside mlx-vlm's, on the same weights.

Stoke's model was written by hand after llama.cpp's graph; mlx-vlm 0.7.10 ships a well-kept
DeepSeek V4. Whether to keep Stoke's own rests on this: one folder in DeepSeek's release
format (a scaled model with every structural feature, `deepseek_v4_formats`) is loaded by
both, each as its engine holds it on this device (on MLX's CPU build: expanded to float32),
and in one process, rounds interleaved so a busy machine slows both alike:

- exactness: the largest logit difference and top-1 agreement over a prompt, both models in
  float32;
- prefill tok/s: the prompt in one call, from an empty cache, each model in the types its
  engine runs it in on this device;
- decode tok/s: one token per call after a short prompt, each model with its own cache.

The table shows medians and Stoke / mlx-vlm ratios; `--json` writes them with the machine.
mlx-vlm's top-k indexer runs exact (its HISA block selection off), as DeepSeek's model does.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROUNDS = 3
# Sizes over synthetic_gguf's scaled model: "gpu" has the release's attention and indexer
# widths (head 512, rope 64, indexer 64 x 128, top-512, window 128) at 8 layers and 64
# experts, so that kernel launches no longer hide the work.
PRESETS: dict[str, dict[str, int]] = {
    "scaled": {},
    "gpu": {
        "n_layer": 8,
        "n_embd": 1024,
        "n_vocab": 4096,
        "n_head": 16,
        "head_dim": 512,
        "n_rot": 64,
        "q_lora_rank": 512,
        "o_groups": 4,
        "o_lora_rank": 512,
        "sliding_window": 128,
        "n_expert": 64,
        "n_expert_used": 6,
        "n_ff_exp": 512,
        "indexer_heads": 64,
        "indexer_head_dim": 128,
        "indexer_top_k": 512,
    },
}
PAR = 0.95  # a ratio this close to 1 is noise on a shared machine, not a slower model


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dsv4-reference",
        help="Stoke's DeepSeek V4 model vs mlx-vlm's on the same weights (needs mlx-vlm)",
    )
    parser.add_argument("--prompt", type=int, default=512, help="prefill tokens per run")
    parser.add_argument("--decode", type=int, default=32, help="decoded tokens per run")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="runs of each row (median)")
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="scaled",
        help="model size: scaled (the tests' toy) or gpu (the release's attention widths)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also time each part of both models (attention, indexer, experts, ...)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.set_defaults(run=main)


def _prefill(model: Any, tokens: list[int]) -> float:
    import mlx.core as mx

    cache = model.make_cache()
    start = time.perf_counter()
    out = model(mx.array([tokens]), cache=cache)
    mx.eval(getattr(out, "logits", out))
    return len(tokens) / (time.perf_counter() - start)


def _step(model: Any, tokens: Any, cache: Any) -> Any:
    """One call of `model` over `tokens` [1, L] into `cache`: its greedy next token, evaluated."""
    import mlx.core as mx

    out = model(tokens, cache=cache)
    token = mx.argmax(getattr(out, "logits", out)[0, -1])
    mx.eval(token)
    return token


def _decode(model: Any, prompt: list[int], n: int) -> float:
    import mlx.core as mx

    cache = model.make_cache()
    token = _step(model, mx.array([prompt]), cache)
    start = time.perf_counter()
    for _ in range(n):
        token = _step(model, token.reshape(1, 1), cache)
    return n / (time.perf_counter() - start)


def decode_steps(models: dict[str, Any], prompt: list[int], n: int) -> dict[str, float]:
    """Decode tok/s of each model from the median of `n` single steps taken in turn, one
    model's step then the other's: on a machine whose load comes and goes, both see the
    same moments, where whole runs one after the other did not (runs of the same model
    ranged 10-32 tok/s on the busy 2-core box)."""
    import mlx.core as mx

    caches = {name: model.make_cache() for name, model in models.items()}
    tokens = {name: _step(m, mx.array([prompt]), caches[name]) for name, m in models.items()}
    steps: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(n):
        for name, model in models.items():
            start = time.perf_counter()
            tokens[name] = _step(model, tokens[name].reshape(1, 1), caches[name])
            steps[name].append(time.perf_counter() - start)
    return {name: 1 / statistics.median(times) for name, times in steps.items()}


def _pair(exact: bool, **dims: int) -> dict[str, Any]:
    """Stoke's and mlx-vlm's models of one release folder: both in float32 (`exact`, to compare
    their functions), else as each engine holds them on this device (Stoke's `fit_device`;
    mlx-vlm's float parameters in bfloat16 on a GPU as its `cast_predicate` casts them, in
    float32 on the CPU, whose MoE gathers take nothing else)."""
    import mlx.core as mx

    from app.bench import deepseek_v4_formats as formats
    from app.engine.mlx.deepseek_v4 import Model, ModelArgs
    from app.engine.mlx.fit import fit_device

    with tempfile.TemporaryDirectory() as tmp:
        source, _, _ = formats.source_model(Path(tmp), **dims)
        folder = Path(tmp) / "official"
        formats.write_official(source, folder)
        # mlx-lm's loader, without importing mlx_lm.utils (and through it transformers)
        stoke = Model(ModelArgs.from_dict(json.loads((folder / "config.json").read_text())))
        weights = mx.load(str(next(folder.glob("*.safetensors"))))
        stoke.load_weights(list(stoke.sanitize(weights).items()), strict=True)
        models = {
            "stoke": fit_device(stoke, gguf=False),
            "mlx-vlm": formats.reference_model(folder),
        }
        for model in models.values():
            mx.eval(model.parameters())  # read before the folder goes
    if exact:
        models["stoke"].set_dtype(mx.float32)
    elif mx.default_device() != mx.cpu:
        formats.to_bfloat16(models["mlx-vlm"])
    return models


def _agreement(models: dict[str, Any], tokens: list[int]) -> tuple[float, float]:
    """Largest logit difference and top-1 agreement of the pair over `tokens`."""
    import numpy as np

    from app.bench import deepseek_v4_formats as formats

    ours, theirs = (formats.logits(models[name], tokens) for name in ("stoke", "mlx-vlm"))
    return float(np.abs(ours - theirs).max()), formats.top1_agreement(ours, theirs)


def measure(
    prompt: int, decode: int, rounds: int, preset: str = "scaled", parts: bool = False
) -> dict[str, Any]:
    """Load both models from one release folder and measure them side by side. Exactness is
    measured twice: with every compressed row attended (the indexer picking all: the same
    function must give the same logits) and with the indexer picking 8 (Stoke's indexer reads
    Q and K in fp16 by its kernels' contract, mlx-vlm's in fp32, so near-ties may go either
    way)."""
    import mlx.core as mx
    import numpy as np

    dims = PRESETS[preset]
    tokens = np.random.default_rng(7).integers(2, 512, prompt).tolist()
    every_row = _agreement(_pair(True, **{**dims, "indexer_top_k": prompt}), tokens)
    picked = _agreement(_pair(True, **dims), tokens)
    models = _pair(False, **dims)
    runs: dict[str, dict[str, list[float]]] = {n: {"prefill": [], "decode": []} for n in models}
    short = tokens[:64]
    steps: list[tuple[str, str, Callable[[], float]]] = [
        (name, kind, fn)
        for name, model in models.items()
        for kind, fn in (
            ("prefill", lambda m=model: _prefill(m, tokens)),
            ("decode", lambda m=model: _decode(m, short, decode)),
        )
    ]
    for _ in range(rounds):
        for name, kind, fn in steps:
            runs[name][kind].append(fn())
    medians = {n: {k: statistics.median(v) for k, v in kinds.items()} for n, kinds in runs.items()}
    stepped = decode_steps(models, short, decode * rounds)
    for name, rate in stepped.items():
        medians[name]["decode_step"] = rate
    report = {
        "device": str(mx.default_device()),
        "preset": preset,
        "machine": f"{platform.machine()}, {platform.processor() or platform.system()}",
        "prompt_tokens": prompt,
        "decode_tokens": decode,
        "rounds": rounds,
        "every_row": {"max_abs_logit_diff": every_row[0], "top1_agreement": every_row[1]},
        "picked": {"max_abs_logit_diff": picked[0], "top1_agreement": picked[1]},
        "tok_s": medians,
        "runs": runs,
        "ratio": {
            k: medians["stoke"][k] / medians["mlx-vlm"][k]
            for k in ("prefill", "decode", "decode_step")
        },
    }
    if parts:
        from app.bench.deepseek_v4_profile import profile

        report["profile"] = profile(models, tokens, min(decode, 16))
    return report


def decision(report: dict[str, Any]) -> str:
    """Keep Stoke's model only where it is as exact and at least as fast (within noise)."""
    # the same function: equal to float32 rounding on the CPU; a GPU's float32 matmuls round
    # more (TF32), which these random models' flat logits feel, so there top-1 decides
    exact = report["every_row"]["top1_agreement"] >= 0.99
    # decode by steps taken in turn (decode_steps): whole runs swing with the machine's load
    judged = {k: r for k, r in report["ratio"].items() if k != "decode"}
    fast = min(judged.values()) >= PAR
    if exact and fast:
        return "keep Stoke's model: as exact as mlx-vlm's and at least as fast"
    if not exact:
        return "the models disagree: find which one is wrong before choosing"
    slow = ", ".join(k for k, r in judged.items() if r < PAR)
    return f"Stoke's model is slower at {slow}: build on mlx-vlm's there, or find the cause"


def table(report: dict[str, Any]) -> str:
    tok = report["tok_s"]
    rows = [
        f"DeepSeek V4 ({report['preset']}, {report['device']}): Stoke vs mlx-vlm, same weights, "
        f"medians of {report['rounds']}",
        f"{'':10} {'prefill tok/s':>14} {'decode tok/s':>13} {'decode, steps in turn':>22}",
        *(
            f"{name:10} {tok[name]['prefill']:14.1f} {tok[name]['decode']:13.1f} "
            f"{tok[name]['decode_step']:22.1f}"
            for name in ("stoke", "mlx-vlm")
        ),
        f"{'ratio':10} {report['ratio']['prefill']:13.2f}x {report['ratio']['decode']:12.2f}x "
        f"{report['ratio']['decode_step']:21.2f}x",
        *(
            f"{label}: max |logit difference| {report[key]['max_abs_logit_diff']:.2e}, "
            f"top-1 agreement {report[key]['top1_agreement']:.1%} over "
            f"{report['prompt_tokens']} tokens"
            for key, label in (
                ("every_row", "indexer attends every row"),
                ("picked", "indexer picks its top-k (fp16 Q/K in Stoke's)"),
            )
        ),
        f"decision: {report['decision']}",
    ]
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    try:
        from app.bench import deepseek_v4_formats as formats

        formats.vlm_classes()
    except ImportError:
        from app.bench.deepseek_v4_formats import MLX_VLM

        print(
            "This benchmark runs on MLX and compares with mlx-vlm's DeepSeek V4; one of them "
            "is not installed. Install mlx-vlm without its dependencies: "
            f"pip install --no-deps '{MLX_VLM}' pillow"
        )
        return 2
    report = measure(args.prompt, args.decode, args.rounds, args.preset, args.profile)
    report["decision"] = decision(report)
    print(table(report))
    if "profile" in report:
        from app.bench import deepseek_v4_profile

        print(deepseek_v4_profile.table(report["profile"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", "utf-8")
    return 0
