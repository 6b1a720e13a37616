"""The reply's shape, under every field name clients send it: OpenAI's `response_format`,
llama-server's `json_schema` and `grammar` (GBNF), vLLM's `guided_json`, `guided_choice`,
`guided_regex` and `guided_grammar`. Each becomes one ResponseFormat the grammar library
enforces token by token; a request naming two is refused, as is one the library cannot use,
in words naming the field. None of them is ever dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

from app.server.errors import invalid
from app.toolcalls.tools import ResponseFormat, ToolError, parse_response_format

FIELDS = (
    "response_format",
    "json_schema",
    "guided_json",
    "guided_choice",
    "guided_regex",
    "grammar",
    "guided_grammar",
)


def constraint_of(body: Mapping[str, Any]) -> tuple[str, ResponseFormat]:
    """The field that shapes the reply (or "response_format" when none does) and the shape."""
    given = [name for name in FIELDS if body.get(name) is not None]
    if not given:
        return "response_format", ResponseFormat()
    if len(given) > 1:
        raise invalid(
            given[1],
            f"`{given[0]}` and `{given[1]}` both set the reply's shape; send one of them.",
        )
    name = given[0]
    value = body[name]
    if name == "response_format":
        try:
            return name, parse_response_format(value)
        except ToolError as error:
            raise invalid(error.field, error.message) from None
    if name in ("json_schema", "guided_json"):
        return name, ResponseFormat("json_schema", _schema(name, value))
    if name == "guided_choice":
        return name, ResponseFormat("grammar", grammar=_choices(value))
    if name == "guided_regex":
        if not isinstance(value, str) or not value:
            raise invalid(name, "`guided_regex` must be a regular expression (a string).")
        return name, ResponseFormat("grammar", grammar=f"start: /{_slashed(value)}/")
    if not isinstance(value, str) or not value.strip():
        raise invalid(name, f"`{name}` must be a grammar (GBNF or Lark text).")
    try:
        return name, ResponseFormat("grammar", grammar=any_to_lark(value))
    except GbnfToLarkError as error:
        raise invalid(name, f"`{name}` is not a grammar Stoke can read: {error}.") from None


def _schema(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise invalid(name, f"`{name}` is text that is not JSON.") from None
    if not isinstance(value, Mapping):
        raise invalid(name, f"`{name}` must be a JSON schema object.")
    return dict(value)


def _choices(value: Any) -> str:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise invalid("guided_choice", "`guided_choice` must be a list of non-empty strings.")
    return "start: " + " | ".join(json.dumps(choice) for choice in value)


def _slashed(regex: str) -> str:
    """`regex` inside Lark's /.../, its unescaped slashes escaped."""
    out, escaped = [], False
    for char in regex:
        if char == "/" and not escaped:
            out.append("\\/")
        else:
            out.append(char)
        escaped = char == "\\" and not escaped
    return "".join(out)
