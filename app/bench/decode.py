"""`stoke bench decode`: decode speed with speculative decoding against plain decoding.

One process, side by side: the same engine class loaded on the same model once per method
(speculation off, prompt lookup alone, the draft model alone, and on llama.cpp "exact"),
each asked for the same greedy replies in turn, repetition by repetition, so a noisy machine
slows them all alike.
Three replies: (a) a code edit, where the reply rewrites a ~400-token code block from the
prompt with small changes (an ordinary module, a settings class, and the request to rename
the class: the default model writes the module out again with a blank line dropped, keeping
the old name), (b) an ordinary chat answer, (c) a summary of a long attachment.
Decode tok/s is the engine's own (after the first token), median over the repetitions;
each speculative reply must be token for token one that plain decoding gives in its own
context (greedy; with 16- or 32-bit weights plain decoding itself can give more than one):
on llama.cpp that is the "exact" row's, plain decoding with the speculative context's flash
attention and q8_0 K, beside "off", the default context. Prints a table and writes JSON.

The draft model is `--draft PATH`, else the model's first two blocks written to a temporary
file (`app/models/truncated_gguf.py`): smaller than its target, as a draft must be to pay.
`--weights bf16` benches a copy of the model with BF16 weights (`engine/llamacpp/quantize.py`),
whose batches llamafile's sgemm takes, where a Q4_1 batch costs nearly its tokens' decodes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.bench.kv import machine, paragraph
from app.engine.llamacpp.quantize import WEIGHT_TYPES, requantize
from app.engine.protocol import GenerationStats, LoadOptions, SamplingParams, TokenEvent

METHODS = ("off", "lookup", "draft")
EXACT = "exact"  # llama.cpp: plain decoding in the speculative context (see _options)
N_CTX = 4096
MODULE = '''import json
import os


class Settings:
    """Application settings kept in a JSON file next to the user's data."""

    def __init__(self, path):
        self.path = path
        self.values = {}

    def load(self):
        if not os.path.exists(self.path):
            return
        with open(self.path, "r", encoding="utf-8") as handle:
            self.values = json.load(handle)

    def save(self):
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as handle:
            json.dump(self.values, handle, indent=2)

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value):
        self.values[key] = value

    def remove(self, key):
        if key in self.values:
            del self.values[key]

    def keys(self):
        return sorted(self.values)

    def update(self, other):
        for key, value in other.items():
            self.values[key] = value

    def clear(self):
        self.values = {}


def load_settings(path):
    settings = Settings(path)
    settings.load()
    return settings


def main():
    settings = load_settings("settings.json")
    settings.set("theme", "dark")
    settings.set("font_size", 12)
    settings.save()
    print(settings.keys())


if __name__ == "__main__":
    main()
