"""`stoke bench cpu-buffers`: what llama.cpp's extra CPU buffer types are worth on this machine.

Prompt and decode tok/s of the default model (Q4_1: AMX repacks it, CPU_REPACK does not) and
of a Q4_0 copy (CPU_REPACK's type), under each buffer policy this machine offers ("none" is
plain buffers, the baseline of every ratio). Each run is a child process, since the AMX type
may crash (its row then says so); rounds interleave the policies so a busy machine slows all
alike; the table shows medians of the rounds and ratios against "none" in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from app.bench.output import emit

CHILD_TIMEOUT_S = 600.0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cpu-buffers", help="prompt/decode speed with and without llama.cpp's extra buffer types"
    )
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens per run")
    parser.add_argument("--decode", type=int, default=64, help="decoded tokens per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each row (median)")
    parser.add_argument("--threads", type=int, help="llama.cpp threads (default: all cores)")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.set_defaults(run=main)


def q4_0_copy(model: Path, folder: Path) -> Path:
    """The model requantized to Q4_0 by llama.cpp itself (once; kept in `folder`)."""
    import llama_cpp

    target = folder / f"{model.stem.split('.')[0]}.Q4_0.gguf"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    partial = target.with_suffix(".partial")
    if llama_cpp.llama_model_quantize(str(model).encode(), str(partial).encode(), params) != 0:
        raise SystemExit(f"llama.cpp could not requantize {model.name} to Q4_0")
    partial.replace(target)
    return target


def _child(policy: str, model: str, n_prompt: int, n_decode: int, threads: int) -> dict:
    """One load and run under `policy`: prompt and decode speed, and where weights went."""
    import ctypes

    import llama_cpp

    from app.engine.llamacpp import cpu_buffers

    log: list[str] = []
    keep = llama_cpp.llama_log_callback(lambda _l, text, _u: log.append(text.decode()))
    llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    handle = llama_cpp.llama_model_load_from_file(model.encode(), cpu_buffers.model_params(policy))
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_prompt + n_decode + 16
    cparams.n_batch = cparams.n_ubatch = 512
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(handle, cparams)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(handle))
    tokens = [(11 + 97 * i) % n_vocab for i in range(n_prompt + n_decode)]
    batch = llama_cpp.llama_batch_init(512, 0, 1)

    def decode(start: int, size: int) -> None:
        batch.n_tokens = size
        for j in range(size):
            batch.token[j], batch.pos[j] = tokens[start + j], start + j
            batch.n_seq_id[j], batch.seq_id[j][0] = 1, 0
            batch.logits[j] = j == size - 1
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")

    began = time.perf_counter()
    for start in range(0, n_prompt, 512):
        decode(start, min(512, n_prompt - start))
    prompt_s = time.perf_counter() - began
    began = time.perf_counter()
    for i in range(n_decode):
        decode(n_prompt + i, 1)
    decode_s = time.perf_counter() - began
    buffers = [line.split("load_tensors:")[-1].strip() for line in log if "buffer size" in line]
    return {
        "prompt_tok_s": n_prompt / prompt_s,
        "decode_tok_s": n_decode / decode_s,
        "buffers": [b for b in buffers if "model buffer" in b],
    }


def _run_child(policy: str, model: Path, args: argparse.Namespace, threads: int) -> dict:
    command = [sys.executable, "-m", "app.bench.cpu_buffers", "--child", policy, str(model)]
    command += [str(args.prompt), str(args.decode), str(threads)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT_S:.0f} s"}
    if done.returncode < 0:
        return {"error": f"crashed (signal {-done.returncode})"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from app import paths
    from app.engine.llamacpp import cpu_buffers
    from app.engine.safe_mode import cpu_identity
    from app.models.default import default_model_path

    default = default_model_path()
    models = {"Q4_1 (default)": default, "Q4_0": q4_0_copy(default, paths.cache_dir() / "bench")}
    extra = cpu_buffers.extra_type_names()
    policies = ["none", "all"] + (["no-amx"] if "AMX" in extra else [])
    threads = args.threads or os.cpu_count() or 1
    runs: dict[tuple[str, str], list[dict]] = {(m, p): [] for m in models for p in policies}
    for _ in range(args.rounds):
        for label, model in models.items():
            for policy in policies:
                runs[(label, policy)].append(_run_child(policy, model, args, threads))
    rows = []
    for (label, policy), results in runs.items():
        good = [r for r in results if "error" not in r]
        row: dict[str, Any] = {"model": label, "policy": policy, "runs": len(results)}
        if len(good) < len(results):
            row["error"] = next(r["error"] for r in results if "error" in r)
        if good:
            row["prompt_tok_s"] = statistics.median(r["prompt_tok_s"] for r in good)
            row["decode_tok_s"] = statistics.median(r["decode_tok_s"] for r in good)
            row["buffers"] = good[0]["buffers"]
        rows.append(row)
    for row in rows:
        base = next(r for r in rows if r["model"] == row["model"] and r["policy"] == "none")
        for key in ("prompt_tok_s", "decode_tok_s"):
            if key in row and key in base:
                row[key.replace("tok_s", "vs_none")] = row[key] / base[key]
    return {
        "benchmark": "cpu-buffers",
        "machine": {**cpu_identity(), "cores": os.cpu_count(), "system": platform.platform()},
        "extra_types": list(extra),
        "verdict": cpu_buffers.machine_verdict().as_dict(),
        "threads": threads,
        "prompt_tokens": args.prompt,
        "decode_tokens": args.decode,
        "rounds": args.rounds,
        "rows": rows,
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        f"CPU: {report['machine']['model']} ({report['threads']} threads); extra types: "
        f"{', '.join(report['extra_types']) or 'none'}; verdict: {report['verdict']['policy']}",
        f"{report['prompt_tokens']} prompt + {report['decode_tokens']} decoded tokens, "
        f"median of {report['rounds']}",
        "",
        "| model | policy | prompt tok/s | vs none | decode tok/s | vs none | weights in |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in report["rows"]:
        if "prompt_tok_s" not in row:
            lines.append(f"| {row['model']} | {row['policy']} | {row['error']} | | | | |")
            continue
        where = "; ".join(b.split(" model buffer")[0] for b in row["buffers"])
        lines.append(
            f"| {row['model']} | {row['policy']} | {row['prompt_tok_s']:.1f} | "
            f"{row['prompt_vs_none']:.2f}x | {row['decode_tok_s']:.1f} | "
            f"{row['decode_vs_none']:.2f}x | {where} |"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    report = measure(args)
    return emit(report, table(report), args.json)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        policy, model, n_prompt, n_decode, threads = sys.argv[2:7]
        print(json.dumps(_child(policy, model, int(n_prompt), int(n_decode), int(threads))))
    else:
        parser = argparse.ArgumentParser(prog="python -m app.bench.cpu_buffers")
        add_parser(parser.add_subparsers(dest="benchmark", required=True))
        parsed = parser.parse_args(["cpu-buffers", *sys.argv[1:]])
        sys.exit(parsed.run(parsed))
