"""Issue 5's GPU acceptance: Stoke's expert-offload plan on real GPUs, against llama.cpp's fit.

Runs on a machine with CUDA GPUs and the CUDA build of llama-cpp-python (see
../shared/device/README.md); nothing here is part of the app. It

1. writes a synthetic `deepseek4` GGUF of several GiB (`write_deepseek4(mode="scaled")` with
   DeepSeek-V4-Flash's attention and vocabulary, so the planner's CUDA compute calibration
   applies, and fewer, smaller expert layers) unless it exists;
2. plans it with `planner.plan` for every GPU at an artificial budget (6 GiB by default),
   loads it through `LlamaCppEngine` with `load_options(plan)`, prefills ~2,000 tokens and
   decodes 32, and compares the plan's predicted bytes per device (weights, KV, compute)
   with what llama.cpp's load log says it allocated (and with nvidia-smi);
3. runs llama.cpp's own `llama-fit-params` (built from the same vendored source) on the same
   file with `--fit-target` set so that each GPU keeps the same budget, resolves where its
   `-ngl/-ts/-ot` put each expert tensor (a `no_alloc` load of its arguments), loads and runs
   it the same way, and compares the expert bytes each placement keeps on the GPUs.

Writes `gpu-offload.json` and `gpu-offload.md` to `--out` (after every stage, so a run cut
short still leaves what it measured). An earlier run on 2x H200 segfaulted in every load of a
file with DeepSeek's own pre-tokenizer: its std::wregex split, compiled at vocab load, crashed
inside the CUDA build of llama-cpp-python. The file here uses the GPT-2 pre-tokenizer, which
llama.cpp splits without std::regex (placement and memory do not depend on it), and
`--regex-probe` loads the vocabulary of a small file with DeepSeek's pre-tokenizer in a child
process to record whether that crash still happens.

    python3 app/bench/gpu_offload.py --out $OUT [--fit-params PATH] [--fit-wait SECONDS]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import types
from collections import deque
from pathlib import Path
from typing import Any

# libllama before numpy: on the H200 machine a process that had imported numpy first
# segfaulted in llama.cpp's first model load (std::regex at vocab load), while a child that
# imported llama_cpp first loaded the same vocabulary. --make-only runs before the CUDA build
# is installed, hence the suppress.
with contextlib.suppress(ImportError):
    import llama_cpp  # noqa: F401
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("STOKE_HOME", "/tmp/stoke-home")  # app.paths never asks platformdirs
try:
    import platformdirs  # noqa: F401
except ImportError:  # the GPU machine's image lacks it; with STOKE_HOME it is never called
    sys.modules["platformdirs"] = types.ModuleType("platformdirs")

from app.hardware import synthetic_gguf  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
TOLERANCE = 0.05
# DeepSeek-V4-Flash's attention, hyper-connections and vocabulary (the calibrated compute
# model's shape), with 12 layers of 64 experts of 1,024: 12.8 GiB, 9.6 GiB of it experts.
DIMS: dict[str, int] = {
    **dataclasses.asdict(synthetic_gguf.FLASH),
    "n_layer": 12,
    "n_expert": 64,
    "n_ff_exp": 1024,
    "n_ctx_train": 65_536,
}
_FAIL_WORDS = ("failed to allocate", "out of memory", "cudamalloc failed", "alloc failed")


# -- the model file ---------------------------------------------------------------------------


def _fast_random(original):
    """`_random_tensor`, but large matrices are a block of 1,024 random rows repeated: the
    writer's own random weights for 13 GiB take many minutes of numpy, and the bytes and
    shapes (all that placement and memory depend on) are the same."""
    rows_kept = 1024

    def make(spec, qtype, d, rng):
        n = math.prod(spec.shape)
        if n < 8 * MIB or len(spec.shape) < 2 or qtype == synthetic_gguf.Q.I32:
            return original(spec, qtype, d, rng)
        ne0 = spec.shape[0]
        rows = n // ne0
        r0 = min(rows, rows_kept)
        block = original(synthetic_gguf.TensorSpec(spec.name, (ne0, r0), spec.role), qtype, d, rng)
        full = np.tile(block, (-(-rows // r0), 1))[:rows]
        return full.reshape(*reversed(spec.shape[1:]), block.shape[-1])

    return make


def make_model(path: Path) -> dict[str, Any]:
    done = path.with_suffix(".done")
    if path.exists() and done.exists():
        return json.loads(done.read_text())
    start = time.perf_counter()
    synthetic_gguf._random_tensor = _fast_random(synthetic_gguf._random_tensor)
    synthetic_gguf.write_deepseek4(path, mode="scaled", seed=0, tokenizer_pre="gpt-2", **DIMS)
    meta = {
        "path": str(path),
        "bytes": path.stat().st_size,
        "dims": {k: DIMS[k] for k in ("n_layer", "n_embd", "n_vocab", "n_expert", "n_ff_exp")},
        "write_s": round(time.perf_counter() - start, 1),
    }
    done.write_text(json.dumps(meta))
    return meta


# -- the machine ------------------------------------------------------------------------------


def smi() -> list[dict[str, Any]]:
    """Per GPU: index, name, used/free/total MiB (nvidia-smi; the driver's view)."""
    try:
        text = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.used,memory.free,memory.total",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in text.strip().splitlines():
        idx, name, used, free, total = (p.strip() for p in line.split(","))
        rows.append(
            {"index": int(idx), "name": name, "used": int(used), "free": int(free),
             "total": int(total)}
        )  # fmt: skip
    return rows


def ram_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


# -- llama.cpp's log --------------------------------------------------------------------------


class _Tee(deque):
    """A deque that also writes each line to a file as it comes (survives a crash)."""

    def __init__(self, sink) -> None:
        super().__init__()
        self.sink = sink

    def append(self, line: str) -> None:
        super().append(line)
        self.sink.write(line)
        self.sink.flush()


class FullLog:
    """The engine's log callback, made to keep every line (it keeps the last 200), with a
    copy on disk."""

    def __init__(self, path: Path) -> None:
        from app.engine.llamacpp.backend import _install_log

        self.log = _install_log()
        self.log.lines = _Tee(path.open("w", encoding="utf-8"))

    def take(self) -> str:
        text = "".join(self.log.lines)
        self.log.lines.clear()
        return text


def failures(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if any(w in ln.lower() for w in _FAIL_WORDS)]


def by_device(parsed: dict[str, Any], gpus: list[str]) -> dict[str, dict[str, int]]:
    """Weights, KV and compute bytes per GPU and for the host (all CPU-side buffers)."""
    out: dict[str, dict[str, int]] = {}
    for name in [*gpus, "CPU"]:
        row = {}
        for key, section in (("weights", "model"), ("kv", "kv"), ("compute", "compute")):
            values = parsed[section]
            row[key] = (
                int(values.get(name, 0))
                if name != "CPU"
                else int(sum(v for k, v in values.items() if k not in gpus))
            )
        row["total"] = row["weights"] + row["kv"] + row["compute"]
        out[name] = row
    return out


def expert_placement(info, parsed: dict[str, Any]) -> dict[str, int]:
    """Expert bytes per device: the override that caught each tensor, else its layer's device."""
    out: dict[str, int] = {}
    layers = parsed["layer_device"]
    for t in info.tensors:
        if t.kind != "expert":
            continue
        dev = parsed["overridden"].get(t.name) or layers.get(t.layer, "CPU")
        out[dev] = out.get(dev, 0) + t.n_bytes
    return out


def gpu_bytes(placement: dict[str, int], gpus: list[str]) -> int:
    return sum(v for k, v in placement.items() if k in gpus)


# -- one load and run -------------------------------------------------------------------------


def load_and_run(options, log: FullLog, gpus: list[str], n_prompt: int, n_decode: int, base):
    """Load with `options`, prefill `n_prompt` random tokens and decode `n_decode` greedily."""
    from app.engine.llamacpp.backend import LlamaCppEngine
    from app.engine.protocol import GenerationStats, SamplingParams, TokenEvent
    from app.hardware.memory import parse_load_log

    engine = LlamaCppEngine()
    result: dict[str, Any] = {"loaded": False}
    log.take()
    start = time.perf_counter()
    try:
        info = engine.load(options)
    except Exception as exc:
        text = log.take()
        result.update(error=str(exc), failures=failures(text), log_tail=text[-4000:])
        return result, None
    result["load_s"] = round(time.perf_counter() - start, 2)
    load_text = log.take()
    parsed = parse_load_log(load_text)
    result.update(loaded=True, actual=by_device(parsed, gpus), parsed_model=parsed["model"])
    result["smi_after_load"] = smi()
    rng = np.random.default_rng(1)
    tokens = [int(t) for t in rng.integers(2, info.n_vocab, n_prompt)]
    generated, stats = 0, None
    try:
        for event in engine.generate(tokens, SamplingParams.greedy(), n_decode, slot="bench"):
            if isinstance(event, TokenEvent):
                generated += 1
            elif isinstance(event, GenerationStats):
                stats = event
        result["run_error"] = None
    except Exception as exc:
        result["run_error"] = str(exc)
    run_text = log.take()
    result["smi_after_run"] = smi()
    result["generated"] = generated
    if stats is not None:
        result["stats"] = stats.as_dict()
    result["failures"] = failures(load_text + run_text)
    result["ok"] = result["run_error"] is None and generated == n_decode and not result["failures"]
    result["process_gpu_mib"] = [
        a["used"] - b["used"] for a, b in zip(result["smi_after_run"], base, strict=False)
    ]
    engine.unload()
    return result, parsed


# -- llama.cpp's fit --------------------------------------------------------------------------


def run_fit(exe: Path, model: Path, args, budget_mib: int) -> dict[str, Any]:
    """`llama-fit-params` with targets that leave each GPU exactly `budget_mib` to fill."""
    free = [g["free"] for g in smi()]
    targets = [max(f - budget_mib, 0) for f in free]
    cmd = [
        str(exe), "-m", str(model), "-c", str(args.n_ctx), "-ub", str(args.n_ubatch),
        "-fa", "on", "-np", "1", "--fit-target", ",".join(str(t) for t in targets),
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out: dict[str, Any] = {
        "command": shlex.join(cmd),
        "free_mib_before": free,
        "targets_mib": targets,
        "rc": proc.returncode,
        "secs": round(time.perf_counter() - start, 1),
        "stdout": proc.stdout[-2000:],
        "stderr_tail": proc.stderr[-3000:],
    }
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("-c ")]
    if proc.returncode or not lines:
        return out
    argv = shlex.split(lines[-1])
    parsed: dict[str, Any] = {"n_gpu_layers": 0, "tensor_split": [], "overrides": []}
    for flag, value in zip(argv[::2], argv[1::2], strict=False):
        if flag == "-c":
            parsed["n_ctx"] = int(value)
        elif flag == "-ngl":
            parsed["n_gpu_layers"] = int(value)
        elif flag == "-ts":
            parsed["tensor_split"] = [float(v) for v in value.split(",")]
        elif flag == "-ot":
            parsed["overrides"] = [list(p.rsplit("=", 1)) for p in value.split(",") if p]
    out["args"] = parsed
    return out


# -- the report -------------------------------------------------------------------------------


def _pct(actual: float, predicted: float) -> float | None:
    return round((predicted - actual) / actual * 100, 2) if actual else None


def compare(predicted: dict[str, dict[str, int]], actual: dict[str, dict[str, int]]):
    rows = []
    for dev, pred in predicted.items():
        act = actual.get(dev, {})
        row = {"device": dev}
        for key in ("weights", "kv", "compute", "total"):
            row[f"{key}_pred"] = pred[key]
            row[f"{key}_actual"] = act.get(key, 0)
            row[f"{key}_diff_pct"] = _pct(act.get(key, 0), pred[key])
        rows.append(row)
    return rows


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / MIB:,.1f}"


