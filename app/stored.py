"""Stoke's own JSON files, read back through one check, so that no damaged file stops Stoke.

Stoke writes settings, presets, per-model load settings, the library's folders, the download
state and its caches (model hashes, the CPU buffer verdict, the safe-mode records, the library
scan) and reads them back; people edit them by hand, disks fail, and older and newer Stokes
share one home. So each file is declared once with its schema (`Stored`), and `Stored.read`
promises never to raise for what it finds there. A missing file reads as the file's `empty`
value; so does one that cannot be parsed (not UTF-8, not JSON, nested deeper than `MAX_DEPTH`,
a folder in its place). In one that parses, every part with a wrong type or value and every key
the schema does not know is dropped, an object without a part it requires goes with it, and
the rest is kept. What was dropped is said in one sentence naming the file and each part,
logged as a warning (`stoke.stored`) and returned as `Found.problem`.

A damaged file does not stay to be warned about at every read: what is left of it replaces it
(nothing left: it is removed). A file that holds what the user made (`keep=True`) is first kept
aside as `NAME.damaged` (`-2`, `-3`, ...: never over an earlier copy); a cache is simply
rebuilt, except that a folder in its place is moved aside, never deleted. A file that cannot be
read (permissions, I/O) is left as it is, and one that cannot be repaired (a read-only folder)
is read all the same; the sentence says which.
"""

from __future__ import annotations

import json
import logging
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app import paths

log = logging.getLogger("stoke.stored")

MAX_DEPTH = 32  # deeper than any file Stoke writes; deeper still reads as damaged
_LISTED = 5  # problems named in one sentence; the rest are counted
_SHOWN = 60  # characters of a dropped value shown


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP: Any = _Drop()  # what a schema returns for a part it drops


class Schema(Protocol):
    def clean(self, value: Any, where: str, problems: list[str]) -> Any:
        """`value` with what is wrong dropped (DROP: all of it), each drop named in `problems`."""
        ...


@dataclass(frozen=True)
class Value:
    """A value kept when `check` accepts it; `expected` says what it must be, in words."""

    check: Callable[[Any], bool]
    expected: str

    def clean(self, value: Any, where: str, problems: list[str]) -> Any:
        if self.check(value):
            return value
        problems.append(f"{where or 'the file'} = {_shown(value)} is not {self.expected}")
        return DROP


@dataclass(frozen=True)
class Fields:
    """An object of named parts, each with its schema. A key not among them is dropped; a part
    that is dropped or missing and `required` drops the whole object."""

    fields: Mapping[str, Schema]
    required: tuple[str | tuple[str, ...], ...] = ()  # a tuple: at least one of these

    def clean(self, value: Any, where: str, problems: list[str]) -> Any:
        if not isinstance(value, dict):
            problems.append(f"{where or 'the file'} is {_kind(value)}, not an object")
            return DROP
        kept = {}
        for key, item in value.items():
            here = _member(where, key)
            schema = self.fields.get(key)
            if schema is None:
                problems.append(f"{here} is not something Stoke keeps here")
                continue
            cleaned = schema.clean(item, here, problems)
            if cleaned is not DROP:
                kept[key] = cleaned
        missing = [
            " or ".join(need) if isinstance(need, tuple) else need
            for need in self.required
            if not any(k in kept for k in (need if isinstance(need, tuple) else (need,)))
        ]
        if missing:
            needs = f"{where or 'the file'} needs {', '.join(missing)}"
            problems.append(needs + (", so it is left out" if where else ""))
            return DROP
        return kept


@dataclass(frozen=True)
class Entries:
    """An object of like entries under keys that are names or ids (`key` checks them): a bad
    entry is dropped alone."""

    values: Schema
    key: Value = field(default_factory=lambda: Value(lambda k: k != "", "a name"))

    def clean(self, value: Any, where: str, problems: list[str]) -> Any:
        if not isinstance(value, dict):
            problems.append(f"{where or 'the file'} is {_kind(value)}, not an object")
            return DROP
        kept = {}
        for key, item in value.items():
            here = _member(where, key)
            if not self.key.check(key):
                problems.append(f"{here}: its key is not {self.key.expected}")
                continue
            cleaned = self.values.clean(item, here, problems)
            if cleaned is not DROP:
                kept[key] = cleaned
        return kept


@dataclass(frozen=True)
class Items:
    """An array of like items: a bad item is dropped alone."""

    items: Schema

    def clean(self, value: Any, where: str, problems: list[str]) -> Any:
        if not isinstance(value, list):
            problems.append(f"{where or 'the file'} is {_kind(value)}, not an array")
            return DROP
        cleaned = (self.items.clean(v, f"{where}[{i}]", problems) for i, v in enumerate(value))
        return [v for v in cleaned if v is not DROP]


# -- checks the schemas share ------------------------------------------------------------------


def text(v: Any) -> bool:
    return isinstance(v, str)


def text_or_none(v: Any) -> bool:
    return v is None or isinstance(v, str)


def boolean(v: Any) -> bool:
    return isinstance(v, bool)


def whole(low: int | None = None, high: int | None = None) -> Callable[[Any], bool]:
    """A JSON whole number (not true or false) within [low, high]."""
    return lambda v: (
        isinstance(v, int)
        and not isinstance(v, bool)
        and (low is None or v >= low)
        and (high is None or v <= high)
    )


