"""A tiny chat model the tests write: SmolLM2's tokenizer and chat template on a random llama of
about 8 MB, which both engines run far faster than SmolLM2 itself.

Mechanism tests (the KV a follow-up reuses, snapshots, speculation's exactness, progress
events, protocol shapes) need a real tokenizer, a chat template and deterministic greedy
replies, not a model that answers well; the model's own behaviour stays SmolLM2's to prove.
The matrices are Q8_0, as SmolLM2's embedding is: llama.cpp's verify batches equal its
one-token decodes only over quantized matmuls (backend.float_matmuls), which speculation's
exactness needs. The output matrix is of unit scale, so the greedy token leads the next by
about a logit, and it is not tied to the embeddings (a tied random model repeats its last
token forever), so replies vary; a random model rarely samples its end token, so they run to
`max_tokens`.

The source's `tokenizer.*` entries are copied as they are stored (app/engine/gguf_header.py
walks them in milliseconds); the rest of the file is written here.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from app.engine.gguf_header import open_header

N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_LAYER = 64, 128, 2, 1, 2  # heads of 32: q8_0 K rows
CONTEXT = 8192
SEED = 20261205
ALIGNMENT = 32
_U32, _F32, _STRING = 4, 6, 8


def _string(text: str) -> bytes:
    encoded = text.encode()
    return struct.pack("<Q", len(encoded)) + encoded


def _entry(key: str, value: str | int | float) -> bytes:
    if isinstance(value, str):
        return _string(key) + struct.pack("<I", _STRING) + _string(value)
    if isinstance(value, int):
        return _string(key) + struct.pack("<II", _U32, value)
    return _string(key) + struct.pack("<If", _F32, value)


def _tensors(n_vocab: int, seed: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    head_dim = N_EMBD // N_HEAD

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    ones = np.ones(N_EMBD, np.float32)
    tensors = [("token_embd.weight", rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32))]
    for i in range(N_LAYER):
        tensors += [
            (f"blk.{i}.attn_norm.weight", ones),
            (f"blk.{i}.attn_q.weight", matrix(N_EMBD, N_EMBD)),
            (f"blk.{i}.attn_k.weight", matrix(N_HEAD_KV * head_dim, N_EMBD)),
            (f"blk.{i}.attn_v.weight", matrix(N_HEAD_KV * head_dim, N_EMBD)),
            (f"blk.{i}.attn_output.weight", matrix(N_EMBD, N_EMBD)),
            (f"blk.{i}.ffn_norm.weight", ones),
            (f"blk.{i}.ffn_gate.weight", matrix(N_FF, N_EMBD)),
            (f"blk.{i}.ffn_up.weight", matrix(N_FF, N_EMBD)),
            (f"blk.{i}.ffn_down.weight", matrix(N_EMBD, N_FF)),
        ]
    output = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32)
    return [*tensors, ("output_norm.weight", ones), ("output.weight", output)]


def write_tiny_chat_model(source: Path, path: Path, seed: int = SEED) -> Path:
    """`path`: a llama GGUF with `source`'s tokenizer (every `tokenizer.*` entry) and random
    F32 weights of this module's shapes. The same bytes on every machine; another `seed`, other
    weights (a second model that answers otherwise)."""
    with open_header(source) as header:
        copied = [
            header.view[e.start : e.end] for e in header.entries() if e.key.startswith("tokenizer.")
        ]
        n_vocab = next(e.count for e in header.entries() if e.key == "tokenizer.ggml.tokens")
    own = {
        "general.architecture": "llama",
        "general.name": "stoke-tiny-chat",
        "llama.block_count": N_LAYER,
        "llama.context_length": CONTEXT,
        "llama.embedding_length": N_EMBD,
        "llama.feed_forward_length": N_FF,
        "llama.attention.head_count": N_HEAD,
        "llama.attention.head_count_kv": N_HEAD_KV,
        "llama.rope.dimension_count": N_EMBD // N_HEAD,
        "llama.rope.freq_base": 100000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.vocab_size": n_vocab,
        "general.alignment": ALIGNMENT,
    }
    tensors = _tensors(n_vocab, seed)
    infos, blobs, offset = [], [], 0
    for name, array in tensors:
        kind = Q.Q8_0 if array.ndim == 2 else Q.F32
        blob = quantize(array, kind).tobytes() if kind == Q.Q8_0 else array.tobytes()
        dims = array.shape[::-1]  # GGUF lists the fastest-moving dimension first
        infos.append(
            _string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind, offset)
        )
        blobs.append(blob + bytes(-len(blob) % ALIGNMENT))
        offset += len(blobs[-1])
    head = struct.pack("<4sIQQ", b"GGUF", 3, len(tensors), len(own) + len(copied))
    body = b"".join([head, *(_entry(k, v) for k, v in own.items()), *copied, *infos])
    tmp = path.with_suffix(".writing")
    with tmp.open("wb") as out:
        out.write(body + bytes(-len(body) % ALIGNMENT))
        for blob in blobs:
            out.write(blob)
    tmp.replace(path)
    return path
