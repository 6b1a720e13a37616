"""`stoke doctor`: what this installation can and cannot do, in one report.

A bug report with this attached answers the first questions (versions, devices, whether the
model loads, where files live) before anyone has to ask. Collecting never raises: a broken
piece becomes a line in the report, since a broken installation is when the report matters.
Loads run in subprocesses, so a runtime that crashes or hangs cannot take the report with it.

The window's Copy diagnostics hands in what it knows (`Running`: the engine its model is
loaded on), so its report loads no model again, and it waits a short bound for llama.cpp's
devices: the two loads were most of its ~10 s. `stoke doctor` in a terminal checks all.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import paths
from app.units import decimal_bytes, gib

LOAD_TIMEOUT_S = 60.0
INFO_TIMEOUT_S = 4 * LOAD_TIMEOUT_S  # the CPU buffer verdict may run its probe (once a machine)
WINDOW_TIMEOUT_S = 10.0  # the window's report: its engine loaded, so the verdict is cached
NO_KEYRING = "no keyring backend: secrets are kept in memory only"
_ROOT = Path(__file__).resolve().parents[1]  # the folder holding `app`

# label -> distributions that provide it (PySide6 usually comes as pyside6-essentials)
PACKAGES: dict[str, tuple[str, ...]] = {
    "llama-cpp-python": ("llama-cpp-python",),
    "PySide6": ("PySide6", "PySide6-Essentials"),
    "qasync": ("qasync",),
    "mlx": ("mlx",),
    "mlx-lm": ("mlx-lm",),
    "keyring": ("keyring",),
    "platformdirs": ("platformdirs",),
    "jinja2": ("jinja2",),
}

# Run as `python -c` with the model path as argv[1]; prints one JSON line.
_LLAMACPP_LOAD = """
import json, sys, time
from app.engine.llamacpp.backend import LlamaCppEngine
from app.engine.protocol import EngineError, LoadOptions
engine = LlamaCppEngine()
start = time.perf_counter()
try:
    engine.load(LoadOptions(sys.argv[1], n_ctx=512))
except EngineError as exc:
    print(json.dumps({"ok": False, "error": str(exc)}))
else:
    print(json.dumps({"ok": True, "load_s": round(time.perf_counter() - start, 3)}))
    engine.unload()
"""

_LLAMACPP_PROBE = """
import json
from dataclasses import asdict
import llama_cpp
from app.engine.llamacpp import cpu_buffers, ggml
from app.hardware.detect import cpu_as_system
print(json.dumps({
    "ok": True,
    "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
    "gpu_offload": ggml.gpu_offload_supported(),
    "rpc": ggml.rpc_supported(),
    "devices": cpu_as_system([asdict(d) for d in ggml.list_devices()]),
    "buffer_types": cpu_buffers.machine_verdict().as_dict(),
}))
"""

_MLX_PROBE = """
import json, sys, time
import mlx.core as mx
def available(name):
    backend = getattr(mx, name, None)
    return bool(backend is not None and backend.is_available())
report = {
    "ok": True,
    "device": str(mx.default_device()),
    "metal": available("metal"),
    "cuda": available("cuda"),
}
from app.engine.mlx.backend import MlxEngine
from app.engine.protocol import EngineError, LoadOptions
engine = MlxEngine()
start = time.perf_counter()
try:
    engine.load(LoadOptions(sys.argv[1], n_ctx=512, snapshots=False))
except EngineError as exc:
    report.update(ok=False, error=str(exc))
else:
    report["load_s"] = round(time.perf_counter() - start, 3)
    engine.unload()
