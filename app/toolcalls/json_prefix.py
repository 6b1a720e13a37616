"""How much of a JSON value, written so far, can already be shown: the longest prefix that
closing brackets (and a quote) would make valid JSON.

A tool call's arguments stream as the model samples them (app/server/tool_replies.py's
ToolStream). What is sent cannot be taken back, so only text that stays valid JSON whatever
comes next is sent: an opening bracket, a finished value, the characters of a string value;
never half a key, a bare `,` or `:`, or a number that may still grow. If the reply ends there
(or turns into something that is not JSON), `completion` closes what is open, and the
client's arguments are still a JSON object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_RUN = re.compile(r"[-+.eE0-9]*")
_LITERALS = ("true", "false", "null")
_HEX = frozenset("0123456789abcdefABCDEF")
_SPACE = frozenset(" \t\r\n")


@dataclass(frozen=True)
class Prefix:
    """text[start:safe] + completion is valid JSON; `end` is where the value ended (None
    while it is open); `broken` when the text cannot be JSON from some point on."""

    safe: int
    completion: str
    end: int | None = None
    broken: bool = False


def scan(text: str, start: int = 0) -> Prefix:
    """The JSON value that begins at `start` (after any whitespace), as far as it goes."""
    stack: list[str] = []
    i, n = start, len(text)
    safe, completion = start, ""
    expect = "value"  # value | value_or_end | key | key_or_end | colon | comma_or_end

    def closers() -> str:
        return "".join("}" if s == "{" else "]" for s in reversed(stack))

    while i < n:
        c = text[i]
        if c in _SPACE:
            i += 1
            continue
        value_done = False
        if expect in ("value", "value_or_end"):
            if c == "]" and expect == "value_or_end":
                stack.pop()
                i += 1
                value_done = True
            elif c in "{[":
                stack.append(c)
                i += 1
                expect = "key_or_end" if c == "{" else "value_or_end"
                safe, completion = i, closers()
                continue
            elif c == '"':
                j, inside = _string(text, i + 1)
                if j is None:  # open: its characters so far may be shown
                    if inside < 0:
                        return Prefix(safe, completion, None, True)
                    return Prefix(inside, '"' + closers())
                i, value_done = j, True
            elif c in "-0123456789":
                run = _NUMBER_RUN.match(text, i).end()
                if run == n:  # may still grow
                    return Prefix(safe, completion)
                if not _NUMBER.fullmatch(text, i, run):
                    return Prefix(safe, completion, None, True)
                i, value_done = run, True
            else:
                word = next((w for w in _LITERALS if text.startswith(w, i)), None)
                if word is None:
                    partial = any(w.startswith(text[i:]) for w in _LITERALS)
                    return Prefix(safe, completion, None, not partial)
                i, value_done = i + len(word), True
        elif expect in ("key", "key_or_end"):
            if c == "}" and expect == "key_or_end":
                stack.pop()
                i += 1
                value_done = True
            elif c == '"':
                j, inside = _string(text, i + 1)
                if j is None:
                    return Prefix(safe, completion, None, inside < 0)
                i, expect = j, "colon"
                continue
            else:
                return Prefix(safe, completion, None, True)
        elif expect == "colon":
            if c != ":":
                return Prefix(safe, completion, None, True)
            i, expect = i + 1, "value"
            continue
        else:  # comma_or_end
            top = stack[-1]
            if c == ",":
                i, expect = i + 1, "key" if top == "{" else "value"
                continue
            if c != ("}" if top == "{" else "]"):
                return Prefix(safe, completion, None, True)
            stack.pop()
            i += 1
            value_done = True
        if value_done:
            if not stack:
                return Prefix(i, "", i)
            safe, completion, expect = i, closers(), "comma_or_end"
    return Prefix(safe, completion)


def _string(text: str, i: int) -> tuple[int | None, int]:
    """After a string's opening quote: (the index after its closing quote, -) when it closes;
    else (None, how far its whole characters go), or (None, -1) when it cannot be JSON."""
    n = len(text)
    whole = i
    while i < n:
        c = text[i]
        if c == '"':
            return i + 1, whole
        if c == "\\":
            if i + 1 >= n:
                return None, whole
            e = text[i + 1]
            if e == "u":
                digits = text[i + 2 : i + 6]
                if not all(d in _HEX for d in digits):
                    return None, -1
                if len(digits) < 4:
                    return None, whole
                i += 6
            elif e in '"\\/bfnrt':
                i += 2
            else:
                return None, -1
        elif ord(c) < 0x20:
            return None, -1
        else:
            i += 1
        whole = i
    return None, whole
