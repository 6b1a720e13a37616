"""Each model family's tool-call syntax: how its replies write calls (parsed into OpenAI
`tool_calls`), how a call is written back into a prompt, and how the model is told about
tools when its chat template does not render `tools` itself.

Families, chosen from the chat template's text:
- hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (ChatML, Hermes,
  Qwen 2.5 and Qwen 3, and the fallback for any template without a syntax of its own);
- llama3: the reply is one JSON object `{"name": ..., "parameters": {...}}` (Llama 3.x);
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]` (Mistral, Nemo);
- deepseek: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{args}<｜tool▁call▁end｜>
  <｜tool▁calls▁end｜>` (DeepSeek V3.1 and later; V3's `function<｜tool▁sep｜>name` with a
  json code fence is read too).

The fallback (a template that never mentions `tools`, such as the default model's ChatML) is
a system block that lists the functions as JSON and shows the family's syntax; it is put at
the end of the first system message (or is the system message). Text that does not parse
as the family's calls stays the reply's content: a malformed call is never lost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.server.tools import ToolCall

_DS = {
    "calls_begin": "<｜tool▁calls▁begin｜>",
    "calls_end": "<｜tool▁calls▁end｜>",
    "call_begin": "<｜tool▁call▁begin｜>",
    "call_end": "<｜tool▁call▁end｜>",
    "sep": "<｜tool▁sep｜>",
}
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as compact as json.dumps writes it


@dataclass(frozen=True)
class ToolSyntax:
    """One family's syntax. `start` opens the calls in a reply ("": the reply is the call)."""

    family: str
    start: str

    def render(self, calls: Sequence[ToolCall]) -> str:
        """The reply text that makes these calls, as the model writes them."""
        if self.family == "llama3":
            return "; ".join(
                f'{{"name": {json.dumps(c.name)}, "parameters": {_compact(c.arguments)}}}'
                for c in calls
            )
        if self.family == "mistral":
            entries = [
                f'{{"name": {json.dumps(c.name)}, "arguments": {_compact(c.arguments)}, '
                f'"id": {json.dumps(c.id)}}}'
                for c in calls
            ]
            return "[TOOL_CALLS][" + ", ".join(entries) + "]"
        if self.family == "deepseek":
            inner = "".join(
                f"{_DS['call_begin']}{c.name}{_DS['sep']}{_compact(c.arguments)}{_DS['call_end']}"
                for c in calls
            )
            return _DS["calls_begin"] + inner + _DS["calls_end"]
        return "\n".join(
            f'<tool_call>\n{{"name": {json.dumps(c.name)}, "arguments": '
            f"{_compact(c.arguments)}}}\n</tool_call>"
            for c in calls
        )

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        """(content, calls) of a whole reply; no calls when the syntax does not parse."""
        if self.family == "llama3":
            return _parse_llama3(text)
        at = text.find(self.start)
        if at < 0:
            return text, []
        content, rest = text[:at].rstrip(), text[at:]
        calls = {
            "mistral": _parse_mistral,
            "deepseek": _parse_deepseek,
        }.get(self.family, _parse_hermes)(rest)
        return (content, calls) if calls else (text, [])

    def instructions(self, functions: Sequence[dict[str, Any]]) -> str:
        """The system block that tells a model without a tools template what it may call."""
        listed = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
        example = self.render([ToolCall("call0abcd", "<function-name>", '"<args-json-object>"')])
        example = example.replace('"<function-name>"', "<function-name>").replace(
            '"<args-json-object>"', "<args-json-object>"
        )
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            "To call a function, reply with a JSON object of its name and arguments, "
            f"written like this:\n{example}"
        )


FAMILIES = {
    "hermes": ToolSyntax("hermes", "<tool_call>"),
    "llama3": ToolSyntax("llama3", ""),
    "mistral": ToolSyntax("mistral", "[TOOL_CALLS]"),
    "deepseek": ToolSyntax("deepseek", _DS["calls_begin"]),
}


def syntax_for(template_source: str) -> ToolSyntax:
    """The family a chat template's text belongs to (hermes when it names none)."""
    if _DS["calls_begin"] in template_source:
        return FAMILIES["deepseek"]
    if "[TOOL_CALLS]" in template_source:
        return FAMILIES["mistral"]
    if "<|start_header_id|>" in template_source and '"parameters": ' in template_source:
        return FAMILIES["llama3"]
    return FAMILIES["hermes"]


def renders_tools(template_source: str) -> bool:
    """Whether the template itself writes the `tools` it is given into the prompt."""
    return re.search(r"\btools\b", template_source) is not None and (
        "for tool in tools" in template_source or "tools|" in template_source.replace(" ", "")
    )


def _compact(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except json.JSONDecodeError:
        return json.dumps(arguments)


def _call(obj: Any, *, args_key: str = "arguments") -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _parse_hermes(text: str) -> list[ParsedCall]:
    calls = []
    blocks = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text, flags=re.DOTALL)
    for block in blocks:
        try:
            call = _call(json.loads(block.strip()))
        except json.JSONDecodeError:
            return []
        if call is None:
            return []
        calls.append(call)
    rest = re.sub(r"<tool_call>.*?(?:</tool_call>|$)", "", text, flags=re.DOTALL)
    return calls if not rest.strip() else []


def _parse_llama3(text: str) -> tuple[str, list[ParsedCall]]:
    """The whole reply is one call, or several joined by "; "."""
    body = text.strip().removeprefix(_PYTHON_TAG).strip()
    if not body.startswith("{"):
        return text, []
    decoder, pos, calls = json.JSONDecoder(), 0, []
    while pos < len(body):
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return text, []
        call = _call(obj, args_key="parameters")
        if call is None:
            return text, []
        calls.append(call)
        rest = body[pos:].lstrip().removeprefix(";").lstrip()
        pos = len(body) - len(rest)
    return "", calls


def _parse_mistral(text: str) -> list[ParsedCall]:
    try:
        entries = json.loads(text.removeprefix("[TOOL_CALLS]").strip())
    except json.JSONDecodeError:
        return []
    if isinstance(entries, dict):
        entries = [entries]
    calls = [_call(e) for e in entries] if isinstance(entries, list) else [None]
    return [c for c in calls if c is not None] if all(calls) else []


def _parse_deepseek(text: str) -> list[ParsedCall]:
    body = text.removeprefix(_DS["calls_begin"])
    body = body.split(_DS["calls_end"], 1)[0]
    calls = []
    for chunk in body.split(_DS["call_begin"])[1:]:
        inner = chunk.split(_DS["call_end"], 1)[0]
        name, sep, args = inner.partition(_DS["sep"])
        if not sep:
            return []
        if name.strip() == "function":  # V3: function<sep>name\n```json\n{...}\n```
            name, _, args = args.partition("\n")
            args = args.strip().removeprefix("```json").removesuffix("```")
        try:
            call = _call({"name": name.strip(), "arguments": json.loads(args)})
        except json.JSONDecodeError:
            return []
        if call is None:
            return []
        calls.append(call)
    return calls
