"""Issue 8, end to end: DeepSeek V4 prefill tok/s at 16k and 64k context on an NVIDIA GPU,
with the lightning indexer's CUDA twin against the pure-MLX reference indexer.

Builds a scaled-down DeepSeek V4 in-process with random bf16 weights: the attention and the
indexer keep the release's shapes where they drive the indexer's cost (head dim 512, one
shared K=V row, 128-token window, indexer 64 heads x 128, top 512 rows, 4:1 and 128:1
layers), the rest is small (hidden 1024, 8 layers, 16 experts). Each run prefills a fresh
cache in chunks of --chunk tokens, as the MLX engine does, evaluating the cache after every
chunk; the indexer implementation is forced through STOKE_INDEXER_IMPL. One warm-up run of
two chunks per implementation compiles the kernels first. Medians over --reps runs, with
mx.synchronize() before each clock read. The two implementations' last-chunk logits are
compared (they pick the same rows up to fp16 ties, so the top-1 tokens should agree).

Three indexer paths: "reference" (the kernels' pure-MLX reference, forced), "argpartition"
(mlx-lm's fp32 scores + argpartition, swapped in for the op: a baseline that runs on any GPU
even if the reference's uint64 sort does not) and "cuda" (the twin). A path that fails is
recorded and the others still run.

Writes deepseek_v4_prefill.json and .md to --out (default $OUT, else ./out) after every
measurement. On a machine without CUDA the twin is skipped (a CPU smoke test, in float32:
--contexts 64 --chunk 32 --reps 1). Needs mlx, mlx-lm and numpy; packages mlx-lm imports as
it loads but this never uses (transformers, huggingface_hub, ...) get stand-ins if absent.
On the H200 machine, after ../shared/device/README.md's two MLX install calls:

    PYTHONPATH=/tmp/mlxsite PYTHONUNBUFFERED=1 python3 app/bench/deepseek_v4_prefill.py
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import platform
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# "argpartition": mlx-lm's indexer (fp32 matmul + ReLU + head sum + argpartition, FIELD_NOTES'
# 28 ms reference at 16k rows), put in place of the op for a baseline that runs on any GPU.
IMPLEMENTATIONS = ("reference", "argpartition", "cuda")
MODEL = {
    "vocab_size": 4096,
    "hidden_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 512,
    "o_groups": 4,
    "o_lora_rank": 256,
    "sliding_window": 128,
    "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128],
    "rope_scaling": {
        "type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    },
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 512,
    "num_hash_layers": 3,
}


def log(message: str) -> None:
    print(message, flush=True)


# What mlx-lm imports when its package loads but this bench never uses (tokenizers, the Hub).
_OPTIONAL = frozenset(
    {"transformers", "huggingface_hub", "jinja2", "tqdm", "yaml", "sentencepiece"}
)


class _Absent(type):
    """A stand-in class whose every class attribute is a no-op (`AutoTokenizer.register`)."""

    def __getattr__(cls, name: str) -> Any:
        return lambda *args, **kwargs: None


class _AbsentModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(name, (), {})


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: answers only for _OPTIONAL packages nothing else found."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.partition(".")[0] not in _OPTIONAL:
            return None
        self.used.add(name.partition(".")[0])
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _AbsentModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def import_model() -> tuple[Any, Any, str, str]:
    """The model module and the indexer's switch. A GPU machine may lack packages mlx-lm
    imports as it loads (transformers, huggingface_hub, ...): those get empty stand-ins."""
    stand_ins = _StandIns()
    sys.meta_path.append(stand_ins)
    from app.engine.mlx import deepseek_v4
    from app.engine.mlx.kernels import cuda_indexer
    from app.engine.mlx.kernels.indexer import IMPLEMENTATION_ENV

    note = ""
    if stand_ins.used:
        note = f"stand-ins for {', '.join(sorted(stand_ins.used))} (absent; never used here)"
    return deepseek_v4, cuda_indexer, IMPLEMENTATION_ENV, note


def random_model(deepseek_v4: Any, seed: int, dtype: mx.Dtype) -> Any:
    """The scaled model with random weights (fan-in scaled; norms near 1)."""
    args = deepseek_v4.ModelArgs(**MODEL)
    model = deepseek_v4.Model(args)
    keys = mx.random.split(mx.random.key(seed), len(tree_flatten(model.parameters())))
    params = []
    for k, (name, value) in zip(keys, tree_flatten(model.parameters()), strict=True):
        if name.endswith("tid2eid"):
            experts = mx.argsort(
                mx.random.uniform(shape=(args.vocab_size, args.n_routed_experts), key=k), axis=1
            )
            params.append((name, experts[:, : args.num_experts_per_tok].astype(mx.int32)))
        elif value.ndim >= 2:
            w = mx.random.normal(value.shape, key=k) * value.shape[-1] ** -0.5
            params.append((name, w.astype(dtype)))
        else:
            params.append(
                (name, (1.0 + 0.1 * mx.random.normal(value.shape, key=k)).astype(mx.bfloat16))
            )
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


def argpartition_top_k(
    q: mx.array, weights: mx.array, keys: mx.array, n_visible: mx.array, k: int
) -> mx.array:
    """mlx-lm's indexer selection (deepseek_v32): fp32 scores, then argpartition; -1 marks
    rows the query may not see, as the op's contract asks."""
    n_q, n_heads, dim = q.shape
    scores = (q.astype(mx.float32).reshape(-1, dim) @ keys.astype(mx.float32).T).reshape(
        n_q, n_heads, -1
    )
    scores = (mx.maximum(scores, 0) * weights.astype(mx.float32)[..., None]).sum(axis=1)
    visible = mx.arange(keys.shape[0])[None] < n_visible[:, None]
    scores = mx.where(visible, scores, -mx.inf)
    picked = mx.argpartition(-scores, kth=k - 1, axis=-1)[:, :k].astype(mx.int32)
    return mx.where(mx.take_along_axis(visible, picked, axis=-1), picked, -1)


