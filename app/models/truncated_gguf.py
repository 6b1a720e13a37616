"""A draft model cut from a target: the first few transformer blocks of a GGUF, with its
embeddings, output head and tokenizer (`stoke dev make-draft`).

Such a model shares the target's tokenizer byte for byte (so `tokenizer_fingerprint` matches
and the library offers it as a draft) and costs a fraction of a decode. Its guesses are the
target's early layers read out directly: poorer than a trained small model's, which is what
the adaptive control in `engine/speculate.py` has to cope with.

The metadata entries are copied as the source stores them, walked with engine/gguf_header.py
(milliseconds), but for the block count and the name; the kept tensors' bytes are copied
as they are. gguf-py's reader and writer took about 14 s a cut on a busy 2-core machine,
making a numpy view of, then writing back, each of SmolLM2's 49,152 tokens and merges.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from app.engine.gguf_header import STRING, Entry, GGUFHeader, open_header

_BLOCK = re.compile(r"^blk\.(\d+)\.")
_UINT = {0: "B", 2: "H", 4: "I", 10: "Q"}  # the unsigned kinds a block count is stored as


def _string(text: str) -> bytes:
    encoded = text.encode()
    return struct.pack("<Q", len(encoded)) + encoded


def _entry(header: GGUFHeader, entry: Entry, arch: str, n_layers: int) -> bytes:
    """`entry` as the cut stores it: its own bytes, but for the block count and the name."""
    if entry.key == f"{arch}.block_count" and entry.kind in _UINT:
        value = struct.pack("<" + _UINT[entry.kind], n_layers)
    elif entry.key == "general.name" and entry.kind == STRING:
        value = _string(f"{header.value(entry)} ({n_layers}-layer draft)")
    else:
        return bytes(header.view[entry.start : entry.end])
    return _string(entry.key) + struct.pack("<I", entry.kind) + value


def _nbytes(dims: tuple[int, ...], ggml_type: int) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    count = 1
    for dim in dims:
        count *= dim
    return count // block * size


def write_truncated(source: Path, out: Path, n_layers: int) -> Path:
    """Write `source`'s first `n_layers` blocks (and everything outside the blocks) to `out`."""
    with open_header(source) as header:
        meta = {e.key: e for e in header.entries()}
        arch = str(header.value(meta["general.architecture"]))
        blocks = int(header.value(meta[f"{arch}.block_count"]))
        if not 0 < n_layers < blocks:
            raise ValueError(f"{source.name} has {blocks} blocks: keep between 1 and {blocks - 1}")
        alignment = (
            int(header.value(meta["general.alignment"])) if "general.alignment" in meta else 32
        )
        kept = [
            t
            for t in header.tensors()
            if (m := _BLOCK.match(t.name)) is None or int(m[1]) < n_layers
        ]
        infos, offset, placed = [], 0, []
        for tensor in kept:
            size = _nbytes(tensor.dims, tensor.ggml_type)
            dims = tensor.dims
            infos.append(
                _string(tensor.name)
                + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, tensor.ggml_type, offset)
            )
            placed.append((header.data_offset + tensor.offset, size))
            offset += size + -size % alignment
        entries = [_entry(header, e, arch, n_layers) for e in meta.values()]
        head = struct.pack("<4sIQQ", b"GGUF", header.version, len(kept), len(entries))
        body = b"".join([head, *entries, *infos])
        tmp = out.with_suffix(".writing")
        with tmp.open("wb") as fh:
            fh.write(body + bytes(-len(body) % alignment))
            for start, size in placed:
                fh.write(header.view[start : start + size])
                fh.write(bytes(-size % alignment))
    tmp.replace(out)
    return out