def number(low: float | None = None, *, above: bool = False) -> Callable[[Any], bool]:
    """A finite JSON number (not true or false) from `low` (past it when `above`)."""

    def check(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return False
        return low is None or (v > low if above else v >= low)

    return check


def one_of(*choices: Any) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str | int) and not isinstance(v, bool) and v in choices


def matching(pattern: str) -> Callable[[Any], bool]:
    """A string that is all of `pattern`."""
    compiled = re.compile(pattern)
    return lambda v: isinstance(v, str) and compiled.fullmatch(v) is not None


def array_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """An array whose every item `check` accepts (checked whole: a part alone means nothing)."""
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def of_type(hint: Any) -> Callable[[Any], bool]:
    """JSON that holds a value of the Python type `hint` (a resolved annotation: bool, int,
    float, str, None, a Path or a Literal as a string, unions of them, tuples written as
    arrays), so a file can hold a dataclass's fields without a second list of their types.
    TypeError for any other hint."""
    parts = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Literal:
        return one_of(*parts)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        checks = [of_type(part) for part in parts]
        return lambda v: any(check(v) for check in checks)
    if typing.get_origin(hint) is tuple:
        if len(parts) == 2 and parts[1] is Ellipsis:
            return array_of(of_type(parts[0]))
        checks = [of_type(part) for part in parts]
        return lambda v: (
            isinstance(v, list)
            and len(v) == len(checks)
            and all(check(x) for check, x in zip(checks, v, strict=True))
        )
    plain = {bool: boolean, int: whole(), float: number(), str: text, Path: text, type(None): _null}
    if hint in plain:
        return plain[hint]
    raise TypeError(f"no JSON check for {hint!r}")


def _null(v: Any) -> bool:
    return v is None


# -- the files ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    """What a read gives: the checked value, and what was wrong in words (None: nothing)."""

    value: Any
    problem: str | None = None


@dataclass(frozen=True)
class Stored:
    """One JSON file Stoke writes for itself and reads back: its schema, what reading it
    gives when there is nothing usable (`empty`, called afresh each time), and whether a damaged
    copy is the user's to keep (`keep`) or a cache's to rebuild."""

    schema: Schema
    keep: bool
    empty: Callable[[], Any] = dict

    def read(self, path: Path) -> Found:
        """The file's checked content; never raises for what is in (or at) `path`."""
        try:
            raw = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            return Found(self.empty())
        except IsADirectoryError:
            return self._damaged(path, f"{path} is a folder, not a file", DROP)
        except UnicodeDecodeError:
            return self._damaged(path, f"{path} is not UTF-8 text", DROP)
        except RecursionError:
            return self._damaged(path, f"{path} is nested too deeply to read", DROP)
        except ValueError as exc:
            return self._damaged(path, f"{path} is not valid JSON ({exc})", DROP)
        except OSError as exc:
            problem = f"{path} could not be read ({exc.strerror or exc}): using the defaults."
            log.warning("%s", problem)
            return Found(self.empty(), problem)
        if _deeper_than(raw, MAX_DEPTH):
            return self._damaged(path, f"{path} is nested deeper than {MAX_DEPTH} levels", DROP)
        problems: list[str] = []
        value = self.schema.clean(raw, "", problems)
        if not problems:
            return Found(value)
        listed = "; ".join(problems[:_LISTED])
        if len(problems) > _LISTED:
            listed += f"; and {len(problems) - _LISTED} more"
        return self._damaged(path, f"{path}: {listed}", value)

    def _damaged(self, path: Path, what: str, survived: Any) -> Found:
        """Repair `path` (set it aside or let it go, write what `survived`), log, say so."""
        lost = "; using the defaults" if survived is DROP else ""
        problem = f"{what}{lost}. {self._repair(path, survived)}"
        log.warning("%s", problem)
        return Found(self.empty() if survived is DROP else survived, problem)

    def _repair(self, path: Path, survived: Any) -> str:
        try:
            folder = path.is_dir()
            kept = paths.keep_aside(path) if self.keep or folder else None
            if survived is not DROP:
                paths.write_private(path, json.dumps(survived, indent=2))
            elif kept is None:
                path.unlink(missing_ok=True)
        except OSError as exc:
            return f"The file could not be repaired ({exc.strerror or exc})."
        if kept is None:
            return "It is rebuilt."
        return f"The {'folder' if folder else 'file'} as found is kept as {kept.name}."


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest past `limit` levels (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _member(where: str, key: str) -> str:
    """How a part is named in the sentence: `a.b` for a plain key, `a["/some/path"]` else."""
    if _NAME.fullmatch(key):
        return f"{where}.{_clip(key)}" if where else _clip(key)
    return f"{where}[{json.dumps(_clip(key), ensure_ascii=False)}]"


def _kind(value: Any) -> str:
    """What a JSON value is, in words."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return {dict: "an object", list: "an array", str: "a string"}.get(type(value), "a number")


def _shown(value: Any) -> str:
    return _clip(json.dumps(value, ensure_ascii=False))  # shallow: MAX_DEPTH was checked


def _clip(words: str) -> str:
    return words if len(words) <= _SHOWN else words[: _SHOWN - 3] + "..."
