"""A GGUF's tensors as MLX arrays, read by the file's own tensor table and kept compact.

`mx.load` reads a GGUF but not every one, and not always in words: it returns only the tensors
before the first MXFP4 (or TQ1_0/TQ2_0) tensor without an error, reads one part of a split
model, and expands K-quants to float16 (about four times a 4-bit file in memory). So the MLX
engine checks what `mx.load` returned against the header's table (`gguf_info`) and reads what
is missing here, from the file's bytes, in the form MLX keeps compact:

- F32, F16, BF16, I32 as they are;
- Q8_0, Q4_0, Q4_1 as MLX affine triplets (`weight` packed in uint32, `scales`, `biases`,
  group 32), exactly as `mx.load` gives them;
- MXFP4 as MLX mxfp4 (`weight` uint32, `scales` uint8): the same block format (E2M1 codes,
  one E8M0 exponent per 32 values), only the nibbles reordered (GGUF puts values 0-15 in the
  low nibbles and 16-31 in the high ones, MLX packs neighbours into a byte).

Every other type (K-quants, IQ types, ...) has no compact MLX form (`registry.not_compact`
names them): the engine choice sends such a file to llama.cpp and a forced MLX load refuses in
words.
"""

from __future__ import annotations

from collections.abc import Iterable

import mlx.core as mx
import numpy as np

from app.engine.gguf_info import GGUFInfo, TensorInfo
from app.engine.mlx.registry import GGUF_COMPACT_TYPES
from app.engine.protocol import ModelLoadError

_FLOATS = {"F32": np.float32, "F16": np.float16, "I32": np.int32}
# block bytes of the packed types read here (32 values each)
_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "MXFP4": 17}
assert {*_FLOATS, "BF16", *_BLOCK_BYTES} == GGUF_COMPACT_TYPES


def missing(info: GGUFInfo, loaded: Iterable[str]) -> list[TensorInfo]:
    """The table's tensors that `loaded` (what `mx.load` returned) lacks."""
    got = set(loaded)
    return [t for t in info.tensors if t.name not in got]


def read(info: GGUFInfo, tensors: Iterable[TensorInfo]) -> dict[str, mx.array]:
    """`tensors` of the model `info` describes, read from its file parts, as `mx.load` names
    them (quantized ones as `stem.weight`, `stem.scales`, and `stem.biases` for affine)."""
    out: dict[str, mx.array] = {}
    maps: dict[int, np.memmap] = {}
    for t in tensors:
        if t.ggml_type not in GGUF_COMPACT_TYPES:
            raise ModelLoadError(
                f"{info.path.name}: tensor {t.name} is {t.ggml_type}, which MLX cannot keep "
                "compact. Run this file on the llama.cpp engine."
            )
        if t.part not in maps:
            maps[t.part] = np.memmap(info.files[t.part], dtype=np.uint8, mode="r")
        raw = maps[t.part][t.offset : t.offset + t.n_bytes]
        if raw.size != t.n_bytes:
            raise ModelLoadError(
                f"{info.path.name} is truncated: tensor {t.name} is cut off. Download it again."
            )
        out.update(_convert(t, raw))
    return out


def _stem(name: str) -> str:
    return name.removesuffix(".weight")


def _convert(t: TensorInfo, raw: np.ndarray) -> dict[str, mx.array]:
    shape = tuple(reversed(t.shape))  # numpy order
    if t.ggml_type in _FLOATS:
        return {t.name: mx.array(raw.view(_FLOATS[t.ggml_type]).reshape(shape))}
    if t.ggml_type == "BF16":
        return {t.name: mx.array(raw.view(np.uint16).reshape(shape)).view(mx.bfloat16)}
    blocks = raw.reshape(-1, _BLOCK_BYTES[t.ggml_type])
    rows = (*shape[:-1], shape[-1] // 32)  # one scale per block of 32 along the last axis
    stem = _stem(t.name)
    if t.ggml_type == "MXFP4":
        codes = _split_nibbles(blocks[:, 1:])
        return {
            f"{stem}.weight": _pack(codes, 4, shape),
            f"{stem}.scales": mx.array(np.ascontiguousarray(blocks[:, 0]).reshape(rows)),
        }
    d = blocks[:, :2].copy().view(np.float16)[:, 0]
    if t.ggml_type == "Q8_0":
        codes = (blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        scales, biases, bits = d, -128 * d, 8
    elif t.ggml_type == "Q4_0":
        codes = _split_nibbles(blocks[:, 2:])
        scales, biases, bits = d, -8 * d, 4
    else:  # Q4_1: d, then the minimum m
        codes = _split_nibbles(blocks[:, 4:])
        scales, biases, bits = d, blocks[:, 2:4].copy().view(np.float16)[:, 0], 4
    return {
        f"{stem}.weight": _pack(codes, bits, shape),
        f"{stem}.scales": mx.array(scales.reshape(rows)),
        f"{stem}.biases": mx.array(biases.astype(np.float16).reshape(rows)),
    }


def _split_nibbles(packed: np.ndarray) -> np.ndarray:
    """ggml's 16-byte nibble block -> its 32 codes in order (low nibbles are values 0-15)."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=1)


def _pack(codes: np.ndarray, bits: int, shape: tuple[int, ...]) -> mx.array:
    """Codes (one per byte, in value order) packed as MLX does: little-endian within uint32
    words, the first value in the lowest bits."""
    codes = codes.reshape(-1)
    if bits == 4:
        codes = codes[0::2] | (codes[1::2] << 4)
    words = np.ascontiguousarray(codes).view(np.uint32)
    return mx.array(words.reshape(*shape[:-1], shape[-1] * bits // 32))