def prefill(model: Any, tokens: list[int], chunk: int) -> tuple[float, list[float], mx.array]:
    """Seconds for the whole prompt, per chunk, and the last chunk's logits."""
    cache = model.make_cache()
    per_chunk = []
    mx.synchronize()
    start = time.perf_counter()
    logits = None
    for i in range(0, len(tokens), chunk):
        t0 = time.perf_counter()
        logits = model(mx.array([tokens[i : i + chunk]]), cache)
        mx.eval(logits, [c.state for c in cache])
        mx.synchronize()
        per_chunk.append(time.perf_counter() - t0)
    return time.perf_counter() - start, per_chunk, logits[0]


def environment(cuda_indexer: Any, note: str) -> dict[str, Any]:
    gpu = os.popen(
        "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null"
    ).read()
    return {
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "cuda": cuda_indexer.available(),
        "gpu": gpu.strip() or "none",
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "note": note,
    }


def markdown(data: dict[str, Any]) -> str:
    env = data["environment"]
    lines = [
        "# DeepSeek V4 prefill: CUDA indexer twin vs reference",
        "",
        f"{env['gpu']} · MLX {env['mlx']} ({env['device']}, {data['dtype']}) · "
        f"chunk {data['chunk']} tokens · "
        f"median of {data['reps']} runs · scaled model: {json.dumps(data['model'])}",
        "",
        "| context | indexer | prefill tok/s | total s | last chunk ms | vs reference "
        "| vs argpartition |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        ratios = [
            f"{row[key]:.2f}x" if key in row else "—"
            for key in ("speedup_vs_reference", "speedup_vs_argpartition")
        ]
        lines.append(
            f"| {row['context']:,} | {row['implementation']} | {row['tok_s']:,.0f} | "
            f"{row['seconds']:.2f} | {row['last_chunk_ms']:.0f} | {' | '.join(ratios)} |"
        )
    for check in data["agreement"]:
        lines.append(
            f"\nAt {check['context']:,}, CUDA twin vs {check['against']}: last-chunk top-1 "
            f"agreement {check['top1']:.2%}, max |logit difference| {check['max_abs']:.3g}."
        )
    for skip in data["skipped"]:
        lines.append(f"\nSkipped {skip}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--contexts", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    deepseek_v4, cuda_indexer, switch, note = import_model()
    data: dict[str, Any] = {
        "environment": environment(cuda_indexer, note),
        "model": MODEL,
        "chunk": args.chunk,
        "reps": args.reps,
        "rows": [],
        "agreement": [],
        "skipped": [],
    }

    def write() -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "deepseek_v4_prefill.json").write_text(json.dumps(data, indent=2) + "\n")
        (args.out / "deepseek_v4_prefill.md").write_text(markdown(data))

    log(json.dumps(data["environment"]))
    # MLX's CPU gather_mm (the experts) runs float32 only: bf16 where there is a GPU
    dtype = mx.bfloat16 if mx.default_device() == mx.gpu else mx.float32
    data["dtype"] = str(dtype)
    model = random_model(deepseek_v4, args.seed, dtype)
    implementations = [i for i in IMPLEMENTATIONS if i != "cuda" or cuda_indexer.available()]
    if "cuda" not in implementations:
        data["skipped"].append("the CUDA twin: MLX has no CUDA device here.")
    op = deepseek_v4.top_k_indices
    rng = np.random.default_rng(args.seed)
    for context in args.contexts:
        tokens = rng.integers(0, MODEL["vocab_size"], context).tolist()
        last_logits = {}
        for impl in implementations:
            os.environ[switch] = "reference" if impl == "argpartition" else impl
            deepseek_v4.top_k_indices = argpartition_top_k if impl == "argpartition" else op
            try:
                prefill(model, tokens[: 2 * args.chunk], args.chunk)  # warm-up: compile
                runs = [prefill(model, tokens, args.chunk) for _ in range(args.reps)]
            except Exception as error:  # a failed path is a finding; the others still run
                data["skipped"].append(f"{impl} at {context:,}: {type(error).__name__}: {error}")
                log(f"!! {impl} at {context:,} failed: {error}")
                write()
                continue
            seconds = statistics.median(r[0] for r in runs)
            last_logits[impl] = np.array(runs[-1][2].astype(mx.float32))
            row = {
                "context": context,
                "implementation": impl,
                "seconds": seconds,
                "tok_s": context / seconds,
                "last_chunk_ms": 1000 * statistics.median(r[1][-1] for r in runs),
                "runs_s": [r[0] for r in runs],
            }
            for base in ("reference", "argpartition"):
                for other in data["rows"]:
                    if other["context"] == context and other["implementation"] == base != impl:
                        row[f"speedup_vs_{base}"] = other["seconds"] / seconds
            data["rows"].append(row)
            log(f"{context:>7,} {impl:>12}: {row['tok_s']:,.0f} tok/s ({seconds:.2f} s)")
            write()
        for impl in ("reference", "argpartition"):
            if impl in last_logits and "cuda" in last_logits:
                base, twin = last_logits[impl], last_logits["cuda"]
                data["agreement"].append(
                    {
                        "context": context,
                        "against": impl,
                        "top1": float((base.argmax(-1) == twin.argmax(-1)).mean()),
                        "max_abs": float(np.abs(base - twin).max()),
                    }
                )
        write()
    log(markdown(data))


if __name__ == "__main__":
    main()
