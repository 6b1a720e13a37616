"""A draft model cut from a target: the first few transformer blocks of a GGUF, with its
embeddings, output head and tokenizer, written with gguf-py (`stoke dev make-draft`).

Such a model shares the target's tokenizer byte for byte (so `tokenizer_fingerprint` matches
and the library offers it as a draft) and costs a fraction of a decode. Its guesses are the
target's early layers read out directly: poorer than a trained small model's, which is what
the adaptive control in `engine/speculate.py` has to cope with.
"""

from __future__ import annotations

import re
from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def write_truncated(source: Path, out: Path, n_layers: int) -> Path:
    """Write `source`'s first `n_layers` blocks (and everything outside the blocks) to `out`."""
    reader = GGUFReader(source, "r")
    arch = str(reader.fields["general.architecture"].contents())
    blocks = int(reader.fields[f"{arch}.block_count"].contents())
    if not 0 < n_layers < blocks:
        raise ValueError(f"{source.name} has {blocks} blocks: keep between 1 and {blocks - 1}")
    writer = GGUFWriter(out, arch=arch, endianess=reader.endianess)
    alignment = reader.fields.get("general.alignment")
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == f"{arch}.block_count":
            value = n_layers
        elif field.name == "general.name":
            value = f"{value} ({n_layers}-layer draft)"
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    kept = [
        t for t in reader.tensors if (m := _BLOCK.match(t.name)) is None or int(m[1]) < n_layers
    ]
    for tensor in kept:
        data = tensor.data
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    return out
