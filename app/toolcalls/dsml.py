"""DeepSeek's DSML tool-call syntax (V3.2 and V4), written, read and read as it streams.

A reply's calls, after its content:

    \\n\\n<｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="location" string="true">Beijing</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

(`｜` is the fullwidth U+FF5C.) V4 wraps the calls in `tool_calls`, V3.2 in `function_calls`;
the invokes are the same. As DeepSeek's own encoder (`encoding/encoding_dsv4.py` of
deepseek-ai/DeepSeek-V4-Flash) writes and reads them: a string argument is written as is with
`string="true"`; any other value as JSON with `string="false"`; the arguments read back are
the JSON object `{"name": value, ...}` in the order written, strings JSON-quoted and the
others as written. A `string="false"` value that is not JSON is kept as a string here (the
encoder would produce invalid JSON), so a call's arguments are always a JSON object.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

DSML = "｜DSML｜"
_INVOKE_OPEN = f"<{DSML}invoke"
_INVOKE_CLOSE = f"</{DSML}invoke>"
_PARAM_CLOSE = f"</{DSML}parameter>"
_INVOKE = re.compile(rf'<{DSML}invoke\s+name="([^"]*)"\s*>\n?')
_PARAM = re.compile(rf'<{DSML}parameter\s+name="([^"]*)"\s+string="(true|false)"\s*>')


def start(block: str) -> str:
    """The marker that opens the calls: `block` is "tool_calls" (V4) or "function_calls"."""
    return f"<{DSML}{block}>"


def render(calls: Sequence[tuple[str, str]], block: str) -> str:
    """(name, arguments JSON) calls as the model writes them, from the blank line before."""
    invokes = [
        f'<{DSML}invoke name="{name}">\n' + "\n".join(_params(arguments)) + f"\n{_INVOKE_CLOSE}"
        for name, arguments in calls
    ]
    return f"\n\n{start(block)}\n" + "\n".join(invokes) + f"\n</{DSML}{block}>"


def _params(arguments: str) -> list[str]:
    try:
        values = json.loads(arguments)
    except json.JSONDecodeError:
        values = {"arguments": arguments}  # as the encoder writes arguments that are not JSON
    if not isinstance(values, dict):
        values = {"arguments": arguments}
    return [
        f'<{DSML}parameter name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
        f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
        f"{_PARAM_CLOSE}"
        for key, value in values.items()
    ]


def value_json(raw: str, is_string: bool) -> str:
    """One parameter's value as JSON text: a string quoted, another value as written."""
    if not is_string:
        try:
            json.loads(raw)
        except json.JSONDecodeError:
            return json.dumps(raw, ensure_ascii=False)
        return raw.strip()
    return json.dumps(raw, ensure_ascii=False)


def parse(text: str, block: str) -> list[tuple[str, str]]:
    """The (name, arguments JSON) calls of `text`, which begins with the block's marker;
    none when anything in the block is not an invoke or a parameter."""
    body = text.removeprefix(start(block)).split(f"</{DSML}{block}>", 1)[0]
    calls = []
    for piece in body.split(_INVOKE_OPEN)[1:]:
        m = _INVOKE.match(_INVOKE_OPEN + piece)
        if m is None or _INVOKE_CLOSE not in piece:
            return []
        inner = (_INVOKE_OPEN + piece)[m.end() :].split(_INVOKE_CLOSE, 1)
        if inner[1].strip():
            return []
        members, pos = [], 0
        while True:
            p = _PARAM.search(inner[0], pos)
            if p is None:
                break
            if inner[0][pos : p.start()].strip():
                return []
            end = inner[0].find(_PARAM_CLOSE, p.end())
            if end < 0:
                return []
            raw = inner[0][p.end() : end]
            members.append(f"{json.dumps(p.group(1))}: {value_json(raw, p.group(2) == 'true')}")
            pos = end + len(_PARAM_CLOSE)
        if inner[0][pos:].strip():
            return []
        calls.append((m.group(1), "{" + ", ".join(members) + "}"))
    if body.split(_INVOKE_OPEN)[0].strip():
        return []
    return calls


def partial(text: str, block: str) -> list[tuple[str, str, bool, str]]:
    """The calls of `text` (from the block's marker) as far as they are written:
    (name, arguments JSON so far, whether the call is whole, what closes the arguments).
    The arguments of each call only grow as `text` does."""
    out: list[tuple[str, str, bool, str]] = []
    pos = len(start(block))
    while True:
        at = text.find(_INVOKE_OPEN, pos)
        m = _INVOKE.match(text, at) if at >= 0 else None
        if m is None or text[pos:at].strip():
            return out
        name, pos = m.group(1), m.end()
        arguments, whole = "{", False
        while True:
            rest = text[pos:].lstrip()
            pos = len(text) - len(rest)
            if rest.startswith(_INVOKE_CLOSE):
                whole, pos = True, pos + len(_INVOKE_CLOSE)
                break
            p = _PARAM.match(text, pos)
            if p is None:
                break
            key = ("" if arguments == "{" else ", ") + json.dumps(p.group(1)) + ": "
            end = text.find(_PARAM_CLOSE, p.end())
            if p.group(2) == "false":  # shown when it closes: only then is it known to be JSON
                if end < 0:
                    break
                arguments += key + value_json(text[p.end() : end], False)
            else:
                raw = text[p.end() : end] if end >= 0 else _held_back(text[p.end() :])
                arguments += key + json.dumps(raw, ensure_ascii=False)[: -1 if end < 0 else None]
                if end < 0:
                    out.append((name, arguments, False, '"}'))
                    return out
            pos = end + len(_PARAM_CLOSE)
        out.append((name, arguments + ("}" if whole else ""), whole, "" if whole else "}"))
        if not whole:
            return out


def _held_back(value: str) -> str:
    """A string value still being written, less any end that may begin its closing tag."""
    for n in range(min(len(value), len(_PARAM_CLOSE) - 1), 0, -1):
        if _PARAM_CLOSE.startswith(value[-n:]):
            return value[:-n]
    return value


def instructions(functions: Sequence[dict[str, Any]], block: str) -> str:
    """The system block for a template that does not write `tools` itself."""
    listed = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
    close = f"</{DSML}{block}>"
    return (
        "## Tools\n\nYou can call the functions below. To call them, write a "
        f'"{start(block)}" block like this one:\n\n{start(block)}\n'
        f'<{DSML}invoke name="$FUNCTION_NAME">\n'
        f'<{DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE'
        f"{_PARAM_CLOSE}\n...\n{_INVOKE_CLOSE}\n{close}\n\n"
        'Write a string value as it is, with string="true"; write numbers, booleans, arrays '
        'and objects as JSON, with string="false".\n\n'
        f"### Available functions (JSON schemas)\n\n{listed}"
    )
