"""The CPU probes' child (cpu_buffers.py), one JSON line on stdout.

`python -m app.engine.llamacpp.probe POLICY MODEL` loads the probe model with one CPU buffer
policy, decodes a fixed token sequence (a 32-token batch, then 16 single tokens: the two
matmul paths a chat takes) and prints the top token at every position. It may crash: that is
what it is for. The model is tiny and written by probe_model.py, so the probe depends on no
download.

`python -m app.engine.llamacpp.probe attention POLICY MODEL` times one-token decodes
ATTENTION_DEPTH cells deep in two contexts of the exact attention (flash attention over a q8_0
K), one with an f16 V and one with a q8_0 V, taking turns, and prints each one's median
seconds: which V this CPU's kernels read faster.

`STOKE_TEST_PROBE_CRASH` (tests only) names policies under which the child kills itself by
SIGSEGV before its first decode, as llama.cpp's AMX matmul does on the machines it fails on
("attention": the timing child).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import statistics
import sys
import time
from typing import Any

import numpy as np

from app.engine.llamacpp.probe_model import N_VOCAB

BATCH, SINGLES = 32, 16
ATTENTION_DEPTH, ATTENTION_REPS, PREFILL = 3072, 24, 512
CRASH_ENV = "STOKE_TEST_PROBE_CRASH"


def tokens() -> list[int]:
    """The fixed sequence every policy decodes."""
    return [(7 + 37 * i) % N_VOCAB for i in range(BATCH + SINGLES)]


def _top_tokens(policy: str, model_path: str) -> list[int]:
    import llama_cpp

    model = _load(policy, model_path)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 128
    cparams.n_threads = cparams.n_threads_batch = min(4, os.cpu_count() or 1)
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit(3)
    if policy in os.environ.get(CRASH_ENV, "").split(","):
        os.kill(os.getpid(), signal.SIGSEGV)
    sequence = tokens()
    top: list[int] = []
    batch = llama_cpp.llama_batch_init(BATCH, 0, 1)
    try:
        for start, size in [(0, BATCH)] + [(BATCH + i, 1) for i in range(SINGLES)]:
            _fill(batch, start, size, sequence)
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise SystemExit(4)
            for j in range(size):
                row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, j), (N_VOCAB,))
                if not np.isfinite(row).all():
                    raise SystemExit(5)
                top.append(int(row.argmax()))
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return top


def _load(policy: str, model_path: str) -> Any:
    import llama_cpp

    from app.engine.llamacpp import cpu_buffers

    quiet = llama_cpp.llama_log_callback(lambda *_: None)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    _KEEP.append(quiet)
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        model_path.encode(), cpu_buffers.model_params(policy)
    )
    if not model:
        raise SystemExit(2)
    return model


_KEEP: list[object] = []  # the log callback lives as long as llama.cpp may call it


def _fill(batch: Any, start: int, size: int, sequence: list[int] | None = None) -> None:
    """The batch of positions start..start+size, each with its logits; the sequence's tokens,
    else a fixed pattern."""
    batch.n_tokens = size
    for j in range(size):
        position = start + j
        batch.token[j] = sequence[position] if sequence else (7 + 37 * position) % N_VOCAB
        batch.pos[j] = position
        batch.n_seq_id[j] = 1
        batch.seq_id[j][0] = 0
        batch.logits[j] = sequence is not None or j == size - 1


def _attention_seconds(policy: str, model_path: str) -> dict[str, float]:
    """Median seconds of a one-token decode ATTENTION_DEPTH cells deep, per V type."""
    import llama_cpp

    model = _load(policy, model_path)
    types = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}
    contexts = {}
    for name, v_type in types.items():
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = ATTENTION_DEPTH + ATTENTION_REPS + PREFILL
        cparams.n_batch = cparams.n_ubatch = PREFILL
        cparams.n_threads = cparams.n_threads_batch = os.cpu_count() or 1
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        cparams.type_k, cparams.type_v = llama_cpp.GGML_TYPE_Q8_0, v_type
        cparams.no_perf = True
        contexts[name] = llama_cpp.llama_init_from_model(model, cparams)
        if not contexts[name]:
            raise SystemExit(3)
    if "attention" in os.environ.get(CRASH_ENV, "").split(","):
        os.kill(os.getpid(), signal.SIGSEGV)
    batch = llama_cpp.llama_batch_init(PREFILL, 0, 1)
    seconds: dict[str, list[float]] = {name: [] for name in contexts}
    try:
        for ctx in contexts.values():
            for start in range(0, ATTENTION_DEPTH, PREFILL):
                _fill(batch, start, PREFILL)
                if llama_cpp.llama_decode(ctx, batch) != 0:
                    raise SystemExit(4)
        for i in range(ATTENTION_REPS):  # taking turns: a busy moment costs both alike
            for name, ctx in contexts.items():
                _fill(batch, ATTENTION_DEPTH + i, 1)
                began = time.perf_counter()
                if llama_cpp.llama_decode(ctx, batch) != 0:
                    raise SystemExit(4)
                seconds[name].append(time.perf_counter() - began)
    finally:
        llama_cpp.llama_batch_free(batch)
        for ctx in contexts.values():
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return {name: statistics.median(times) for name, times in seconds.items()}


def main(argv: list[str]) -> int:
    if argv[0] == "attention":
        policy, model_path = argv[1:]
        print(json.dumps({"policy": policy, "seconds": _attention_seconds(policy, model_path)}))
        return 0
    policy, model_path = argv
    print(json.dumps({"policy": policy, "top": _top_tokens(policy, model_path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