print(json.dumps(report))
"""


@dataclass(frozen=True)
class Running:
    """What the running window already knows: its model is loaded on `engine` (a local one,
    "llama.cpp" or "mlx"), so its report need not load it again to learn that."""

    engine: str
    model_path: str


def _version(dists: tuple[str, ...]) -> str:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def _guarded(probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The probe's answer, or its failure as an error entry: one broken piece, one line."""
    try:
        return probe()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _run_probe(code: str, args: list[str], timeout: float) -> dict[str, Any]:
    """Run `code` in a fresh interpreter and read the JSON line it prints last.

    The child imports this same `app` package, installed or not.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"did not finish within {timeout:g} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    if proc.returncode < 0:
        return {"ok": False, "error": f"crashed (signal {-proc.returncode})"}
    tail = proc.stderr.strip().splitlines()
    reason = tail[-1] if tail else f"exited with status {proc.returncode}"
    return {"ok": False, "error": reason}


def check_llamacpp(
    model_path: str | Path | None = None, timeout: float = LOAD_TIMEOUT_S
) -> dict[str, Any]:
    """Load a model with the real llama.cpp engine in a subprocess: ok and load_s, or error.

    `model_path` defaults to the bundled default model.
    """
    if model_path is None:
        from app.models.default import default_model_path

        try:
            model_path = default_model_path()
        except Exception as exc:
            return {"ok": False, "error": f"no default model: {exc}"}
    result = _run_probe(_LLAMACPP_LOAD, [str(model_path)], timeout)
    return {"model_path": str(model_path), **result}


def _default_model_path() -> Path:
    from app.models.default import default_model_path

    return default_model_path()


def check_mlx(
    model_path: str | Path | None = None, timeout: float = LOAD_TIMEOUT_S
) -> dict[str, Any]:
    """Whether MLX imports here, which device it would compute on, and whether the MLX
    engine loads a model (default: the bundled one) in a subprocess."""
    if not _mlx_installed():
        return {"ok": False, "installed": False, "error": "not installed"}
    try:
        model_path = model_path or _default_model_path()
    except Exception as exc:
        return {"ok": False, "installed": True, "error": f"no default model: {exc}"}
    result = _run_probe(_MLX_PROBE, [str(model_path)], timeout)
    return {"installed": True, "model_path": str(model_path), **result}


def _mlx_installed() -> bool:
    try:
        return importlib.util.find_spec("mlx.core") is not None
    except (ImportError, ValueError):
        return False


def known_loads(running: Running) -> dict[str, dict[str, Any]]:
    """The engines' load checks as the window knows them, in no subprocess: the one it runs
    has loaded its model; the other is not checked (a load each, seconds, was most of the
    wait; `stoke doctor` in a terminal loads the model with each)."""
    skipped = (
        f"not checked: the window runs its model on {running.engine} "
        "(`stoke doctor` in a terminal loads it with each engine)"
    )
    loads: dict[str, dict[str, Any]] = {
        "llama.cpp": {"ok": False, "not_checked": skipped},
        "mlx": {"ok": False, "installed": _mlx_installed(), "not_checked": skipped},
    }
    loads[running.engine] = {
        "ok": True,
        "installed": True,
        "model_path": running.model_path,
        "running": True,
    }
    return loads


def engine_choice() -> dict[str, Any]:
    """Which engine the app runs its model with here, and why: from the options the app
    itself resolves (app/launch.py), so the report cannot disagree with what loads."""
    from app.engine.choice import choose_engine
    from app.engine.safe_mode import SafeModeRecords
    from app.launch import resolve_load_options
    from app.models import load_settings
    from app.settings import Settings

    options = resolve_load_options(None, Settings.load())
    if options.remote is not None:
        return {"engine": "remote", "reason": "Settings send the chat to a server"}
    model = options.model_path
    saved = (load_settings.load(model) or {}).get("engine")
    where = "this model's load settings" if saved == options.engine else "Settings"
    choice = choose_engine(options)
    reason = f"chosen in {where}" if choice.reason == "chosen by the user" else choice.reason
    safe = SafeModeRecords().lookup(choice.engine, options, expire=False)
    return {"model_path": model, "engine": choice.engine, "reason": reason, "safe_mode": safe}


def safe_mode() -> dict[str, Any]:
    """The models that load conservatively here after a crash, each record with its words
    (one applies while its model's load settings stay those that crashed)."""
    from app.engine.safe_mode import SafeModeRecords, words

    return {"records": [{**r, "words": words(r)} for r in SafeModeRecords().entries()]}


def reset_safe_mode() -> list[str]:
    """`stoke doctor --reset-safe-mode`: forget every safe-mode record, so each model loads
    with its own settings again; the words of each record removed."""
    from app.engine.safe_mode import SafeModeRecords, words

    return [words(r) for r in SafeModeRecords().clear()]


def llamacpp_info(timeout: float = INFO_TIMEOUT_S) -> dict[str, Any]:
    """llama.cpp's build features and devices, asked in a subprocess.

    A wheel built for another CPU dies of an illegal instruction on import, and asking a CUDA
    device for its memory creates a context: neither should happen to the caller. The CPU
    buffer-type verdict may run its probe (once per machine), hence the long default wait.
    """
    return _run_probe(_LLAMACPP_PROBE, [], timeout)


def _default_model() -> dict[str, Any]:
    from app.models.default import default_model_path

    path = default_model_path()
    exists = path.is_file()
    return {
        "path": str(path),
        "exists": exists,
        "size_bytes": path.stat().st_size if exists else None,
    }


def _bundle() -> dict[str, Any]:
    """Whether Stoke runs from an installed bundle (packaging/: the .deb, the tarball,
    Stoke.app) and where, or else where its Python code is: a bug report says which."""
    folder = paths.bundle_dir()
    return {"frozen": folder is not None, "path": str(folder or _ROOT)}


def _paths() -> dict[str, str]:
    """Where Stoke keeps things, created by nothing here (a report must not need to write);
    `read_only` appears, in words, when one of them cannot be written."""
    report = {
        "data_dir": str(paths.data_dir(create=False)),
        "cache_dir": str(paths.cache_dir(create=False)),
        "config_dir": str(paths.config_dir(create=False)),
        "database_path": str(paths.data_dir(create=False) / paths.DATABASE_NAME),
        "models_dir": str(paths.models_dir(create=False)),
    }
    read_only = paths.read_only_folders()
    if read_only:
        report["read_only"] = f"{paths.read_only_text(read_only)}: nothing can be saved"
    return report


def _keyring() -> dict[str, Any]:
    import keyring
    from keyring.backends import fail

    backend = keyring.get_keyring()
    cls = type(backend)
    usable = not isinstance(backend, fail.Keyring)
    return {
        "backend": f"{cls.__module__}.{cls.__qualname__}",
        "usable": usable,
        "note": None if usable else NO_KEYRING,
    }


def check_remote() -> dict[str, Any]:
    """Whether the configured remote server answers, with the models it serves."""
    from app.engine.remote import probe
    from app.remote_config import remote_options
    from app.settings import Settings

    settings = Settings.load()
    if not settings.remote_url:
        return {"configured": False}
    start = time.perf_counter()
    try:
        models = probe(remote_options(settings))
    except Exception as exc:  # the report says what failed, it never raises
        return {"configured": True, "url": settings.remote_url, "ok": False, "error": str(exc)}
    return {
        "configured": True,
        "url": settings.remote_url,
        "ok": True,
        "models": models,
        "answer_ms": round((time.perf_counter() - start) * 1000, 1),
    }


def check_rpc(extra: Sequence[str] = ()) -> dict[str, Any]:
    """Each rpc-server Settings > Hardware, the model's saved plan or `--rpc` names: its
    devices' memory and the round trip of a question, or why it does not answer."""
    from app.engine.rpc_devices import device_name
    from app.hardware.rpc import parse_specs, probe
    from app.launch import load_options_of
    from app.settings import Settings

    named = [Settings.load().rpc_servers, *extra]
    with contextlib.suppress(Exception):  # a model without a plan names none
        named += load_options_of(argparse.Namespace()).rpc_servers
    endpoints = list(dict.fromkeys(spec.endpoint for spec in parse_specs(named)))
    servers = []
    for endpoint in endpoints:
        answer = probe(endpoint)
        servers.append(
            {
                "endpoint": endpoint,
                "ok": answer.problem is None,
                "problem": answer.problem,
                "rtt_ms": None if answer.rtt_s is None else round(answer.rtt_s * 1000, 3),
                "devices": [
                    {
                        "name": device_name(endpoint, d.index),
                        "memory_free": d.memory_free,
                        "memory_total": d.memory_total,
                    }
                    for d in answer.devices
                ],
            }
        )
    return {"servers": servers}


def collect(rpc: Sequence[str] = (), running: Running | None = None) -> dict[str, Any]:
    """Everything the report shows, as plain JSON-serialisable data (`stoke doctor --json`);
    `rpc` adds rpc-servers to check. The subprocess probes are most of the wait (a load each,
    seconds): they run side by side, so the report takes about its slowest probe, not their
    sum. With `running` (Help > About's Copy diagnostics) the loads are what the window knows
    (`known_loads`) and llama.cpp's devices are waited for `WINDOW_TIMEOUT_S` at most."""
    machine = platform.machine()
    workers = max(1, min(4, (os.cpu_count() or 1) // 2))  # a core each, half the machine's
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="doctor") as pool:
        llama_info = pool.submit(
            llamacpp_info, INFO_TIMEOUT_S if running is None else WINDOW_TIMEOUT_S
        )
        if running is None:
            llama_load, mlx_load = pool.submit(check_llamacpp), pool.submit(check_mlx)
        else:
            known = known_loads(running)
            llama_load, mlx_load = _done(known["llama.cpp"]), _done(known["mlx"])
        rpc_check = pool.submit(_guarded, lambda: check_rpc(rpc))
        default_model = _guarded(_default_model)  # the quick parts, meanwhile
        choice = _guarded(engine_choice)
        remote = _guarded(check_remote)
        keyring = _guarded(_keyring)
        return {
            "stoke": _version(("stoke",)),
            "python": {
                "version": platform.python_version(),
                "implementation": platform.python_implementation(),
                "executable": sys.executable,
            },
            "platform": {
                "system": platform.platform(),
                "machine": machine,
                "apple_silicon": sys.platform == "darwin" and machine == "arm64",
            },
            "bundle": _bundle(),
            "packages": {label: _version(dists) for label, dists in PACKAGES.items()},
            "paths": _guarded(_paths),
            "llama_cpp": llama_info.result(),
            "default_model": default_model,
            "engine_choice": choice,
            "engines": {
                "llama.cpp": llama_load.result(),
                "mlx": mlx_load.result(),
                "remote": remote,
            },
            "rpc": rpc_check.result(),
            "keyring": keyring,
            "safe_mode": _guarded(safe_mode),
        }


def _done(result: dict[str, Any]) -> Future:
    """An answer already known, as the probes' futures are read."""
    future: Future = Future()
    future.set_result(result)
    return future


# -- rendering ------------------------------------------------------------------------------


def _section(title: str, rows: list[tuple[str, str]]) -> list[str]:
    width = max((len(key) for key, _ in rows), default=0)
    return [title, *(f"  {key.ljust(width)}  {value}" for key, value in rows), ""]


def _error_rows(part: dict[str, Any]) -> list[tuple[str, str]]:
    return [("error", part["error"])] if "error" in part else []


def _llama_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    if "error" in info:
        return _error_rows(info)
    rows = [
        ("system info", info["system_info"]),
        ("GPU offload", "yes" if info["gpu_offload"] else "no (CPU-only build)"),
    ]
    for i, d in enumerate(info["devices"]):
        memory = f"{gib(d['memory_free'], 1, unit=False)} / {gib(d['memory_total'], 1)} free"
        device = f"{d['name']} ({d['kind']}, {d['description']}): {memory}"
        rows.append(("devices" if i == 0 else "", device))
    if not info["devices"]:
        rows.append(("devices", "none found"))
    verdict = info.get("buffer_types")
    if verdict:
        source = "probed now" if verdict["source"] == "probe" else verdict["source"]
        rows.append(("CPU buffer types", f"{verdict['policy']}: {verdict['reason']} ({source})"))
    return rows


def _model_rows(model: dict[str, Any]) -> list[tuple[str, str]]:
    if "error" in model:
        return _error_rows(model)
    size = f"yes, {decimal_bytes(model['size_bytes'])}" if model["exists"] else "NO"
    return [("path", model["path"]), ("exists", size)]


def _running_line(check: dict[str, Any]) -> str:
    return f"ok, the window has {Path(check['model_path']).name} loaded on it"


def _llamacpp_line(check: dict[str, Any]) -> str:
    if check.get("running"):
        return _running_line(check)
    if "not_checked" in check:
        return check["not_checked"]
    if not check.get("ok"):
        return f"cannot load: {check.get('error', 'unknown error')}"
    return f"ok, loaded the model in {check['load_s']:.2f} s"


def _mlx_line(check: dict[str, Any], apple_silicon: bool) -> str:
    if not check.get("installed"):
        return "not installed"
    if check.get("running"):
        return _running_line(check)
    if "not_checked" in check:
        return check["not_checked"]
    if not check.get("ok") and "device" not in check:
        return f"cannot import: {check.get('error', 'unknown error')}"
    line = f"default device {check['device']}"
    if apple_silicon:
        line += ", Metal " + ("available" if check["metal"] else "NOT available")
    elif check["cuda"]:
        line += ", CUDA available"
    if not check.get("ok"):
        return f"{line}; cannot load: {check.get('error', 'unknown error')}"
    return f"ok, {line}, loaded the model in {check['load_s']:.2f} s"


def _choice_rows(choice: dict[str, Any]) -> list[tuple[str, str]]:
    if "error" in choice:
        return _error_rows(choice)
    rows = [("model", choice["model_path"])] if "model_path" in choice else []
    rows.append(("engine", f"{choice['engine']}: {choice['reason']}"))
    if choice.get("safe_mode"):
        safe = choice["safe_mode"]
        rows.append(("safe mode", f"{safe['changes']}: it crashed here ({safe['recorded_at']})"))
    return rows


def _safe_mode_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    if "error" in info:
        return _error_rows(info)
    if not info["records"]:
        return [("records", "none: every model loads with its own settings")]
    rows = [(record.get("model", "a model"), record["words"]) for record in info["records"]]
    return [
        *rows,
        ("to clear", "stoke doctor --reset-safe-mode (or Clear in the window's settings)"),
    ]


def _remote_line(check: dict[str, Any]) -> str:
    if "error" in check and "url" not in check:
        return f"cannot check: {check['error']}"
    if not check.get("configured"):
        return "not configured (stoke chat --remote-url URL, or Settings > Remote)"
    if not check.get("ok"):
        return f"{check['url']}: {check['error']}"
    models = ", ".join(check["models"]) or "no models"
    return f"{check['url']}: reachable in {check['answer_ms']:.0f} ms, serves {models}"


def _rpc_rows(info: dict[str, Any], supported: bool | None) -> list[tuple[str, str]]:
    if "error" in info:
        return _error_rows(info)
    rows = []
    if supported is not None:
        rows.append(
            (
                "RPC backend",
                "yes"
                if supported
                else "no: this llama-cpp-python was built without GGML_RPC=ON "
                "(python packaging/llama_build.py install rebuilds it)",
            )
        )
    for server in info["servers"]:
        if not server["ok"]:
            rows.append((server["endpoint"], f"unreachable: {server['problem']}"))
            continue
        for d in server["devices"]:
            memory = f"{gib(d['memory_free'], 1, unit=False)} / {gib(d['memory_total'], 1)} free"
            rows.append(
                (server["endpoint"], f"{d['name']}: {memory}, {server['rtt_ms']} ms round trip")
            )
    if not info["servers"]:
        rows.append(("servers", "none (stoke plan --rpc HOST:PORT, or Settings > Hardware)"))
    return rows


def _keyring_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    if "error" in info:
        return _error_rows(info)
    return [("backend", info["backend"]), ("status", info["note"] or "usable")]


def render(report: dict[str, Any]) -> str:
    """The report as aligned plain text for a terminal or a bug report."""
    py, plat, bundle = report["python"], report["platform"], report["bundle"]
    where = "installed bundle" if bundle["frozen"] else "Python code"
    lines = _section(
        f"Stoke {report['stoke']}",
        [
            ("runs from", f"{where} at {bundle['path']}"),
            ("python", f"{py['version']} ({py['implementation']}) {py['executable']}"),
            ("platform", f"{plat['system']} ({plat['machine']})"),
        ],
    )
    lines += _section("Packages", list(report["packages"].items()))
    report_paths = report["paths"]
    lines += _section("Paths", _error_rows(report_paths) or list(report_paths.items()))
    lines += _section("llama.cpp", _llama_rows(report["llama_cpp"]))
    lines += _section("Default model", _model_rows(report["default_model"]))
    lines += _section("Engine choice", _choice_rows(report["engine_choice"]))
    engines = report["engines"]
    lines += _section(
        "Engines",
        [
            ("llama.cpp", _llamacpp_line(engines["llama.cpp"])),
            ("mlx", _mlx_line(engines["mlx"], plat["apple_silicon"])),
            *([("remote", _remote_line(engines["remote"]))] if "remote" in engines else []),
        ],
    )
    if "rpc" in report:
        supported = report["llama_cpp"].get("rpc")
        lines += _section("RPC devices (llama.cpp rpc-server)", _rpc_rows(report["rpc"], supported))
    lines += _section("Keyring", _keyring_rows(report["keyring"]))
    lines += _section("Safe mode", _safe_mode_rows(report["safe_mode"]))
    return "\n".join(lines).rstrip()
