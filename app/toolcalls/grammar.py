"""The grammar a reply must follow: `response_format` json_object (any JSON object) or
json_schema (JSON valid under the schema), and a required or named tool choice (one call, in
the model's own syntax, to one of the offered functions with arguments valid under its
parameters schema). The engines enforce it token by token (app/engine/constraint.py), so even
the smallest model answers in the shape asked for: the API server for `tool_choice`, the
chat's tool loop for a round that must call a tool.

Objects in a tool's parameters (and in a `strict` json_schema) take only the properties they
list unless they say otherwise, as OpenAI's strict mode reads them: a small model otherwise
wanders into keys of its own. JSON is written compactly with ", " and ": " and no other
whitespace, so a small model cannot wander into endless blank lines. Families whose call
markers are special tokens name them by id (`<[id]>`), as the grammar library reads them.
DeepSeek's DSML calls (dsml.py) take each parameter as its own tag: a string property
as raw text (or one of its `enum` values), any other as JSON under its schema; the required
ones in the schema's order, then any of the others.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from app.engine.constraint import grammar_error
from app.toolcalls.dsml import DSML
from app.toolcalls.syntax import ToolSyntax
from app.toolcalls.tools import ResponseFormat, ToolError, Tools

_INVOKE_END = f"</{DSML}invoke>"
_PARAM_END = f"</{DSML}parameter>"
_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
Tokenize = Callable[[str], list[int]]  # text -> ids, control tokens parsed


def reply_grammar(
    response_format: ResponseFormat, tools: Tools, syntax: ToolSyntax, tokenize: Tokenize
) -> str | None:
    """The Lark grammar for the reply, or None when it is free text."""
    if tools.forced:
        return _call_grammar(tools, syntax, tokenize)
    return format_grammar(response_format)


def format_grammar(response_format: ResponseFormat) -> str | None:
    """The Lark grammar of a reply's shape alone (no tool call forced), or None: free text."""
    if response_format.kind == "json_object":
        return "start: " + _json({"type": "object"})
    if response_format.kind == "json_schema":
        schema = response_format.schema or {}
        return "start: " + _json(_closed(schema) if response_format.strict else schema)
    if response_format.kind == "grammar":
        return response_format.grammar
    return None


def enforceable(grammar: str, field: str, what: str = "JSON schema") -> str:
    """`grammar`, once the grammar library has taken it; else a ToolError naming `field`
    (`tools`, `response_format`, ...), saying why the library could not use its `what`."""
    error = grammar_error(grammar)
    if error is not None:
        raise ToolError(field, f"The {what} in `{field}` cannot be enforced: {_reason(error)}")
    return grammar


def _reason(error: str) -> str:
    """The grammar library's complaint without its position marks and the grammar it echoes
    (Stoke's own JSON style settings among them)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    first = re.sub(r"^(at )?\d+\(\d+\):\s*", "", lines[0] if lines else "")
    first = first.removeprefix("failed to compile JSON schema: ").rstrip(":")
    detail = next((line[len("error: ") :] for line in lines if line.startswith("error: ")), "")
    reason = f"{first}: {detail}" if detail else first
    return (reason[:200] or "the grammar library refused it") + "."


def _closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists properties
    and says nothing about others."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    literal = ("const", "enum", "default", "examples")
    out = {k: v if k in literal else _closed(v) for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: _closed(v) for k, v in schema["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out


def _json(schema: dict[str, Any]) -> str:
    return "%json" + json.dumps({**schema, "x-guidance": _STYLE}, ensure_ascii=False)


def _call_grammar(tools: Tools, syntax: ToolSyntax, tokenize: Tokenize) -> str:
    names = [tools.name] if tools.choice == "function" else tools.names
    args_key = "parameters" if syntax.family == "llama3" else "arguments"
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, args_key: _closed(tools.schema(name))},
            "required": ["name", args_key],
            "additionalProperties": False,
        }
        for name in names
    ]
    call = _json(options[0] if len(options) == 1 else {"anyOf": options})
    if syntax.family == "llama3":
        return f"start: {call}"
    if syntax.family == "mistral":
        return f'start: {_literal("[TOOL_CALLS]", tokenize)} "[" {call} "]"'
    if syntax.family in ("deepseek-v3.2", "deepseek-v4"):
        return _dsml_grammar(tools, names, syntax)
    if syntax.family == "deepseek":  # the name is written bare, then the arguments
        sep = _literal("<｜tool▁sep｜>", tokenize)
        alternatives = " | ".join(
            f"{json.dumps(name)} {sep} {_json(_closed(tools.schema(name)))}" for name in names
        )
        begin = (
            _literal("<｜tool▁calls▁begin｜>", tokenize)
            + " "
            + _literal("<｜tool▁call▁begin｜>", tokenize)
        )
        end = (
            _literal("<｜tool▁call▁end｜>", tokenize)
            + " "
            + _literal("<｜tool▁calls▁end｜>", tokenize)
        )
        return f"start: {begin} call {end}\ncall: {alternatives}"
    return f'start: "<tool_call>\\n" {call} "\\n</tool_call>"'


def _dsml_grammar(tools: Tools, names: list[str], syntax: ToolSyntax) -> str:
    """One DSML invoke of one of `names`, each parameter valid under its schema."""
    block = syntax.start.removeprefix(f"<{DSML}").removesuffix(">")
    rules, invokes = [], []
    for n, name in enumerate(names):
        schema = tools.schema(name)
        properties = schema.get("properties") or {}
        required = [p for p in properties if p in schema.get("required", ())]
        params = [_dsml_param(p, properties[p], "\n" if i else "") for i, p in enumerate(required)]
        params += [
            f"{_dsml_param(p, s, chr(10))}?" for p, s in properties.items() if p not in required
        ]
        opening = json.dumps(f'<{DSML}invoke name="{name}">\n')
        rules.append(f"invoke{n}: {opening} {' '.join(params)} {json.dumps(chr(10) + _INVOKE_END)}")
        invokes.append(f"invoke{n}")
    start = json.dumps(f"\n\n<{DSML}{block}>\n")
    end = json.dumps(f"\n</{DSML}{block}>")
    return "\n".join([f"start: {start} ({' | '.join(invokes)}) {end}", *rules])


def _dsml_param(name: str, schema: Any, lead: str) -> str:
    """One parameter's tag, after `lead` (its newline is part of the tag's literal, so the
    lexer never has to choose between a bare newline and the invoke's closing tag)."""
    schema = schema if isinstance(schema, dict) else {}
    is_string = schema.get("type") == "string"
    kind = "true" if is_string else "false"
    opening = json.dumps(f'{lead}<{DSML}parameter name="{name}" string="{kind}">')
    if not is_string:
        value = _json(_closed(schema))
    elif isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
        value = "(" + " | ".join(json.dumps(v) for v in schema["enum"]) + ")"
    else:
        value = "/[^<]*/"
    return f"({opening} {value} {json.dumps(_PARAM_END)})"


def _literal(marker: str, tokenize: Tokenize) -> str:
    """A marker as the grammar names it: its token id when it is one special token."""
    ids = tokenize(marker)
    return f"<[{ids[0]}]>" if len(ids) == 1 and len(marker) > 1 else json.dumps(marker)
