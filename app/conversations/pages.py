"""Rows read straight from a SQLite file's pages, for a database SQL can no longer open.

SQLite gives up on a file whose 100-byte header, first page or schema is damaged, or which
was cut short, though most of its rows still sit in their pages. This reader walks the pages
the way sqlite.org/fileformat2.html lays them out: the page size is the header's or, when the
header is gone, the one at which most pages parse as b-tree pages; each table leaf page (type
0x0D) holds cells of a payload length, a rowid and a record (a header of serial types, then
the values), with a payload too long for its page continued on a chain of overflow pages.

Which pages are read: where the schema on page 1 still names the conversations and messages
tables and both trees can be walked whole, only their leaves (so a page freed by a delete,
which keeps its old rows until reused, brings nothing back); otherwise every table leaf page
but those the header's free-page list names. A page the write-ahead log holds a committed
newer copy of is read from the log. Which table a record belongs to is the caller's to tell
(the schema may be gone): this module knows pages and records, not Stoke's tables.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass

_MAGIC = b"SQLite format 3\x00"
_HEADER = 100
_SIZES = (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512)
_SAMPLE = 8 << 20  # bytes looked at to guess a lost page size
_TABLE_LEAF, _TABLE_INTERIOR, _INDEX_LEAF, _INDEX_INTERIOR = 0x0D, 0x05, 0x0A, 0x02
_ENCODINGS = {1: "utf-8", 2: "utf-16-le", 3: "utf-16-be"}
_TABLES = ("conversations", "messages")


@dataclass(frozen=True)
class Record:
    """One row as its page holds it: `values` are as many columns as could be read (an
    INTEGER PRIMARY KEY column reads None: its value is the rowid); `complete` is False when
    part of the payload was lost (a broken overflow chain) or a text did not decode."""

    rowid: int
    values: tuple[object, ...]
    complete: bool


@dataclass(frozen=True)
class _Page:
    kind: int
    cells: tuple[int, ...]  # offsets of the cells within the page
    right: int  # an interior page's right-most child; 0 on a leaf


class _File:
    """The database's pages, with the log's committed copies laid over them."""

    def __init__(self, data: bytes | mmap.mmap, newer: dict[int, bytes], size: int) -> None:
        self.data = data
        self.newer = newer
        self.size = size
        intact = data[:16] == _MAGIC
        self.usable = size - (data[20] if intact and data[20] < size // 8 else 0)
        self.encoding = _ENCODINGS.get(int.from_bytes(data[56:60]) if intact else 1, "utf-8")
        self.count = max(-(-len(data) // size), max(newer, default=0))
        self.header_intact = intact

    def page(self, number: int) -> bytes:
        if number in self.newer:
            return self.newer[number]
        start = (number - 1) * self.size
        return self.data[start : start + self.size]

    def parse(self, number: int) -> _Page | None:
        """The b-tree page `number` is, or None if it is none (or is damaged)."""
        if not 1 <= number <= self.count:
            return None
        return _parse(self.page(number), 100 if number == 1 else 0, self.usable)


def records(data: bytes | mmap.mmap, newer: dict[int, bytes] | None = None) -> Iterator[Record]:
    """The records of the table leaf pages of `data` (a database file's bytes; `newer`: the
    pages a write-ahead log holds committed copies of, by page number)."""
    newer = newer or {}
    size = page_size(data, next((len(page) for page in newer.values()), None))
    if size is None:
        return
    file = _File(data, newer, size)
    leaves = _live_leaves(file)
    if leaves is None:
        free = _free_pages(file)
        leaves = [n for n in range(1, file.count + 1) if n not in free]
    for number in leaves:
        page = file.parse(number)
        if page is None or page.kind != _TABLE_LEAF:
            continue
        body = file.page(number)
        for offset in page.cells:
            record = _cell(file, body, offset)
            if record is not None:
                yield record


def page_size(data: bytes | mmap.mmap, hint: int | None = None) -> int | None:
    """The page size at which most of the file's first _SAMPLE bytes parse as b-tree pages,
    the header's (then `hint`, a log's) first among equals; None if no page parses."""
    stated = None
    if data[:16] == _MAGIC:
        raw = int.from_bytes(data[16:18])
        stated = 65536 if raw == 1 else raw
    first = [size for size in (stated, hint) if size in _SIZES]
    candidates = list(dict.fromkeys([*first, *_SIZES]))
    sample = data[:_SAMPLE]
    scores = {size: _parsed_pages(sample, size) for size in candidates}
    best = max(candidates, key=scores.__getitem__)  # the first of equals: the header's
    return best if scores[best] > 0 else None


def _parsed_pages(sample: bytes, size: int) -> int:
    return sum(
        _parse(sample[start : start + size], 100 if start == 0 else 0, size) is not None
        for start in range(0, len(sample) - size + 1, size)
    )


def _parse(page: bytes, at: int, usable: int) -> _Page | None:
    if len(page) < at + 12 or page[at] not in (
        _TABLE_LEAF,
        _TABLE_INTERIOR,
        _INDEX_LEAF,
        _INDEX_INTERIOR,
    ):
        return None
    kind = page[at]
    count = int.from_bytes(page[at + 3 : at + 5])
    content = int.from_bytes(page[at + 5 : at + 7]) or 65536
    leaf = kind in (_TABLE_LEAF, _INDEX_LEAF)
    pointers = at + (8 if leaf else 12)
    end = pointers + 2 * count
    if end > usable or not (end <= content <= usable or (count == 0 and content == 65536)):
        return None
    cells = struct.unpack(f">{count}H", page[pointers:end]) if count else ()
    if any(not end <= cell < min(usable, len(page)) for cell in cells):
        return None
    right = 0 if leaf else int.from_bytes(page[at + 8 : at + 12])
    return _Page(kind, cells, right)


def _live_leaves(file: _File) -> list[int] | None:
    """The leaves of the conversations and messages trees, when the schema names both and
    every page of both trees parses; else None."""
    schema = _tree_leaves(file, 1)
    if schema is None:
        return None
    roots = {}
    for number in schema:
        body = file.page(number)
        for offset in file.parse(number).cells:  # type: ignore[union-attr] (walked above)
            record = _cell(file, body, offset)
            values = record.values if record is not None else ()
            if len(values) >= 4 and values[0] == "table" and values[1] in _TABLES:
                roots[values[1]] = values[3]
    if set(roots) != set(_TABLES):
        return None
    leaves: list[int] = []
    for root in roots.values():
        found = _tree_leaves(file, root) if isinstance(root, int) else None
        if found is None:
            return None
        leaves += found
    return leaves


def _tree_leaves(file: _File, root: int) -> list[int] | None:
    """The leaf pages of the table b-tree at `root`, or None if any page of it is unreadable."""
    leaves, seen, pending = [], set(), [root]
    while pending:
        number = pending.pop()
        page = file.parse(number)
        if number in seen or page is None or page.kind not in (_TABLE_LEAF, _TABLE_INTERIOR):
            return None
        seen.add(number)
        if page.kind == _TABLE_LEAF:
            leaves.append(number)
            continue
        body = file.page(number)
        pending += [int.from_bytes(body[cell : cell + 4]) for cell in page.cells]
        pending.append(page.right)
    return sorted(leaves)


def _free_pages(file: _File) -> set[int]:
    """The pages the header's free-page list names (none when the header is gone)."""
    free: set[int] = set()
    if not file.header_intact:
        return free
    trunk = int.from_bytes(file.data[32:36])
    while 1 <= trunk <= file.count and trunk not in free:
        free.add(trunk)
        page = file.page(trunk)
        listed = min(int.from_bytes(page[4:8]), (len(page) - 8) // 4)
        free.update(struct.unpack(f">{listed}I", page[8 : 8 + 4 * listed]))
        trunk = int.from_bytes(page[:4])
    return free


def _cell(file: _File, page: bytes, offset: int) -> Record | None:
    """A table leaf cell's record, or None if its cell cannot be read at all."""
    try:
        length, at = _varint(page, offset)
        rowid, at = _varint(page, at)
    except IndexError:
        return None
    if rowid >= 1 << 63:
        rowid -= 1 << 64
    local = _local_size(length, file.usable)
    payload = page[at : at + local]
    whole = len(payload) == local
    if whole and local < length:
        payload, whole = _overflow(
            file, payload, int.from_bytes(page[at + local : at + local + 4]), length
        )
    values, decoded = _record(payload, file.encoding)
    return Record(rowid, values, whole and decoded)


def _local_size(length: int, usable: int) -> int:
    """How much of a payload of `length` bytes its table leaf cell holds (the rest overflows)."""
    most = usable - 35
    if length <= most:
        return length
    least = (usable - 12) * 32 // 255 - 23
    local = least + (length - least) % (usable - 4)
    return local if local <= most else least


def _overflow(file: _File, payload: bytes, first: int, length: int) -> tuple[bytes, bool]:
    """`payload` with its overflow chain from page `first` followed to `length` bytes; False
    with what was read when the chain breaks (a page lost, cut off or seen twice)."""
    parts, have, seen, number = [payload], len(payload), set(), first
    while have < length:
        page = file.page(number) if 1 <= number <= file.count else b""
        if number in seen or len(page) < file.usable:
            return b"".join(parts), False
        seen.add(number)
        part = page[4 : file.usable][: length - have]
        parts.append(part)
        have += len(part)
        number = int.from_bytes(page[:4])
    return b"".join(parts), True


def _record(payload: bytes, encoding: str) -> tuple[tuple[object, ...], bool]:
    """The values a record's header and body give (as many as `payload` holds), and whether
    every one was read whole and every text decoded."""
    try:
        header, at = _varint(payload, 0)
        types = []
        while at < min(header, len(payload)):
            kind, at = _varint(payload, at)
            types.append(kind)
    except IndexError:
        return (), False
    values: list[object] = []
    body = header
    for kind in types:
        size = _serial_size(kind)
        if size is None:
            return tuple(values), False
        raw = payload[body : body + size]
        body += size
        if len(raw) < size:
            if kind >= 13 and kind % 2:  # a text cut short: what was read of it
                values.append(raw.decode(encoding, errors="replace"))
            return tuple(values), False
        value, decoded = _value(kind, raw, encoding)
        values.append(value)
        if not decoded:
            return tuple(values), False
    return tuple(values), header <= len(payload) and body == len(payload)


def _serial_size(kind: int) -> int | None:
    if kind in (0, 8, 9):
        return 0
    if 1 <= kind <= 7:
        return (1, 2, 3, 4, 6, 8, 8)[kind - 1]
    return None if kind in (10, 11) else (kind - 12) // 2


def _value(kind: int, raw: bytes, encoding: str) -> tuple[object, bool]:
    if kind == 0:
        return None, True
    if kind in (8, 9):
        return kind - 8, True
    if kind == 7:
        return struct.unpack(">d", raw)[0], True
    if kind <= 6:
        return int.from_bytes(raw, signed=True), True
    if kind % 2 == 0:
        return raw, True
    try:
        return raw.decode(encoding), True
    except UnicodeDecodeError:
        return raw.decode(encoding, errors="replace"), False


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """SQLite's big-endian varint at `at`: its value and the offset after it."""
    value = 0
    for i in range(8):
        byte = data[at + i]
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    return (value << 8) | data[at + 8], at + 9
