"""Function tools: `tools`, `tool_choice`, `parallel_tool_calls`, the tool calls of assistant
messages, and `response_format`, in OpenAI's request shape, checked and turned into typed values.

A tool call's arguments are kept as the JSON text they came as and compared by their
canonical form (parsed, keys sorted, no whitespace), so a client that re-serializes them still
names the same call (the server's replay.py). Every refusal is a ToolError that says which
field is wrong and how to fix it; the API server answers it as its own 400.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_TOOLS = 128
_ID_ALPHABET = string.ascii_letters + string.digits


class ToolError(ValueError):
    """Tools, a tool choice or calls that cannot be used: `field` names what is wrong (as a
    request writes it, e.g. `tools[2].function.name`), `message` says how to fix it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ToolCall:
    """One function call: the id the client sees, the name, the arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def canonical(self) -> str:
        """The call as compared between turns: name and arguments, not the id or spacing."""
        return json.dumps([self.name, canonical_json(self.arguments)], ensure_ascii=False)

    def openai(self, index: int | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            entry["index"] = index
        return entry


@dataclass(frozen=True)
class Tools:
    """A request's tools: the function definitions as sent, and which calls are wanted."""

    functions: tuple[dict[str, Any], ...] = ()  # the `tools` entries, `{"type": "function", ...}`
    choice: str = "auto"  # auto | none | required | function (then `name` says which)
    name: str | None = None
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Whether the model is told about tools and its reply is parsed for calls."""
        return bool(self.functions) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """Whether the reply must be a tool call (sampling is constrained to one)."""
        return self.active and self.choice in ("required", "function")

    def schema(self, name: str) -> dict[str, Any]:
        for tool in self.functions:
            if tool["function"]["name"] == name:
                return tool["function"].get("parameters") or {"type": "object"}
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.functions]


@dataclass(frozen=True)
class ToolSpec:
    """A function a model may be offered, whoever provides it (an MCP server, Python): its
    name, what it does in words, and its parameters' JSON schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


def tools_of(specs: Sequence[ToolSpec], choice: str = "auto") -> Tools:
    """`specs` as the tools of a request with `tool_choice` `choice` (auto, none, required or
    a function's name), checked by the rules every request's tools are: a ToolError says
    which one is wrong."""
    functions = [
        {
            "type": "function",
            "function": {"name": s.name, "parameters": s.parameters}
            | ({"description": s.description} if s.description else {}),
        }
        for s in specs
    ]
    named = choice not in ("auto", "none", "required")
    return parse_tools(
        {"tools": functions, "tool_choice": {"function": {"name": choice}} if named else choice}
    )


def canonical_json(text: str) -> Any:
    """Arguments parsed for comparison; text that is not JSON compares as itself."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text
    return json.loads(json.dumps(value, sort_keys=True))


def new_call_id(length: int = 24, *, prefix: str = "call_") -> str:
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))


def parse_tools(body: Mapping[str, Any]) -> Tools:
    raw = body.get("tools")
    if raw is None and body.get("functions") is not None:  # the legacy spelling
        raw = [{"type": "function", "function": f} for f in body["functions"]]
    if raw is None:
        raw = []
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise ToolError("tools", f"`tools` must be a list of up to {MAX_TOOLS} function tools.")
    functions = tuple(_tool(i, t) for i, t in enumerate(raw))
    names = [f["function"]["name"] for f in functions]
    if len(set(names)) != len(names):
        raise ToolError("tools", "Two tools share a name; each function needs its own name.")
    choice, name = _choice(body.get("tool_choice", body.get("function_call")), names)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ToolError("parallel_tool_calls", "`parallel_tool_calls` must be true or false.")
    return Tools(functions, choice, name, parallel)


def _tool(index: int, raw: Any) -> dict[str, Any]:
    where = f"tools[{index}]"
    if not isinstance(raw, Mapping) or raw.get("type", "function") != "function":
        raise ToolError(where, f'{where} must be a function tool: {{"type": "function", ...}}.')
    function = raw.get("function")
    if not isinstance(function, Mapping):
        raise ToolError(f"{where}.function", f"{where}.function must be an object with a name.")
    name = function.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise ToolError(f"{where}.function.name", f"{where} needs a name of 1 to 64 characters.")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, Mapping):
        raise ToolError(
            f"{where}.function.parameters", f"{where}'s parameters must be a JSON schema object."
        )
    entry = {"name": name, "parameters": dict(parameters)}
    if isinstance(function.get("description"), str):
        entry["description"] = function["description"]
    return {"type": "function", "function": entry}


def _choice(raw: Any, names: Sequence[str]) -> tuple[str, str | None]:
    if raw is None:
        return "auto", None
    if raw in ("auto", "none", "required"):
        if raw == "required" and not names:
            raise ToolError("tool_choice", '`tool_choice` "required" needs at least one tool.')
        return raw, None
    if isinstance(raw, Mapping):
        function = raw.get("function") if raw.get("type", "function") == "function" else None
        name = function.get("name") if isinstance(function, Mapping) else raw.get("name")
        if isinstance(name, str) and name in names:
            return "function", name
        raise ToolError(
            "tool_choice",
            f"`tool_choice` names the function {str(name)[:64]!r}, which is not among `tools`.",
        )
    raise ToolError(
        "tool_choice",
        '`tool_choice` must be "auto", "none", "required" or '
        '{"type": "function", "function": {"name": ...}}.',
    )


def parse_tool_calls(where: str, raw: Any) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls`; arguments may come as text or as an object."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ToolError(f"{where}.tool_calls", f"{where}.tool_calls must be a list.")
    calls = []
    for i, call in enumerate(raw):
        at = f"{where}.tool_calls[{i}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ToolError(at, f"{at} must have function.name and function.arguments.")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = call.get("id")
        calls.append(ToolCall(call_id if isinstance(call_id, str) else "", name, arguments))
    return tuple(calls)


@dataclass(frozen=True)
class ResponseFormat:
    """The reply's shape: plain text, any JSON object, JSON valid under a schema, or text a
    grammar (Lark, as the grammar library reads it) accepts."""

    kind: str = "text"  # text | json_object | json_schema | grammar
    schema: dict[str, Any] | None = None
    strict: bool = False  # objects take only the properties they list (grammar.py)
    grammar: str | None = None  # kind grammar: the Lark text


def parse_response_format(raw: Any) -> ResponseFormat:
    if raw is None:
        return ResponseFormat()
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if kind in (None, "text"):
        return ResponseFormat()
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind == "json_schema":
        spec = raw.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise ToolError(
                "response_format",
                "`response_format.json_schema.schema` must be a JSON schema object.",
            )
        return ResponseFormat("json_schema", dict(schema), spec.get("strict") is True)
    raise ToolError(
        "response_format",
        '`response_format.type` must be "text", "json_object" or "json_schema".',
    )
