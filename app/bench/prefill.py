"""`stoke bench prefill`: a new conversation's prefill speed against the tokens other
conversations hold resident, for each KV layout, side by side in one process.

A new conversation (a fresh ~450- and ~2,000-token prompt) is prefilled beside 0, 4k, 16k
and 32k resident tokens (conversations of `--resident-size` tokens each), on llama.cpp with
the resident conversations in one shared pool (`kv_unified`, the old design) and in a KV
stream each (the new default), and on MLX (a cache per conversation). Both llama.cpp layouts
get the same memory: n_seq_max windows of n_ctx cells, the shared pool one n_ctx past the
default model's 8,192-token training context (each conversation stays within it).

Residents are made without prefilling each one: one real prefill's snapshot goes into the
engine's own RAM tier under token lists that share no prefix (their first token differs),
and each list is then prefilled in a slot of its own, which restores the snapshot into cells
of its own, as a switch back to an evicted conversation does. What a new prefill pays for
them is their attention cells, not their text. Medians over `--reps`, the layouts taking
turns rep by rep; ratios are against the same layout with nothing resident. Prints a table
and writes JSON.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from app.bench.kv import machine, paragraph
from app.bench.output import emit
from app.engine.llamacpp import verdict_file
from app.engine.protocol import LoadOptions
from app.engine.slots import SlotEngine

LAYOUTS = {  # name -> (engine, kv_unified, what it is)
    "pool": ("llama.cpp", True, "llama.cpp, one shared pool (old)"),
    "streams": ("llama.cpp", False, "llama.cpp, a stream each (new)"),
    "mlx": ("mlx", False, "MLX, a cache each"),
}
TARGET = 0.9  # within 10% of the empty context's speed


def _engine(backend: str) -> SlotEngine:
    if backend == "mlx":
        from app.engine.mlx.backend import MlxEngine

        return MlxEngine()
    from app.engine.llamacpp.backend import LlamaCppEngine

    return LlamaCppEngine()


@contextmanager
def loaded(model: str, layout: str, n_ctx: int, n_seq_max: int) -> Iterator[SlotEngine]:
    backend, unified, _ = LAYOUTS[layout]
    engine = _engine(backend)
    engine.load(
        LoadOptions(
            model,
            n_ctx=n_ctx * n_seq_max if unified else n_ctx,  # the same cells either way
            n_seq_max=n_seq_max,
            kv_unified=unified,
            kv_disk_budget=0,  # snapshots in RAM only: no disk writes while timing
            kv_ram_budget=16 << 30,
            engine=backend,
        )
    )
    try:
        yield engine
    finally:
        engine.unload()


def text_tokens(engine: SlotEngine, tag: str, n: int) -> list[int]:
    """`n` tokens of filler prose that start with `tag` (no two prompts share a prefix)."""
    tokens: list[int] = []
    part = 0
    while len(tokens) < n:
        tokens += engine.tokenize(f"[{tag} {part}] {paragraph(tag, 12)} ")
        part += 1
    return tokens[:n]


class Residents:
    """The resident conversations of one engine, grown to each level in turn."""

    def __init__(self, engine: SlotEngine, size: int) -> None:
        self.engine, self.size = engine, size
        self.count = 0
        self._seed = text_tokens(engine, "resident", size)
        engine.prefill(self._seed, slot="seed")
        engine.snapshot("seed")
        match = engine._kv.best(self._seed)
        self._payload = engine._kv.load(match).payload
        empty(engine, "seed")
        self._heads = [t for t in range(engine.info.n_vocab) if t != self._seed[0]]

    def grow_to(self, n_tokens: int) -> None:
        while self.count * self.size < n_tokens:
            tokens = [self._heads[self.count], *self._seed[1:]]
            name = f"resident-{self.count}"
            self.engine._kv.put(name, tokens, self._payload, to_disk=False)
            stats = self.engine.prefill(tokens, slot=name)
            if stats.restored_tokens != len(tokens) - 1:
                raise RuntimeError(f"{name} was prefilled, not restored: {stats}")
            self.count += 1

    def held(self) -> int:
        return sum(len(self.engine.resident_tokens(f"resident-{i}")) for i in range(self.count))


def measure(engine: SlotEngine, tag: str, size: int) -> float:
    """Prefill tok/s of a fresh conversation of `size` tokens (its slot emptied after)."""
    tokens = text_tokens(engine, tag, size)
    stats = engine.prefill(tokens, slot="new")
    if stats.prefilled_tokens != size:
        raise RuntimeError(f"the new conversation prefilled {stats.prefilled_tokens} of {size}")
    empty(engine, "new")
    return stats.prefill_tok_s


def empty(engine: SlotEngine, slot: str) -> None:
    """Free a slot's cells: it keeps one end-of-turn token, which starts no prompt."""
    engine.prefill([engine.info.eog_ids[0]], slot=slot)


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    from app.models.default import default_model_path

    model = args.model or str(default_model_path())
    n_seq_max = max(args.levels) // args.resident_size + 2  # the residents, seed and new
    n_ctx = args.resident_size + max(args.sizes) + 256
    samples: dict[str, dict[int, dict[int, list[float]]]] = {
        name: {level: {size: [] for size in args.sizes} for level in args.levels}
        for name in args.layouts
    }
    held: dict[str, dict[int, int]] = {name: {} for name in args.layouts}
    with ExitStack() as stack:
        stack.enter_context(_private_home())
        engines = {n: stack.enter_context(loaded(model, n, n_ctx, n_seq_max)) for n in args.layouts}
        residents = {n: Residents(e, args.resident_size) for n, e in engines.items()}
        for level in sorted(args.levels):
            for name, group in residents.items():
                group.grow_to(level)
                held[name][level] = group.held()
            for rep in range(args.reps):
                order = args.layouts if rep % 2 == 0 else args.layouts[::-1]
                for name in order:
                    for size in args.sizes:
                        tag = f"new {level} {rep} {size}"
                        speed = measure(engines[name], tag, size)
                        samples[name][level][size].append(speed)
                        print(f"{name}: {level} resident, {size}: {speed:.1f} tok/s", flush=True)
    results = {
        name: {
            str(size): {
                str(level): {
                    "resident_tokens": held[name][level],
                    "prefill_tok_s": round(statistics.median(by_level[level][size]), 1),
                    "samples": [round(s, 1) for s in by_level[level][size]],
                }
                for level in args.levels
            }
            for size in args.sizes
        }
        for name, by_level in samples.items()
    }
    return {
        "benchmark": "prefill",
        "model": Path(model).name,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "params": {
            "reps": args.reps,
            "sizes": args.sizes,
            "levels": args.levels,
            "resident_size": args.resident_size,
            "n_ctx": n_ctx,
            "n_seq_max": n_seq_max,
        },
        "results": results,
        "ratios": ratios(results),
    }


