"""How llama.cpp runs on this CPU, decided once and cached: which of its extra CPU buffer
types the weights may use, and which V type the exact attention keeps.

At load, llama.cpp repacks CPU weights into "extra" buffer types for faster matmuls: CPU_REPACK
(Q4_0, IQ4_NL, Q4_K on AVX2, AVX-512 and NEON) and, on Intel CPUs with AMX, the AMX type. On
some AMX machines (virtual machines among them; llama.cpp #20824) the first decode with AMX
buffers dies by SIGSEGV. So a probe (`probe.py`, in short child processes that may crash
without harm) loads a tiny model under each policy and compares its logits with plain buffers;
the first policy that runs and agrees is the verdict, cached by CPU and llama.cpp build:

- "all": every extra buffer type llama.cpp offers here
- "no-amx": all but AMX (CPU_REPACK kept: only what crashes is turned off)
- "none": plain CPU buffers (`use_extra_bufts = False`)

The exact attention (`backend.exact_attention`: flash attention over a q8_0 K, whose verify
batches equal one-token decodes) may keep an f16 V or a q8_0 one; both are exact, and which is
faster is the CPU's: on an AMD EPYC a q8_0 V made decodes 10-18% slower than the default
context at 500-3,500 tokens and an f16 V 2-9% faster, on an Intel Xeon with AMX an f16 V made
them 20% slower at 1,100 tokens and a q8_0 V 6% faster. So the verdict also holds `exact_v`,
from a second child that times one-token decodes deep in a context under each (taking turns):
q8_0 when it is faster by V_MARGIN, else f16.

Everything that loads weights with llama.cpp asks `model_params` (the engine, tests and
benchmarks), `llama` (llama-cpp-python's high-level class) or `server_flags` (a llama-server
process), so no caller ever runs llama.cpp's raw defaults. Dropping AMX alone edits llama.cpp's
own table of extra buffer types in this process (it has no switch for one type; it reads the
table again at every load).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import llama_cpp

from app import paths
from app.engine.llamacpp import ggml
from app.engine.llamacpp.verdict_file import CACHE_FILE
from app.engine.safe_mode import cpu_identity
from app.stored import Entries, Fields, Stored, Value, array_of, one_of, text

POLICIES = ("all", "no-amx", "none")  # most to least capable
PROBE_TIMEOUT_S = 180.0  # a probe child loads a 1 MB model; generous for a busy machine
AGREEMENT = 0.9  # share of positions whose top token must equal plain buffers' top token
V_TYPES = ("f16", "q8_0")  # the exact attention's V: the first unless the second is faster
V_MARGIN = 1.1  # how much faster a q8_0 V must decode to be chosen
_FORMAT = 2  # of the cache entries (2: with exact_v)


@dataclass(frozen=True)
class Verdict:
    """The policy for this machine and why; `source` says whether the probe ran just now."""

    policy: str
    reason: str
    extra_types: tuple[str, ...]  # what this llama.cpp build offers on this CPU
    trials: dict[str, str] = field(default_factory=dict)  # policy -> what the probe saw
    source: str = "probe"  # "probe" (ran now) | "cache" | "no extra types"
    key: str = ""
    exact_v: str = V_TYPES[0]  # the exact attention's V type on this CPU
    exact_v_reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["extra_types"] = list(self.extra_types)
        return data


# -- llama.cpp's table of extra buffer types ------------------------------------------------


class _ExtraTypes:
    """The CPU device's NULL-terminated table, with the entries it held at first sight."""

    def __init__(self, table: ctypes._Pointer) -> None:
        self._table = table
        self.original: list[int] = []
        while table[len(self.original)]:
            self.original.append(table[len(self.original)])
        self.names = tuple(ggml.buffer_type_name(buft) for buft in self.original)

    def allow(self, excluded: frozenset[str]) -> None:
        """Keep the original entries but `excluded`; shorter than before, so it fits."""
        kept = [b for b, n in zip(self.original, self.names, strict=True) if n not in excluded]
        for i, buft in enumerate([*kept, None]):
            self._table[i] = buft
        for i in range(len(kept) + 1, len(self.original) + 1):
            self._table[i] = None


_extra: _ExtraTypes | bool | None = False  # False: not looked up yet


def _extra_types() -> _ExtraTypes | None:
    global _extra
    if _extra is False:
        table = ggml.cpu_extra_buffer_types()
        _extra = _ExtraTypes(table) if table else None
    return _extra


def extra_type_names() -> tuple[str, ...]:
    """The extra CPU buffer types this build offers on this CPU ("AMX", "CPU_REPACK", ...)."""
    extra = _extra_types()
    return extra.names if extra else ()


