"""Where each DeepSeek V4 model spends its time: per-part milliseconds, Stoke's beside mlx-vlm's.

`stoke bench dsv4-reference --profile` adds this to the side-by-side run: one prefill and a few
decode steps of each model with every part's call timed inclusively (its inputs evaluated
before the clock starts, its outputs evaluated and the device synchronised before it stops).
Evaluating at every boundary removes MLX's overlap of launches with work, so the absolute
times are slower than the plain runs; the point is which part of one model costs more than
the same part of the other. Parts nest (the indexer and the compressors run inside
attention); "other" is the whole call less the outermost parts.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# part -> (module, class or None for a module-level function, attribute) per model
_STOKE = {
    "attention": ("app.engine.mlx.deepseek_v4", "Attention", "__call__"),
    "compressor": ("app.engine.mlx.deepseek_v4.compressor", "Compressor", "__call__"),
    "indexer": ("app.engine.mlx.deepseek_v4", "Indexer", "__call__"),
    "indexer top-k": ("app.engine.mlx.deepseek_v4", None, "top_k_indices"),
    "moe": ("app.engine.mlx.deepseek_v4.moe", "MoE", "__call__"),
    "routed experts": ("mlx_lm.models.switch_layers", "SwitchGLU", "__call__"),
    "hc collapse": ("app.engine.mlx.deepseek_v4.hyper", "HyperMix", "collapse"),
    "hc expand": ("app.engine.mlx.deepseek_v4.hyper", None, "_expand"),
    "head": ("app.engine.mlx.deepseek_v4", "Model", "output"),
}
_VLM = "mlx_vlm.models.deepseek_v4."
_MLX_VLM = {
    "attention": (_VLM + "language", "LocalAttention", "__call__"),
    "compressor": (_VLM + "language", "Compressor", "__call__"),
    "indexer": (_VLM + "language", "Indexer", "__call__"),
    "moe": (_VLM + "language", "DeepseekV4MoE", "__call__"),
    "routed experts": ("mlx_vlm.models.switch_layers", "SwitchGLU", "__call__"),
    "hc collapse": (_VLM + "hyper_connection", "HyperConnection", "__call__"),
    "hc expand": (_VLM + "hyper_connection", None, "hc_expand"),
    "head": (_VLM + "hyper_connection", "HyperHead", "__call__"),
}
PARTS = {"stoke": _STOKE, "mlx-vlm": _MLX_VLM}
OUTER = ("attention", "moe", "hc collapse", "hc expand", "head")


def _arrays(value: Any) -> list[Any]:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    return [v for _, v in tree_flatten(value) if isinstance(v, mx.array)]


def _settle(value: Any) -> None:
    import mlx.core as mx

    mx.eval(_arrays(value))
    mx.synchronize()


@contextmanager
def timed(parts: dict[str, tuple[str, str | None, str]]) -> Iterator[dict[str, float]]:
    """Patch each part's callable to add its seconds to the yielded totals; restore after."""
    totals: dict[str, float] = defaultdict(float)
    undo: list[Callable[[], None]] = []

    def wrap(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            _settle((args, kwargs))
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            _settle(out)
            totals[label] += time.perf_counter() - start
            return out

        return timed_call

    for label, (module_name, class_name, attr) in parts.items():
        owner: Any = sys.modules[module_name]
        if class_name is not None:
            owner = getattr(owner, class_name)
        original = owner.__dict__.get(attr) if class_name else getattr(owner, attr)
        if isinstance(original, staticmethod):
            original = original.__func__
        fn = original if original is not None else getattr(owner, attr)
        setattr(owner, attr, wrap(label, fn))
        undo.append(
            (lambda o=owner, a=attr, f=original: setattr(o, a, f))
            if original is not None
            else (lambda o=owner, a=attr: delattr(o, a))
        )
    try:
        yield totals
    finally:
        for step in reversed(undo):
            step()


def profile(models: dict[str, Any], tokens: list[int], decode: int) -> dict[str, Any]:
    """Per-part milliseconds of one prefill of `tokens` and `decode` single-token steps, each
    after one untimed pass of the same calls."""
    import mlx.core as mx

    report: dict[str, Any] = {}
    for name, model in models.items():
        report[name] = {}
        for phase in ("prefill", "decode"):
            for _pass in ("warm-up", "timed"):  # the first compiles what each model compiles
                cache = model.make_cache()
                if phase == "decode":
                    _settle(model(mx.array([tokens[:64]]), cache=cache))
                    steps = [[t] for t in tokens[64 : 64 + decode]]
                else:
                    steps = [tokens]
                with timed(PARTS[name]) as totals:
                    start = time.perf_counter()
                    for step in steps:
                        _settle(model(mx.array([step]), cache=cache))
                    whole = time.perf_counter() - start
            ms = {k: 1000 * v / len(steps) for k, v in totals.items()}
            ms["whole call"] = 1000 * whole / len(steps)
            ms["other"] = ms["whole call"] - sum(ms.get(k, 0.0) for k in OUTER)
            report[name][phase] = ms
    return report


def table(report: dict[str, Any]) -> str:
    """Per-part ms per call (prefill: the whole prompt; decode: one token) and Stoke / mlx-vlm."""
    labels = [*_STOKE, "other", "whole call"]
    rows = [f"{'part (ms per call)':22} {'prefill':>22} {'decode':>22}"]
    pair = f"{'stoke':>7} {'mlx-vlm':>7} {'x':>6}"
    rows.append(f"{'':22} {pair} {pair}")
    for label in labels:
        cells = []
        for phase in ("prefill", "decode"):
            ours = report["stoke"][phase].get(label)
            theirs = report["mlx-vlm"][phase].get(label)
            ratio = f"{ours / theirs:5.2f}x" if ours and theirs else f"{'-':>6}"
            cells.append(
                f"{ours if ours is not None else float('nan'):7.2f} "
                f"{theirs if theirs is not None else float('nan'):7.2f} {ratio}"
            )
        rows.append(f"{label:22} {cells[0]} {cells[1]}")
    return "\n".join(rows)
