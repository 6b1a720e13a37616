"""The CPU probes' model (cpu_buffers.py writes it, probe.py loads it): a tiny llama written
here, so the probe depends on no download, with Q4_1, Q4_0 and Q8_0 weights (the types AMX and
CPU_REPACK take) and shapes their kernels accept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app import paths

N_VOCAB, N_EMBD, N_FF, N_HEAD, N_LAYER = 512, 256, 512, 4, 2


def write_probe_model(path: Path) -> None:
    """A deterministic random llama of about 1 MB (no tokenizer: it takes token ids)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFWriter
    from gguf.quants import quantize

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