def apply(policy: str, params: llama_cpp.llama_model_params) -> None:
    """Make `params` (and this process's table) load weights under `policy`."""
    if policy not in POLICIES:
        raise ValueError(f"unknown CPU buffer policy {policy!r}: use one of {POLICIES}")
    if policy == "none":
        params.use_extra_bufts = False
        return
    extra = _extra_types()
    if extra is not None:
        extra.allow(frozenset({"AMX"}) if policy == "no-amx" else frozenset())


def server_flags(policy: str = "auto") -> list[str]:
    """llama-server's flags for `policy`: it has one switch, `--no-repack` (no extra buffer
    types at all), so anything short of "all" turns off CPU_REPACK with AMX there."""
    return [] if resolve(policy) == "all" else ["--no-repack"]


def resolve(policy: str = "auto") -> str:
    """A concrete policy: "auto" is this machine's verdict."""
    return machine_verdict().policy if policy == "auto" else policy


def model_params(policy: str = "auto") -> llama_cpp.llama_model_params:
    """llama.cpp's default model params with this machine's safe buffer types."""
    params = llama_cpp.llama_model_default_params()
    apply(resolve(policy), params)
    return params


@contextlib.contextmanager
def safe_defaults(policy: str = "auto") -> Iterator[None]:
    """llama-cpp-python's `Llama` reads its defaults from this one function; while this
    lasts it returns the safe ones."""
    module = llama_cpp.llama_cpp
    original = module.llama_model_default_params
    concrete = resolve(policy)

    def safe() -> llama_cpp.llama_model_params:
        params = original()
        apply(concrete, params)
        return params

    module.llama_model_default_params = safe
    try:
        yield
    finally:
        module.llama_model_default_params = original


def llama(model_path: str, *, policy: str = "auto", **kwargs: Any) -> llama_cpp.Llama:
    """`llama_cpp.Llama(model_path, **kwargs)` with this machine's safe buffer types."""
    with safe_defaults(policy):
        return llama_cpp.Llama(model_path, **kwargs)


# -- the verdict ------------------------------------------------------------------------------


def machine_key() -> dict[str, str]:
    """What the verdict depends on: the CPU and the exact llama.cpp build."""
    key = dict(cpu_identity())
    key["llama_cpp"] = llama_cpp.__version__
    key["system_info"] = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    with contextlib.suppress(OSError):
        lib = next(ggml.LIB_DIR.glob("libggml-cpu*"), None) or next(ggml.LIB_DIR.glob("libllama*"))
        stat = lib.stat()
        key["library"] = f"{lib.name}:{stat.st_size}:{stat.st_mtime_ns}"
    return key