'''  # about 390 tokens of ordinary Python, as an agent's file read would bring


def chatml(user: str, assistant_start: str = "") -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant_start}"


def scenarios() -> dict[str, tuple[str, int]]:
    """Each reply's prompt (ChatML, the default model's template) and its max tokens."""
    edit = (
        "Rename the class `Settings` to `Config` in this module, and change nothing else:"
        f"\n\n```python\n{MODULE}```"
    )
    attachment = " ".join(paragraph(topic, 8) for topic in ("harbours", "glaciers", "orchards"))
    return {
        "code_edit": (chatml(edit, "```python\n"), 420),
        "chat": (chatml("What should I pack for a week of hiking in the mountains?"), 200),
        "summary": (chatml(f"{attachment}\n\nSummarise the text above in a paragraph."), 200),
    }


def _engine_class(engine: str) -> Callable[[], Any]:
    if engine == "mlx":
        from app.engine.mlx.backend import MlxEngine

        return MlxEngine
    from app.engine.llamacpp.backend import LlamaCppEngine

    return LlamaCppEngine


def _reply(engine: Any, prompt: list[int], max_tokens: int, slot: str) -> tuple[list[int], Any]:
    tokens, stats = [], None
    for event in engine.generate(prompt, SamplingParams.greedy(), max_tokens, slot=slot):
        if isinstance(event, TokenEvent):
            tokens.append(event.token_id)
        elif isinstance(event, GenerationStats):
            stats = event
    return tokens, stats


def _options(engine: str, model: str, draft: str) -> dict[str, LoadOptions]:
    """Each method's load. On llama.cpp a speculative context gets flash attention over a
    q8_0 K (its verify batches then equal one-token decodes), so "exact" is plain decoding
    in that context, the reply every speculative one must equal; "off" is the user's plain
    context, the speed they compare with."""
    loads = {
        method: LoadOptions(
            model, n_ctx=N_CTX, speculation=method, draft_model=draft, snapshots=False
        )
        for method in METHODS
    }
    if engine == "llama.cpp":
        from app.engine.llamacpp.backend import exact_context

        loads[EXACT] = exact_context(loads["lookup"])
    return loads


def run_bench(
    model: str, draft: str, engine: str, reps: int, only: list[str] | None = None
) -> dict[str, Any]:
    runtime = _engine_class(engine)
    engines = {}
    for method, options in _options(engine, model, draft).items():
        engines[method] = runtime()
        engines[method].load(options)
    results: dict[str, dict[str, Any]] = {}
    try:
        for name, (text, max_tokens) in scenarios().items():
            if only and name not in only:
                continue
            prompt = engines["off"].tokenize(text, special=True)
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in engines}
            replies: dict[str, list[list[int]]] = {m: [] for m in engines}
            for rep in range(reps + 1):  # the first round warms each engine up, untimed
                for method in engines:
                    tokens, stats = _reply(engines[method], prompt, max_tokens, name)
                    replies[method].append(tokens)
                    if rep:
                        runs[method].append(
                            {
                                "decode_tok_s": stats.decode_tok_s,
                                "generated_tokens": stats.generated_tokens,
                                "drafted_tokens": stats.drafted_tokens,
                                "accepted_tokens": stats.accepted_tokens,
                            }
                        )
            results[name] = _summary(prompt, runs, replies)
    finally:
        for instance in engines.values():
            instance.unload()
    return results


def _summary(
    prompt: list[int], runs: dict[str, list[dict[str, Any]]], replies: dict[str, list[list[int]]]
) -> dict[str, Any]:
    """Medians and counts per method; `same_tokens`: every speculative reply is one that plain
    decoding gave. With quantized weights on a CPU plain decoding gives one reply whatever
    the cache held; with 16- or 32-bit weights its reply can change with how the KV was
    written (a prompt prefilled in a batch or found cached), so `plain_replies` says how many
    different replies it gave across the repetitions."""
    base = statistics.median(r["decode_tok_s"] for r in runs["off"])
    plain = {tuple(r) for r in replies.get(EXACT, replies["off"])}
    out: dict[str, Any] = {
        "prompt_tokens": len(prompt),
        "same_tokens": all(tuple(r) in plain for m in ("lookup", "draft") for r in replies[m]),
        "plain_replies": len(plain),
        "methods": {},
    }
    for method, rows in runs.items():
        tok_s = statistics.median(r["decode_tok_s"] for r in rows)
        drafted = sum(r["drafted_tokens"] for r in rows)
        accepted = sum(r["accepted_tokens"] for r in rows)
        out["methods"][method] = {
            "decode_tok_s": round(tok_s, 1),
            "decode_tok_s_runs": [round(r["decode_tok_s"], 1) for r in rows],
            "vs_plain": round(tok_s / base, 2) if base else None,
            "generated_tokens": rows[0]["generated_tokens"],
            "drafted_tokens": drafted // len(rows),
            "accepted_tokens": accepted // len(rows),
            "acceptance": round(accepted / drafted, 3) if drafted else None,
        }
    return out


def check_targets(results: dict[str, Any]) -> dict[str, bool]:
    targets = {}
    if "code_edit" in results:
        ratio = results["code_edit"]["methods"]["lookup"]["vs_plain"]
        targets["code_edit: prompt lookup >= 1.8x plain decode"] = ratio >= 1.8
    if "chat" in results:
        for method in ("lookup", "draft"):
            ratio = results["chat"]["methods"][method]["vs_plain"]
            targets[f"chat: {method} >= 0.95x plain decode"] = ratio >= 0.95
    for name, result in results.items():
        targets[f"{name}: each speculative reply is plain decoding's"] = result["same_tokens"]
    return targets


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"stoke bench decode ({report['engine']}) — {report['model']} (draft: "
        f"{report['draft']}) on {m['cpu']} ({m['cores']} cores), median of {report['reps']}",
        "",
        f"{'reply':<10} {'method':<7} {'decode tok/s':>12} {'vs plain':>9} {'tokens':>7} "
        f"{'drafted':>8} {'kept':>6} {'acceptance':>10}",
    ]
    for name, result in report["results"].items():
        for method, row in result["methods"].items():
            acceptance = f"{row['acceptance']:.0%}" if row["acceptance"] is not None else "-"
            lines.append(
                f"{name:<10} {method:<7} {row['decode_tok_s']:12.1f} {row['vs_plain']:8.2f}x "
                f"{row['generated_tokens']:7d} {row['drafted_tokens']:8d} "
                f"{row['accepted_tokens']:6d} {acceptance:>10}"
            )
    lines.append("")
    lines += [
        f"note  {name}: plain decoding gave {result['plain_replies']} different replies to the "
        "same prompt (batched and one-token kernels round 16/32-bit weights differently)"
        for name, result in report["results"].items()
        if result["plain_replies"] > 1
    ]
    lines += [f"{'PASS' if ok else 'FAIL'}  {name}" for name, ok in report["targets"].items()]
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("decode", help="decode speed: speculative vs plain")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--model", metavar="PATH", help="a GGUF model (default: SmolLM2)")
    parser.add_argument("--draft", metavar="PATH", help="draft model (default: 2-block cut)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (median)")
    parser.add_argument("--engine", choices=("llama.cpp", "mlx"), default="llama.cpp")
    parser.add_argument(
        "--weights",
        choices=WEIGHT_TYPES,
        help="bench a copy of the model with these weight types (and a draft cut from it)",
    )
    parser.add_argument("--only", nargs="+", choices=tuple(scenarios()), help="these replies only")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    from app.models.default import default_model_path
    from app.models.truncated_gguf import write_truncated

    model = args.model or str(default_model_path())
    with tempfile.TemporaryDirectory(prefix="stoke-bench-decode-") as folder:
        if args.weights:
            copy = Path(folder) / f"{Path(model).stem}.{args.weights}.gguf"
            model = str(requantize(Path(model), copy, args.weights))
        draft = args.draft or str(write_truncated(Path(model), Path(folder) / "draft.gguf", 2))
        results = run_bench(model, draft, args.engine, args.reps, args.only)
    report = {
        "benchmark": "decode",
        "engine": args.engine,
        "model": Path(model).name,
        "draft": Path(args.draft).name if args.draft else "first 2 blocks of the model",
        "reps": args.reps,
        "machine": machine(),
        "results": results,
    }
    report["targets"] = check_targets(results)
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", "utf-8")
    return 0
