"""Runs THERE (a GPU machine with MLX CUDA and mlx-vlm, ../shared/device): Stoke's DeepSeek V4
model beside mlx-vlm's at the gpu preset, without `stoke bench dsv4-reference`'s float32
agreement runs (minutes of kernel compiles on a fresh machine, and the function they check is
proven on the CPU by the tests): for each prompt length, prefill and decode tok/s, rounds
interleaved with the first a warm-up, medians of the rest; decode also as single steps taken
in turn (`decode_steps`, what `decision` judges on); with --profile, the per-part profile of
the first length. Usage: PROMPT_TOKENS[,PROMPT_TOKENS...] OUT.json [ROUNDS] [--profile].
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from app.bench import deepseek_v4_profile as profiler
from app.bench import deepseek_v4_reference as reference


def pair_at(models: dict[str, Any], prompt: int, rounds: int) -> dict[str, Any]:
    """One prompt length: interleaved rounds (the first a warm-up), medians and ratios."""
    tokens = np.random.default_rng(7).integers(2, 512, prompt).tolist()
    runs: dict[str, dict[str, list[float]]] = {n: {"prefill": [], "decode": []} for n in models}
    for i in range(rounds):
        for name, model in models.items():
            runs[name]["prefill"].append(reference._prefill(model, tokens))
            runs[name]["decode"].append(reference._decode(model, tokens[:64], 32))
        last = {n: {k: round(v[-1], 1) for k, v in kinds.items()} for n, kinds in runs.items()}
        print(prompt, "round", i, last, flush=True)
    runs = {n: {k: v[1:] for k, v in kinds.items()} for n, kinds in runs.items()}
    medians = {n: {k: statistics.median(v) for k, v in kinds.items()} for n, kinds in runs.items()}
    for name, rate in reference.decode_steps(models, tokens[:64], 32 * (rounds - 1)).items():
        medians[name]["decode_step"] = rate
    ratio = {
        k: medians["stoke"][k] / medians["mlx-vlm"][k] for k in ("prefill", "decode", "decode_step")
    }
    print(prompt, "medians", medians, "ratio", ratio, flush=True)
    return {"prompt_tokens": prompt, "tok_s": medians, "ratio": ratio, "runs": runs}


def main(prompts: list[int], out: Path, rounds: int, profile: bool) -> None:
    start = time.time()
    models = reference._pair(False, **reference.PRESETS["gpu"])
    print("built", round(time.time() - start, 1), mx.default_device(), flush=True)
    report: dict[str, Any] = {
        "device": str(mx.default_device()),
        "preset": "gpu",
        "decode_tokens": 32,
        "rounds": rounds - 1,
        "lengths": [pair_at(models, prompt, rounds) for prompt in prompts],
    }
    if profile:
        tokens = np.random.default_rng(7).integers(2, 512, prompts[0]).tolist()
        report["profile"] = profiler.profile(models, tokens, 16)
        print(profiler.table(report["profile"]), flush=True)
    out.write_text(json.dumps(report, indent=1), "utf-8")
    for length in report["lengths"]:
        judged = {**length, "every_row": {"top1_agreement": 1.0}}
        print(length["prompt_tokens"], reference.decision(judged), "(speed only)")
    print("took", round(time.time() - start, 1))


if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(
        [int(n) for n in args[0].split(",")],
        Path(args[1]),
        int(args[2]) if len(args) > 2 else 4,
        "--profile" in flags,
    )
