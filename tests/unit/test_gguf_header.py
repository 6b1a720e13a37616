"""The header walk agrees with gguf-py's reader on every value type, tensor info and the data
offset; it stops where it is asked to; a damaged header is a HeaderError, nothing else."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from app.engine.gguf_header import GGUFHeader, HeaderError, open_header


def _write(path: Path, *, alignment: int | None = None) -> Path:
    writer = GGUFWriter(str(path), "llama")
    if alignment:
        writer.add_custom_alignment(alignment)
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -5)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 0.1)
    writer.add_bool("t.bool", True)
    writer.add_uint64("t.u64", 2**40)
    writer.add_int64("t.i64", -(2**40))
    writer.add_float64("t.f64", 1e-300)
    writer.add_string("t.str", "héllo")
    writer.add_array("t.ints", [1, 2, 3])
    writer.add_array("t.floats", [0.5, 1.5])
    writer.add_array("t.strs", ["a", "", "ü"])
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(3000)])
    writer.add_tensor("a.weight", np.ones((3, 5), np.float32))
    writer.add_tensor("b.weight", np.ones((7,), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_the_walk_reads_what_gguf_py_reads(tmp_path: Path, alignment: int | None) -> None:
    path = _write(tmp_path / "m.gguf", alignment=alignment)
    reader = GGUFReader(str(path))
    with open_header(path) as header:
        metadata = header.metadata()
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            expected = field.contents()
            expected = tuple(expected) if isinstance(expected, list) else expected
            assert metadata[key] == pytest.approx(expected), key
            assert type(metadata[key]) is type(expected), key
        assert header.value(next(e for e in header.entries() if e.key == "t.strs"), 2) is None
        tokens = next(e for e in header.entries() if e.key == "tokenizer.ggml.tokens")
        assert tokens.count == 3000
        assert [(t.name, t.dims, t.ggml_type) for t in header.tensors()] == [
            (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type)) for t in reader.tensors
        ]
        assert header.data_offset == reader.data_offset
        offsets = {t.name: header.data_offset + t.offset for t in header.tensors()}
        assert offsets == {t.name: int(t.data_offset) for t in reader.tensors}


def test_entries_are_read_as_asked(tmp_path: Path) -> None:
    """The architecture (first) is found without walking on to the vocabulary."""
    path = _write(tmp_path / "m.gguf")
    with open_header(path) as header:
        first = next(header.entries())
        assert (first.key, header.value(first)) == ("general.architecture", "llama")
        assert len(header._entries) == 1
        assert first.kind == GGUFValueType.STRING


def test_every_cut_of_the_header_is_a_header_error(tmp_path: Path) -> None:
    data = _write(tmp_path / "m.gguf").read_bytes()
    with open_header(tmp_path / "m.gguf") as header:
        end = header.end
    for cut in range(0, end, 97):
        with pytest.raises(HeaderError):
            header = GGUFHeader(data[:cut])
            header.metadata()
            header.tensors()


def test_lengths_past_the_end_and_unknown_types_are_header_errors() -> None:
    head = b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little")
    huge_key = head + (1).to_bytes(8, "little") + (2**62).to_bytes(8, "little")
    with pytest.raises(HeaderError):
        GGUFHeader(huge_key).metadata()
    unknown = head + (1).to_bytes(8, "little") + (1).to_bytes(8, "little") + b"k"
    with pytest.raises(HeaderError, match="type 99"):
        GGUFHeader(unknown + (99).to_bytes(4, "little") + bytes(16)).metadata()
    with pytest.raises(HeaderError, match="version 1"):
        GGUFHeader(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