def markdown(res: dict[str, Any]) -> str:
    out = ["# Expert offload on real GPUs: Stoke's plan vs llama.cpp's fit", ""]
    env = res.get("machine", {})
    gpus = ", ".join(f"{g['name']} ({g['total']:,} MiB)" for g in env.get("gpus", []))
    model = res.get("model", {})
    out += [
        f"- Machine: {gpus or '?'}; llama-cpp-python {env.get('llama_cpp', '?')}",
        f"- Model: synthetic deepseek4 {model.get('dims')}, {model.get('bytes', 0) / GIB:.2f} "
        "GiB (Q8_0 experts, random weights)",
        f"- Budget per GPU: {res['budget_gib']} GiB; context {res['n_ctx']:,}, micro-batch "
        f"{res['n_ubatch']}, f16 KV, flash attention",
        "",
    ]
    stoke = res.get("stoke", {})
    if stoke.get("plan"):
        out += [f"Stoke's plan: `{stoke['plan']['command']}`", ""]
    for title, key in (
        ("allocated by the real load (plan refined by dry runs)", "comparison"),
        ("llama.cpp's no_alloc dry run of the same plan", "dry_run_comparison"),
    ):
        if not stoke.get(key):
            continue
        out += [
            f"## Stoke's prediction vs {title} (MiB; diff = (predicted - actual) / actual)",
            "",
            "| device | weights pred | weights actual | KV pred | KV actual | compute pred | "
            "compute actual | total pred | total actual | total diff | within 5% |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in stoke[key]:
            diff = r["total_diff_pct"]
            ok = "yes" if diff is not None and abs(diff) <= TOLERANCE * 100 else "no"
            out.append(
                f"| {r['device']} | {_mib(r['weights_pred'])} | {_mib(r['weights_actual'])} | "
                f"{_mib(r['kv_pred'])} | {_mib(r['kv_actual'])} | {_mib(r['compute_pred'])} | "
                f"{_mib(r['compute_actual'])} | {_mib(r['total_pred'])} | "
                f"{_mib(r['total_actual'])} | {diff}% | {ok} |"
            )
        out.append("")
    runs = [("Stoke", stoke.get("run")), ("llama.cpp fit", res.get("fit", {}).get("run"))]
    if any(r for _, r in runs):
        out += [
            "## Loads and runs",
            "",
            "| placement | expert GiB on GPUs | loaded | prefill tok/s | decode tok/s | "
            "generated | GPU MiB used by the process (nvidia-smi) | allocation failures |",
            "|---|---:|---|---:|---:|---:|---|---|",
        ]
        experts = {
            "Stoke": stoke.get("expert_bytes_gpu_actual"),
            "llama.cpp fit": res.get("fit", {}).get(
                "expert_bytes_gpu_actual", res.get("fit", {}).get("expert_bytes_gpu")
            ),
        }
        for name, r in runs:
            if not r:
                continue
            s = r.get("stats", {})
            e = experts.get(name)
            out.append(
                f"| {name} | {'-' if e is None else f'{e / GIB:.3f}'} | {r.get('loaded')} | "
                f"{s.get('prefill_tok_s', 0):,.1f} | {s.get('decode_tok_s', 0):,.1f} | "
                f"{r.get('generated', 0)} | {r.get('process_gpu_mib')} | "
                f"{len(r.get('failures', [])) or 'none'} |"
            )
        out.append("")
    fit = res.get("fit", {})
    if fit.get("args"):
        out += [
            "## llama.cpp's fit",
            "",
            f"`{fit['command']}`",
            "",
            f"Printed: `{fit['stdout'].strip().splitlines()[-1]}`",
            "",
        ]
    elif fit:
        out += ["## llama.cpp's fit", "", f"Not run or failed: {fit.get('note', fit.get('rc'))}"]
        out.append("")
    out += ["## Checks", ""]
    out += [f"- {k}: {'PASS' if v else 'FAIL'}" for k, v in res.get("checks", {}).items()]
    return "\n".join(out) + "\n"


def write(res: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-offload.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "gpu-offload.md").write_text(markdown(res))


# -- main -------------------------------------------------------------------------------------


def stage_stoke(args, res, info, p, static, gpus, log, base) -> None:
    """Load `p` (the plan refined by dry runs), run it and compare it with what the load
    allocated; `static` (the calibrated envelope alone) is recorded beside it."""
    from app.engine.protocol import LoadOptions
    from app.hardware.memory import measure_dry_run
    from app.hardware.planner import load_options, plan_to_dict

    predicted = {
        d.name: {"weights": d.weights, "kv": d.kv, "compute": d.compute, "total": d.total}
        for d in p.devices
    }
    stoke: dict[str, Any] = {
        "plan": plan_to_dict(p),
        "predicted": predicted,
        "static_plan": plan_to_dict(static),
        "static_expert_bytes_gpu": static.expert_bytes_gpu,
    }
    res["stoke"] = stoke
    print("plan", p.command, {k: v["total"] / MIB for k, v in predicted.items()}, flush=True)
    try:  # llama.cpp's own no_alloc accounting of the plan, before anything is allocated
        dry = measure_dry_run(
            args.model, p.n_ctx, p.n_ubatch, kv_type=p.kv_type, swa_full=p.swa_full,
            overrides=p.overrides, tensor_split=p.tensor_split or None,
            n_gpu_layers=p.n_gpu_layers,
        )  # fmt: skip
        stoke["dry_run"] = by_device(dry, gpus)
        stoke["dry_run_comparison"] = compare(predicted, stoke["dry_run"])
        stoke["expert_bytes_gpu_dry_run"] = gpu_bytes(expert_placement(info, dry), gpus)
    except Exception as exc:
        stoke["dry_run_error"] = str(exc)
    write(res, args.out)
    print("stoke dry run", json.dumps(stoke.get("dry_run_comparison")), flush=True)
    options = LoadOptions(model_path=str(args.model), snapshots=False, **load_options(p))
    run, parsed = load_and_run(options, log, gpus, args.prompt, args.decode, base)
    stoke["run"] = run
    if parsed is not None:
        stoke["comparison"] = compare(predicted, run["actual"])
        placement = expert_placement(info, parsed)
        stoke["expert_placement_actual"] = placement
        stoke["expert_bytes_gpu_actual"] = gpu_bytes(placement, gpus)
    checks = res["checks"]
    checks["stoke_loads_prefills_decodes_without_allocation_failure"] = bool(run.get("ok"))
    gpu_rows = [r for r in stoke.get("comparison") or [] if r["device"] != "CPU"]
    checks["stoke_predicted_total_within_5pct_per_gpu"] = bool(gpu_rows) and all(
        r["total_diff_pct"] is not None and abs(r["total_diff_pct"]) <= TOLERANCE * 100
        for r in gpu_rows
    )  # (a no_alloc dry run logs weights as 0: its rows compare KV and compute only)
    used = run.get("process_gpu_mib")
    checks["stoke_process_within_budget_per_gpu_nvidia_smi"] = bool(used) and all(
        m <= args.budget_gib * 1024 for m in used
    )
    write(res, args.out)
    print("stoke", json.dumps(stoke.get("comparison")), flush=True)
    print("stoke run", {k: run.get(k) for k in ("ok", "generated", "stats", "failures")})


def stage_fit(args, res, info, p, gpus, log, base) -> None:
    from app.engine.protocol import LoadOptions
    from app.hardware.memory import measure_dry_run

    fit: dict[str, Any] = {}
    res["fit"] = fit
    exe = args.fit_params
    if exe is not None:
        deadline = time.time() + args.fit_wait
        while not exe.exists() and time.time() < deadline:
            if args.fit_marker is not None and args.fit_marker.exists():
                break  # the build ended without the binary
            time.sleep(2)
    if exe is None or not exe.exists():
        fit["note"] = f"llama-fit-params not available ({exe})"
        write(res, args.out)
        print(fit["note"], flush=True)
        return
    fit.update(run_fit(exe, args.model, args, int(args.budget_gib * 1024)))
    write(res, args.out)
    print("fit", fit.get("rc"), fit.get("stdout"), fit.get("args"), flush=True)
    if "args" not in fit:
        return
    a = fit["args"]
    overrides = tuple((pat, dev) for pat, dev in a["overrides"])
    try:
        dry = measure_dry_run(
            args.model, args.n_ctx, args.n_ubatch, swa_full=False, overrides=overrides,
            tensor_split=a["tensor_split"] or None, n_gpu_layers=a["n_gpu_layers"],
        )  # fmt: skip
        placement = expert_placement(info, dry)
        fit["expert_placement"] = placement
        fit["expert_bytes_gpu"] = gpu_bytes(placement, gpus)
        fit["dry_run"] = by_device(dry, gpus)
    except Exception as exc:
        fit["dry_run_error"] = str(exc)
    stoke = res.get("stoke", {})
    ours = stoke.get("expert_bytes_gpu_actual", stoke.get("expert_bytes_gpu_dry_run"))
    ours = p.expert_bytes_gpu if ours is None else ours
    if fit.get("expert_bytes_gpu") is not None:
        res["expert_bytes_gpu"] = {
            "stoke": ours, "fit": fit["expert_bytes_gpu"], "total": p.expert_bytes_total,
        }  # fmt: skip
        res["checks"]["stoke_expert_bytes_on_gpu_ge_fit"] = ours >= fit["expert_bytes_gpu"]
    write(res, args.out)
    fit_options = LoadOptions(
        model_path=str(args.model), n_ctx=a.get("n_ctx", args.n_ctx), n_batch=2048,
        n_ubatch=args.n_ubatch, n_seq_max=1, flash_attn=True,
        n_gpu_layers=a["n_gpu_layers"], overrides=overrides,
        tensor_split=tuple(a["tensor_split"]), swa_full=False, snapshots=False,
    )  # fmt: skip
    fit_run, fit_parsed = load_and_run(fit_options, log, gpus, args.prompt, args.decode, base)
    fit["run"] = fit_run
    if fit_parsed is not None:
        placement = expert_placement(info, fit_parsed)
        fit["expert_placement_actual"] = placement
        fit["expert_bytes_gpu_actual"] = gpu_bytes(placement, gpus)
    write(res, args.out)


def regex_probe(out: Path) -> dict[str, Any]:
    """Load only the vocabulary of a small file with DeepSeek's pre-tokenizer, in a child
    process (a crash ends only it): does the CUDA build still crash in std::wregex?"""
    path = out / "regex-probe.gguf"
    synthetic_gguf.write_deepseek4(path, mode="scaled", n_layer=2)
    code = (
        "import sys, types; sys.modules.setdefault('platformdirs', types.ModuleType('p')); "
        "from app.engine.llamacpp.backend import load_vocab; "
        "v = load_vocab(sys.argv[1]); print('tokens', v.tokenize('Hello, world 123'))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]])}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    path.unlink()
    return {
        "pre_tokenizer": "deepseek-v3",
        "rc": proc.returncode,
        "crashed": proc.returncode < 0,
        "stdout": proc.stdout[-500:],
        "stderr_tail": proc.stderr[-1500:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--model", type=Path, default=Path("/tmp/stoke-gpu/dsv4-offload.gguf"))
    ap.add_argument("--make-only", action="store_true", help="write the GGUF and stop")
    ap.add_argument("--stages", default="stoke,fit", help="stoke, fit or both (comma)")
    ap.add_argument("--regex-probe", action="store_true", help="see regex_probe, then go on")
    ap.add_argument("--margin", type=float, default=0.05, help="the planner's safety margin")
    ap.add_argument(
        "--runtime-mib",
        type=int,
        help="the GPU runtime's own MiB per GPU, as measured (instead of the planner's estimate)",
    )
    ap.add_argument(
        "--reserve-of",
        choices=("device", "budget"),
        default="device",
        help="size the GPU runtime's reserve from the whole device (as the app does) or from "
        "the budget only (256 MiB here: close to what llama-fit-params accounts)",
    )
    ap.add_argument("--fit-params", type=Path, help="llama.cpp's llama-fit-params binary")
    ap.add_argument("--fit-wait", type=float, default=0, help="seconds to wait for that binary")
    ap.add_argument("--fit-marker", type=Path, help="a file its build writes when it ends")
    ap.add_argument("--budget-gib", type=float, default=6.0)
    ap.add_argument("--n-ctx", type=int, default=16_384)
    ap.add_argument("--n-ubatch", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=2000)
    ap.add_argument("--decode", type=int, default=32)
    args = ap.parse_args()

    model_meta = make_model(args.model)
    print("model", model_meta, flush=True)
    if args.make_only:
        return 0
    base = smi()  # before this process touches CUDA
    import llama_cpp

    from app.engine.gguf_info import inspect_gguf
    from app.engine.llamacpp.overrides import buffer_types
    from app.hardware.planner import DeviceBudget, dry_run_compute, plan, refine

    args.out.mkdir(parents=True, exist_ok=True)
    stages = [s for s in args.stages.split(",") if s]
    log = FullLog(args.out / f"llama-{'-'.join(stages)}.log")
    gpus = [name for name in buffer_types() if name != "CPU"]
    previous = args.out / "gpu-offload.json"
    res: dict[str, Any] = json.loads(previous.read_text()) if previous.exists() else {}
    res.update(
        budget_gib=args.budget_gib, margin=args.margin, reserve_of=args.reserve_of,
        runtime_mib=args.runtime_mib,
        n_ctx=args.n_ctx, n_ubatch=args.n_ubatch,
        prompt_tokens=args.prompt, decode_tokens=args.decode, model=model_meta,
    )  # fmt: skip
    res.setdefault("checks", {})
    res["machine"] = {
        "gpus": base,
        "ggml_devices": gpus,
        "ram_available": ram_available(),
        "cpus": os.cpu_count(),
        "llama_cpp": llama_cpp.__version__,
        "python": platform.python_version(),
    }
    info = inspect_gguf(args.model)
    totals = [g["total"] * MIB for g in base] if args.reserve_of == "device" else []
    totals = totals or [None] * len(gpus)
    runtime = None if args.runtime_mib is None else args.runtime_mib * MIB
    budgets = [
        DeviceBudget(g, int(args.budget_gib * GIB), total=t, runtime=runtime)
        for g, t in zip(gpus, totals, strict=False)
    ]
    asked = {
        "ram_bytes": ram_available(), "n_ctx": args.n_ctx, "n_ubatch": args.n_ubatch,
        "margin": args.margin,
    }  # fmt: skip
    p = plan(info, budgets, **asked)
    if args.regex_probe:
        res["regex_probe"] = probe = regex_probe(args.out)
        write(res, args.out)
        print("regex probe", probe["rc"], probe["stdout"], probe["stderr_tail"][-300:], flush=True)
    if "stoke" in stages:
        static, p = p, refine(info, budgets, dry_run_compute, **asked)
        stage_stoke(args, res, info, p, static, gpus, log, base)
    if "fit" in stages:
        stage_fit(args, res, info, p, gpus, log, base)
    write(res, args.out)
    print("checks", res["checks"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
