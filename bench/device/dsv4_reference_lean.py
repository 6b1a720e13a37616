"""Runs THERE (a GPU machine with MLX CUDA and mlx-vlm, ../shared/device): Stoke's DeepSeek V4
model beside mlx-vlm's at the gpu preset, without `stoke bench dsv4-reference`'s float32
agreement runs (minutes of kernel compiles on a fresh machine, and the function they check is
proven on the CPU by the tests): prefill and decode tok/s, rounds interleaved with the first a
warm-up, medians of the rest; decode also as single steps taken in turn (`decode_steps`, what
`decision` judges on); then the per-part profile. Usage: PROMPT_TOKENS OUT.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from app.bench import deepseek_v4_profile as profiler
from app.bench import deepseek_v4_reference as reference

ROUNDS = 4  # the first warms up


def main(prompt: int, out: Path) -> None:
    start = time.time()
    models = reference._pair(False, **reference.PRESETS["gpu"])
    print("built", round(time.time() - start, 1), mx.default_device(), flush=True)
    tokens = np.random.default_rng(7).integers(2, 512, prompt).tolist()
    runs: dict[str, dict[str, list[float]]] = {n: {"prefill": [], "decode": []} for n in models}
    for i in range(ROUNDS):
        for name, model in models.items():
            runs[name]["prefill"].append(reference._prefill(model, tokens))
            runs[name]["decode"].append(reference._decode(model, tokens[:64], 32))
        last = {n: {k: round(v[-1], 1) for k, v in kinds.items()} for n, kinds in runs.items()}
        print("round", i, last, flush=True)
    runs = {n: {k: v[1:] for k, v in kinds.items()} for n, kinds in runs.items()}
    medians = {n: {k: statistics.median(v) for k, v in kinds.items()} for n, kinds in runs.items()}
    for name, rate in reference.decode_steps(models, tokens[:64], 32 * (ROUNDS - 1)).items():
        medians[name]["decode_step"] = rate
    ratio = {
        k: medians["stoke"][k] / medians["mlx-vlm"][k] for k in ("prefill", "decode", "decode_step")
    }
    print("medians", medians, "ratio", ratio, flush=True)
    parts = profiler.profile(models, tokens, 16)
    print(profiler.table(parts), flush=True)
    report = {
        "device": str(mx.default_device()),
        "preset": "gpu",
        "prompt_tokens": prompt,
        "decode_tokens": 32,
        "rounds": ROUNDS - 1,
        "tok_s": medians,
        "ratio": ratio,
        "runs": runs,
        "profile": parts,
    }
    print(reference.decision({**report, "every_row": {"top1_agreement": 1.0}}), "(speed only)")
    out.write_text(json.dumps(report, indent=1), "utf-8")
    print("took", round(time.time() - start, 1))


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