@contextmanager
def _private_home() -> Iterator[None]:
    """Snapshots under a folder of the bench's own (none is written to disk anyway)."""
    import os

    with tempfile.TemporaryDirectory(prefix="stoke-bench-prefill-") as home:
        verdict_file.carry(Path(home))
        old = os.environ.get("STOKE_HOME")
        os.environ["STOKE_HOME"] = home
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("STOKE_HOME", None)
            else:
                os.environ["STOKE_HOME"] = old


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Each level's speed over the same layout's empty context, and the 10% target."""
    out: dict[str, Any] = {}
    for name, by_size in results.items():
        for size, by_level in by_size.items():
            empty = by_level[min(by_level, key=int)]["prefill_tok_s"]
            row = {level: round(v["prefill_tok_s"] / empty, 3) for level, v in by_level.items()}
            out[f"{name} / {size}"] = {**row, "within_10pct": min(row.values()) >= TARGET}
    return out


def render(report: dict[str, Any]) -> str:
    params, levels = report["params"], report["params"]["levels"]
    lines = [
        f"stoke bench prefill — {report['model']} on {report['machine']['cpu']} "
        f"({report['machine']['cores']} cores); a new conversation's prefill tok/s beside "
        f"resident conversations of {params['resident_size']:,} tokens; median of "
        f"{params['reps']}",
        "",
    ]
    header = f"{'layout':<32} {'prompt':>6} " + " ".join(f"{f'{n:,}':>13}" for n in levels)
    lines += [header + "  within 10%", "-" * (len(header) + 12)]
    for name, by_size in report["results"].items():
        for size, by_level in by_size.items():
            ratio = report["ratios"][f"{name} / {size}"]
            cells = [
                f"{by_level[str(n)]['prefill_tok_s']:>6.1f} {ratio[str(n)]:>5.2f}x" for n in levels
            ]
            verdict = "yes" if ratio["within_10pct"] else "no"
            label = LAYOUTS[name][2]
            lines.append(f"{label:<32} {size:>6} " + " ".join(cells) + f"  {verdict}")
    lines.append("")
    lines.append("columns: resident tokens; each cell: tok/s and its ratio to nothing resident")
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prefill", help="a new conversation's prefill speed beside resident ones"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--model", metavar="PATH", help="a GGUF model (default: SmolLM2)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (median)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[450, 2000], help="new prompts")
    parser.add_argument(
        "--levels", type=int, nargs="+", default=[0, 4096, 16384, 32768], help="resident tokens"
    )
    parser.add_argument(
        "--resident-size", type=int, default=4096, help="tokens of each resident conversation"
    )
    parser.add_argument(
        "--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS), help="layouts to run"
    )
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    report = run_bench(args)
    return emit(report, render(report), args.json)
