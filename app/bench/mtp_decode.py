"""Decode tok/s of DeepSeek V4 with its own MTP head drafting, against plain decoding.

Writes a scaled `deepseek4` GGUF with the MTP block (`write_deepseek4(mtp=True)`, random
weights) and loads it twice on each engine asked for, speculation "off" and "mtp", in one
process. Every repetition asks both for the same greedy reply to a fresh prompt (a slot of
its own, so nothing is reused), alternating, so a noisy machine slows both alike. Decode
tok/s is the engine's own (after the first token), median over the repetitions, with what the
head drafted and what was kept; the replies must be token for token the same (greedy), and
a mismatch is recorded, not hidden.

Random weights make a head whose guesses are rarely right, so these rows measure what the
MTP path costs and how fast the adaptive control turns it off, not the gain a trained head
gives (the MTP logits are checked against llama.cpp's in tests/e2e/test_mtp.py).

Presets: "cpu" (the tests' toy sizes, runs on 2 cores) and "gpu" (the release's attention
shapes, head 512, indexer 64 x 128, with a 1024-wide residual and 8 layers: for an H200 with
MLX on CUDA). Writes mtp-decode.json to --out (default $OUT, else ./out).

    python3 -m app.bench.mtp_decode --preset gpu --engines mlx --reps 5 --tokens 256
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.protocol import GenerationStats, LoadOptions, SamplingParams, TokenEvent
from app.hardware.synthetic_gguf import write_deepseek4

PRESETS: dict[str, dict[str, Any]] = {
    # head 128: llama.cpp cannot make an MTP context when the head is the indexer's width
    "cpu": {"weights": "f32", "head_dim": 128},
    "gpu": {
        "weights": "f16",
        "n_layer": 8,
        "n_embd": 1024,
        "n_vocab": 32_000,
        "n_head": 16,
        "head_dim": 512,
        "n_rot": 64,
        "q_lora_rank": 256,
        "o_groups": 4,
        "o_lora_rank": 256,
        "sliding_window": 128,
        "n_expert": 16,
        "n_expert_used": 4,
        "n_ff_exp": 512,
        "indexer_heads": 64,
        "indexer_head_dim": 128,
        "indexer_top_k": 512,
    },
}
METHODS = ("off", "mtp")


def _runtime(name: str) -> type:
    if name == "mlx":
        from app.engine.mlx.backend import MlxEngine

        return MlxEngine
    from app.engine.llamacpp.backend import LlamaCppEngine

    return LlamaCppEngine


def _reply(engine: Any, prompt: list[int], n: int, slot: str) -> tuple[list[int], GenerationStats]:
    out, stats = [], None
    for event in engine.generate(prompt, SamplingParams.greedy(), n, slot=slot):
        if isinstance(event, TokenEvent):
            out.append(event.token_id)
        else:
            stats = event
    return out, stats


def bench_engine(
    name: str, path: Path, n_vocab: int, reps: int, tokens: int, prompt_len: int
) -> dict[str, Any]:
    """Both methods on one engine: per-repetition rows and the medians."""
    runtime = _runtime(name)
    engines = {}
    for method in METHODS:
        engine = runtime()
        engine.load(
            LoadOptions(str(path), n_ctx=4096, n_batch=512, snapshots=False, speculation=method)
        )
        engines[method] = engine
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    try:
        drafters = [d.name for d in engines["mtp"]._drafters]
        for rep in range(reps + 1):  # the first is a warm-up (compiles, first allocations)
            prompt = rng.integers(2, n_vocab, prompt_len).tolist()
            replies = {}
            for method, engine in engines.items():
                out, stats = _reply(engine, prompt, tokens, f"rep{rep}")
                replies[method] = out
                if rep:
                    rows.append(
                        {
                            "rep": rep,
                            "method": method,
                            "decode_tok_s": round(stats.decode_tok_s, 2),
                            "generated": stats.generated_tokens,
                            "drafted": stats.drafted_tokens,
                            "accepted": stats.accepted_tokens,
                        }
                    )
            if rep:
                rows[-1]["same_reply"] = replies["mtp"] == replies["off"]
    finally:
        for engine in engines.values():
            engine.unload()
    medians = {
        method: statistics.median(r["decode_tok_s"] for r in rows if r["method"] == method)
        for method in METHODS
    }
    mtp_rows = [r for r in rows if r["method"] == "mtp"]
    return {
        "engine": name,
        "drafters": drafters,
        "decode_tok_s_median": medians,
        "ratio": round(medians["mtp"] / medians["off"], 3) if medians["off"] else None,
        "drafted": sum(r["drafted"] for r in mtp_rows),
        "accepted": sum(r["accepted"] for r in mtp_rows),
        "all_replies_equal": all(r["same_reply"] for r in mtp_rows),
        "rows": rows,
    }


def _machine() -> dict[str, Any]:
    """What ran it (without app.bench.kv's imports, which the GPU machine may lack)."""
    try:
        import mlx.core as mx

        device = str(mx.default_device())
    except ImportError:
        device = "no mlx"
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "system": f"{platform.system()} {platform.release()}",
        "mlx_device": device,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--engines", nargs="+", choices=["mlx", "llama.cpp"], default=["mlx"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=256)
    args = parser.parse_args()
    dims = dict(PRESETS[args.preset])
    weights = dims.pop("weights")
    report: dict[str, Any] = {
        "bench": "mtp-decode",
        "preset": args.preset,
        "dims": dims,
        "weights": weights,
        "machine": _machine(),
        "reps": args.reps,
        "tokens": args.tokens,
        "prompt": args.prompt,
        "results": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_deepseek4(
            Path(tmp) / "dsv4-mtp.gguf", mode="scaled", weights=weights, mtp=True, **dims
        )
        n_vocab = dims.get("n_vocab", 512)
        for name in args.engines:
            result = bench_engine(name, path, n_vocab, args.reps, args.tokens, args.prompt)
            report["results"].append(result)
            (args.out / "mtp-decode.json").write_text(json.dumps(report, indent=1))
            off, mtp = result["decode_tok_s_median"]["off"], result["decode_tok_s_median"]["mtp"]
            print(
                f"{name:9} plain {off:8.1f} tok/s  mtp {mtp:8.1f} tok/s  x{result['ratio']}  "
                f"drafted {result['drafted']} kept {result['accepted']}  "
                f"same replies: {result['all_replies_equal']}"
            )


if __name__ == "__main__":
    main()
