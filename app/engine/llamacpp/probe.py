"""The buffer-type probe's child: `python -m app.engine.llamacpp.probe POLICY MODEL`.

Loads the probe model with one CPU buffer policy (cpu_buffers.py), decodes a fixed token
sequence (a 32-token batch, then 16 single tokens: the two matmul paths a chat takes) and
prints the top token at every position as one JSON line. It may crash: that is what it is for.
The model is tiny and written here, so the probe depends on no download: a llama with Q4_1,
Q4_0 and Q8_0 weights (the types AMX and CPU_REPACK take) and shapes their kernels accept.

`STOKE_TEST_PROBE_CRASH` (tests only) names policies under which the child kills itself by
SIGSEGV before its first decode, as llama.cpp's AMX matmul does on the machines it fails on.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

N_VOCAB, N_EMBD, N_FF, N_HEAD, N_LAYER = 512, 256, 512, 4, 2
BATCH, SINGLES = 32, 16
CRASH_ENV = "STOKE_TEST_PROBE_CRASH"


def tokens() -> list[int]:
    """The fixed sequence every policy decodes."""
    return [(7 + 37 * i) % N_VOCAB for i in range(BATCH + SINGLES)]


def write_probe_model(path: Path) -> None:
    """A deterministic random llama of about 1 MB (no tokenizer: it takes token ids)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFWriter
    from gguf.quants import quantize

    from app import paths

    rng = np.random.default_rng(20261201)
    tmp = path.with_suffix(".writing")
    writer = GGUFWriter(str(tmp), "llama")
    writer.add_name("stoke-buffer-probe")
    writer.add_block_count(N_LAYER)
    writer.add_context_length(256)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(N_VOCAB)
    writer.add_tokenizer_model("none")

    def tensor(name: str, shape: tuple[int, int] | tuple[int], qtype: Q = Q.F32) -> None:
        data = rng.standard_normal(shape).astype(np.float32) / np.sqrt(shape[-1])
        if len(shape) == 1:
            data = np.ones(shape, np.float32)
        if qtype != Q.F32:
            writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, data)

    tensor("token_embd.weight", (N_VOCAB, N_EMBD), Q.Q8_0)
    for i in range(N_LAYER):
        tensor(f"blk.{i}.attn_norm.weight", (N_EMBD,))
        for part in ("q", "k", "v", "output"):
            tensor(f"blk.{i}.attn_{part}.weight", (N_EMBD, N_EMBD), Q.Q4_1)
        tensor(f"blk.{i}.ffn_norm.weight", (N_EMBD,))
        tensor(f"blk.{i}.ffn_gate.weight", (N_FF, N_EMBD), Q.Q4_0)
        tensor(f"blk.{i}.ffn_up.weight", (N_FF, N_EMBD), Q.Q4_0)
        tensor(f"blk.{i}.ffn_down.weight", (N_EMBD, N_FF), Q.Q4_0)
    tensor("output_norm.weight", (N_EMBD,))
    tensor("output.weight", (N_VOCAB, N_EMBD), Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    paths.write_private(path, tmp.read_bytes())
    tmp.unlink()


def _top_tokens(policy: str, model_path: str) -> list[int]:
    import llama_cpp

    from app.engine.llamacpp import cpu_buffers

    quiet = llama_cpp.llama_log_callback(lambda *_: None)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        model_path.encode(), cpu_buffers.model_params(policy)
    )
    if not model:
        raise SystemExit(2)
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
            batch.n_tokens = size
            for j in range(size):
                batch.token[j] = sequence[start + j]
                batch.pos[j] = start + j
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = True
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


def main(argv: list[str]) -> int:
    policy, model_path = argv
    print(json.dumps({"policy": policy, "top": _top_tokens(policy, model_path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