def _key_hash(key: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


_verdict: Verdict | None = None


def machine_verdict(*, cache: Path | None = None) -> Verdict:
    """This machine's verdict: from the cache, else by running the probe (a few seconds, once
    per CPU and llama.cpp build). Never raises: an unreadable cache, or a damaged verdict in
    it, just means probing (app/stored.py checks every verdict read back)."""
    global _verdict
    if _verdict is not None and cache is None:
        return _verdict
    path = cache or paths.cache_dir() / CACHE_FILE
    key = _key_hash(machine_key())
    cached = _read_cache(path).get(key)
    if cached is not None:
        verdict = Verdict(**{**cached, "extra_types": tuple(cached["extra_types"])})
        verdict = Verdict(**{**asdict(verdict), "source": "cache", "key": key})
    else:
        verdict = Verdict(**{**asdict(_decide()), "key": key})
        if verdict.source != "probe failed":
            _write_cache(path, key, verdict)
    if cache is None:
        _verdict = verdict
    return verdict


def _read_cache(path: Path) -> dict[str, dict]:
    return VERDICTS_FILE.read(path).value["verdicts"]


_TEXT = Value(text, "words")
# The verdicts (cpu-buffers.json, a cache): one that is damaged is dropped, and probed again.
VERDICTS_FILE = Stored(
    Fields(
        {
            "format": Value(one_of(_FORMAT), f"{_FORMAT} (this Stoke's format)"),
            "verdicts": Entries(
                Fields(
                    {
                        "policy": Value(one_of(*POLICIES), "one of " + ", ".join(POLICIES)),
                        "reason": _TEXT,
                        "extra_types": Value(array_of(text), "buffer type names"),
                        "trials": Entries(_TEXT),
                        "source": _TEXT,
                        "key": _TEXT,
                        "exact_v": Value(one_of(*V_TYPES), "one of " + ", ".join(V_TYPES)),
                        "exact_v_reason": _TEXT,
                    },
                    required=("policy", "reason", "extra_types", "exact_v"),
                )
            ),
        },
        required=("format", "verdicts"),
    ),
    keep=False,
    empty=lambda: {"format": _FORMAT, "verdicts": {}},
)


def _write_cache(path: Path, key: str, verdict: Verdict) -> None:
    verdicts = _read_cache(path)
    entry = verdict.as_dict()
    entry["source"] = "probe"
    verdicts[key] = entry
    with contextlib.suppress(OSError):  # unwritable cache: the probe runs again next time
        paths.write_private(path, json.dumps({"format": _FORMAT, "verdicts": verdicts}, indent=2))


def _decide() -> Verdict:
    verdict = _buffers()
    exact_v, why = _exact_v(verdict.policy)
    return replace(verdict, exact_v=exact_v, exact_v_reason=why)


def _buffers() -> Verdict:
    names = extra_type_names()
    if not names:
        return Verdict("all", "llama.cpp offers no extra CPU buffer types here", (), {}, "none")
    model = _probe_model()
    reference, seen = _run_probe("none", model)
    trials = {"none": seen}
    if reference is None:
        return Verdict(
            "none",
            f"the buffer-type probe could not run ({seen}); plain CPU buffers until it does",
            names,
            trials,
            "probe failed",
        )
    candidates = ["all", "no-amx"] if "AMX" in names else ["all"]
    for policy in candidates:
        result, seen = _run_probe(policy, model)
        if result is not None:
            agree = _agreement(result, reference)
            seen = f"agreed with plain buffers on {agree:.0%} of positions"
            if agree < AGREEMENT:
                seen = f"disagreed with plain buffers (only {agree:.0%} of positions agree)"
                result = None
        trials[policy] = seen
        if result is not None:
            return Verdict(policy, _reason(policy, names, trials), names, trials)
    return Verdict("none", _reason("none", names, trials), names, trials)


def _reason(policy: str, names: tuple[str, ...], trials: dict[str, str]) -> str:
    if policy == "all":
        return f"every extra CPU buffer type is used ({', '.join(names)}: {trials['all']})"
    if policy == "no-amx":
        kept = ", ".join(n for n in names if n != "AMX") or "no other type"
        return f"the AMX buffer type failed here ({trials['all']}); {kept} kept"
    failed = "; ".join(f"{p}: {seen}" for p, seen in trials.items() if p != "none")
    return f"extra CPU buffer types failed here ({failed}); plain CPU buffers"


def _exact_v(policy: str) -> tuple[str, str]:
    """The exact attention's V type here, and what the timing probe saw."""
    seconds, seen = _run_child(["attention", policy, str(_probe_model())], "seconds")
    if not isinstance(seconds, dict) or not all(
        isinstance(seconds.get(v), (int, float)) and seconds[v] > 0 for v in V_TYPES
    ):
        return V_TYPES[0], f"the attention probe {seen if seconds is None else 'gave no result'}"
    return faster_v(seconds), ", ".join(f"{v} V {seconds[v] * 1e3:.2f} ms" for v in V_TYPES)


def faster_v(seconds: dict[str, float]) -> str:
    """The V type to keep given each one's decode seconds: f16 unless q8_0 wins by V_MARGIN."""
    fast, slow = V_TYPES[1], V_TYPES[0]
    return fast if seconds[fast] * V_MARGIN < seconds[slow] else slow


def _agreement(a: list[int], b: list[int]) -> float:
    if not a or len(a) != len(b):
        return 0.0
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def _probe_model() -> Path:
    from app.engine.llamacpp.probe_model import write_probe_model

    path = paths.cache_dir() / "probe-model.gguf"
    if not path.exists():
        write_probe_model(path)
    return path


def _run_probe(policy: str, model: Path) -> tuple[list[int] | None, str]:
    """The probe child's top tokens under `policy`, or None and what went wrong."""
    top, seen = _run_child([policy, str(model)], "top")
    if seen == "ran" and not isinstance(top, list):
        return None, "gave no result"
    return (None if top is None else [int(t) for t in top]), seen


def _run_child(args: list[str], field_name: str) -> tuple[Any, str]:
    """A probe child's answer under `field_name`, or None and what went wrong."""
    command = [sys.executable, "-m", "app.engine.llamacpp.probe", *args]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {PROBE_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return None, f"could not start ({exc.strerror or exc})"
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return None, f"crashed (killed by {name})"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None, f"failed (exit code {done.returncode})"
    try:
        return json.loads(lines[-1])[field_name], "ran"
    except (ValueError, KeyError, TypeError):
        return None, "gave no result"
