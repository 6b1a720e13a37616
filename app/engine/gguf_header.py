"""A GGUF file's header, walked with `struct` over a memory map: each metadata entry (its bytes
and, on request, its value), the tensor infos, and where the tensor data begins.

gguf-py's GGUFReader makes a numpy view of every string in the vocabulary and merges: about
15 s for SmolLM2's 49,152 tokens on a busy 2-core machine, paid at every model inspection,
load and library scan. Here an array's strings are only stepped over (a length each), which
takes milliseconds, and only the values a caller asks for are decoded. The walk is lazy: a
caller that wants the first entries (the architecture is written first) reads only those.

Little-endian GGUF v2/v3 only, as llama.cpp writes them. Damage (a length past the end of the
file, an unknown type) raises HeaderError, a ValueError, for the caller to put in words.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
VERSIONS = (2, 3)
STRING, ARRAY = 8, 9
# bytes of each scalar type, and its struct code
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_SIZES = {kind: struct.calcsize(code) for kind, code in _SCALARS.items()}
DEFAULT_ALIGNMENT = 32


class HeaderError(ValueError):
    """The header is cut off or holds what no GGUF writer writes."""


@dataclass(frozen=True)
class Entry:
    """One metadata entry: `start` is where its key begins, `value_at` its value, `end` the
    next entry; `count` is an array's number of items."""

    key: str
    kind: int
    start: int
    value_at: int
    end: int
    count: int | None = None


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dims: tuple[int, ...]  # as stored: the fastest-moving dimension first
    ggml_type: int
    offset: int  # from the start of the tensor data


class GGUFHeader:
    """The header of the GGUF mapped in `view`; entries are read as they are asked for."""

    def __init__(self, view: mmap.mmap | bytes) -> None:
        self.view = view
        if len(view) < 24 or view[:4] != MAGIC:
            raise HeaderError("not a GGUF file")
        self.version, self.n_tensors, self.n_kv = struct.unpack_from("<IQQ", view, 4)
        if self.version not in VERSIONS:
            raise HeaderError(f"GGUF version {self.version}")
        self._entries: list[Entry] = []
        self._tensors: list[TensorEntry] | None = None
        self._end = 0

    def entries(self) -> Iterator[Entry]:
        """Every metadata entry in file order, walked once and remembered."""
        yield from self._entries
        at = self._entries[-1].end if self._entries else 24
        while len(self._entries) < self.n_kv:
            start = at
            key, at = self._string(at)
            (kind,) = self._unpack("<I", at)
            value_at = at + 4
            count = self._unpack("<IQ", value_at)[1] if kind == ARRAY else None
            at = self._skip(kind, value_at)
            entry = Entry(key, kind, start, value_at, at, count)
            self._entries.append(entry)
            yield entry

    def value(self, entry: Entry, max_items: int | None = None) -> object | None:
        """The entry's value as plain Python (an array as a tuple); None for an array of more
        than `max_items` items."""
        if entry.count is not None and max_items is not None and entry.count > max_items:
            return None
        return self._value(entry.kind, entry.value_at)[0]

    def metadata(self, max_items: int | None = None) -> dict[str, object]:
        """Every entry's value, leaving out arrays of more than `max_items` items."""
        return {e.key: v for e in self.entries() if (v := self.value(e, max_items)) is not None}

    def tensors(self) -> list[TensorEntry]:
        """The tensor infos, which follow the metadata; walked once and remembered."""
        if self._tensors is not None:
            return self._tensors
        at = max((e.end for e in self.entries()), default=24)
        tensors = []
        for _ in range(self.n_tensors):
            name, at = self._string(at)
            (n_dims,) = self._unpack("<I", at)
            if n_dims > 8:
                raise HeaderError(f"tensor {name} has {n_dims} dimensions")
            dims = self._unpack(f"<{n_dims}Q", at + 4)
            ggml_type, offset = self._unpack("<IQ", at + 4 + 8 * n_dims)
            at += 4 + 8 * n_dims + 12
            tensors.append(TensorEntry(name, tuple(dims), ggml_type, offset))
        self._tensors, self._end = tensors, at
        return tensors

    @property
    def end(self) -> int:
        """The first byte after the tensor infos."""
        self.tensors()
        return self._end

    @property
    def data_offset(self) -> int:
        """Where the tensor data begins: the header's end, aligned as the file says."""
        alignment = next(
            (self.value(e) for e in self.entries() if e.key == "general.alignment"),
            DEFAULT_ALIGNMENT,
        )
        if not isinstance(alignment, int) or alignment <= 0:
            raise HeaderError(f"alignment {alignment!r}")
        return -(-self.end // alignment) * alignment

    def _unpack(self, fmt: str, at: int) -> tuple:
        try:
            return struct.unpack_from(fmt, self.view, at)
        except struct.error:
            raise HeaderError("the header runs past the end of the file") from None

    def _string(self, at: int) -> tuple[str, int]:
        (length,) = self._unpack("<Q", at)
        end = at + 8 + length
        if end > len(self.view):
            raise HeaderError("a string runs past the end of the file")
        return bytes(self.view[at + 8 : end]).decode("utf-8", "replace"), end

    def _skip(self, kind: int, at: int) -> int:
        """The offset after a value of `kind` that starts at `at`."""
        if kind in _SIZES:
            end = at + _SIZES[kind]
        elif kind == STRING:
            (length,) = self._unpack("<Q", at)
            end = at + 8 + length
        elif kind == ARRAY:
            item, count = self._unpack("<IQ", at)
            at += 12
            if item in _SIZES:
                end = at + count * _SIZES[item]
            else:
                for _ in range(count):
                    at = self._skip(item, at)
                end = at
        else:
            raise HeaderError(f"unknown metadata type {kind}")
        if end > len(self.view):
            raise HeaderError("a value runs past the end of the file")
        return end

    def _value(self, kind: int, at: int) -> tuple[object, int]:
        if kind in _SCALARS:
            return self._unpack("<" + _SCALARS[kind], at)[0], at + _SIZES[kind]
        if kind == STRING:
            return self._string(at)
        if kind != ARRAY:
            raise HeaderError(f"unknown metadata type {kind}")
        item, count = self._unpack("<IQ", at)
        at += 12
        if item in _SCALARS:
            values = self._unpack(f"<{count}{_SCALARS[item]}", at)
            return tuple(values), at + count * _SIZES[item]
        values = []
        for _ in range(count):
            value, at = self._value(item, at)
            values.append(value)
        return tuple(values), at


@contextlib.contextmanager
def open_header(path: str | os.PathLike[str]) -> Iterator[GGUFHeader]:
    """The header of the GGUF at `path`, over a read-only memory map (only the pages walked
    are read). Raises OSError for an unreadable file and HeaderError for a damaged one."""
    with Path(path).open("rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise HeaderError("the file is empty")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as view:
            yield GGUFHeader(view)
