"""Each model family's tool-call syntax: how its replies write calls (parsed into OpenAI
`tool_calls`), how a call is written back into a prompt, and how the model is told about
tools when its chat template does not render `tools` itself.

Families, chosen from the chat template's text:
- hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (ChatML, Hermes,
  Qwen 2.5 and Qwen 3, and the fallback for any template without a syntax of its own);
- llama3: the reply is one JSON object `{"name": ..., "parameters": {...}}` (Llama 3.x);
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]` (Mistral, Nemo);
- deepseek: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{args}<｜tool▁call▁end｜>
  <｜tool▁calls▁end｜>` (DeepSeek V3.1; V3's `function<｜tool▁sep｜>name` with a json code
  fence is read too);
- deepseek-v3.2 and deepseek-v4: DSML invokes in a `<｜DSML｜function_calls>` (V3.2) or
  `<｜DSML｜tool_calls>` (V4) block (dsml.py), chosen by the template's text or, for a
  model whose GGUF carries no template of its own, by its architecture (`deepseek4`).

A call's arguments are the JSON text the model wrote (checked to be a JSON object), or the
object its DSML parameters spell; `partial` reads them as they stream, growing only, so what
a client assembles from the fragments is what the whole reply parses to.

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

from app.toolcalls import dsml
from app.toolcalls.json_prefix import scan
from app.toolcalls.tools import ToolCall

_DS = {
    "calls_begin": "<｜tool▁calls▁begin｜>",
    "calls_end": "<｜tool▁calls▁end｜>",
    "call_begin": "<｜tool▁call▁begin｜>",
    "call_end": "<｜tool▁call▁end｜>",
    "sep": "<｜tool▁sep｜>",
}
_PYTHON_TAG = "<|python_tag|>"


_V4_ARCHITECTURES = ("deepseek4", "deepseek_v4")
# A hermes call up to its arguments' opening brace: from here the arguments can stream.
_HERMES_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)'
)
_HERMES_TAIL = re.compile(r"\s*\}\s*</tool_call>")


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object's text, as the model wrote it where it wrote JSON


@dataclass(frozen=True)
class PartialCall:
    """A call as far as the reply has written it: `arguments` only grows as the reply does,
    and `arguments + completion` is a JSON object ("" once the call is whole)."""

    name: str
    arguments: str
    whole: bool
    completion: str


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
        if self.family in _DSML_BLOCKS:
            return dsml.render([(c.name, c.arguments) for c in calls], _DSML_BLOCKS[self.family])
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

    def write(self, content: str, calls: Sequence[ToolCall]) -> tuple[str, str]:
        """A reply with content and calls as the model writes it: (the content part, the
        calls part), tokenized apart (the calls' markers may be special tokens)."""
        if self.family in _DSML_BLOCKS:  # the calls begin with their own blank line
            return content, self.render(calls)
        return (content + "\n" if content else ""), self.render(calls)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        """(content, calls) of a whole reply; no calls when the syntax does not parse."""
        if self.family == "llama3":
            return _parse_llama3(text)
        at = text.find(self.start)
        if at < 0:
            return text, []
        content, rest = text[:at].rstrip(), text[at:]
        if self.family in _DSML_BLOCKS:
            calls = [ParsedCall(*c) for c in dsml.parse(rest, _DSML_BLOCKS[self.family])]
        else:
            calls = {
                "mistral": _parse_mistral,
                "deepseek": _parse_deepseek,
            }.get(self.family, _parse_hermes)(rest)
        return (content, calls) if calls else (text, [])

    def partial(self, text: str) -> list[PartialCall]:
        """The calls of `text` (from `start` on) as far as they are written, for the
        families whose arguments can stream (hermes, deepseek, DSML); [] for the others."""
        if self.family in _DSML_BLOCKS:
            return [PartialCall(*c) for c in dsml.partial(text, _DSML_BLOCKS[self.family])]
        if self.family == "deepseek":
            return _partial_deepseek(text)
        if self.family == "hermes":
            return _partial_hermes(text)
        return []

    def instructions(self, functions: Sequence[dict[str, Any]]) -> str:
        """The system block that tells a model without a tools template what it may call."""
        if self.family in _DSML_BLOCKS:
            return dsml.instructions(functions, _DSML_BLOCKS[self.family])
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


_DSML_BLOCKS = {"deepseek-v3.2": "function_calls", "deepseek-v4": "tool_calls"}
FAMILIES = {
    "hermes": ToolSyntax("hermes", "<tool_call>"),
    "llama3": ToolSyntax("llama3", ""),
    "mistral": ToolSyntax("mistral", "[TOOL_CALLS]"),
    "deepseek": ToolSyntax("deepseek", _DS["calls_begin"]),
    **{family: ToolSyntax(family, dsml.start(b)) for family, b in _DSML_BLOCKS.items()},
}


def syntax_for(template_source: str, architecture: str = "") -> ToolSyntax:
    """The family a chat template's text belongs to; for a template that names none, the
    model architecture's (GGUF `general.architecture`), else hermes."""
    if dsml.DSML in template_source:  # V3.2 names its block, V4's is "tool_calls"
        return FAMILIES["deepseek-v3.2" if "function_calls" in template_source else "deepseek-v4"]
    if _DS["calls_begin"] in template_source:
        return FAMILIES["deepseek"]
    if "[TOOL_CALLS]" in template_source:
        return FAMILIES["mistral"]
    if "<|start_header_id|>" in template_source and '"parameters": ' in template_source:
        return FAMILIES["llama3"]
    if architecture in _V4_ARCHITECTURES:
        return FAMILIES["deepseek-v4"]
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


def _raw(call: ParsedCall, text: str, at: int) -> ParsedCall:
    """The call with its arguments as written at `at` in `text`, when they are JSON there."""
    end = scan(text, at).end
    if end is not None and json.loads(text[at:end]) == json.loads(call.arguments):
        return ParsedCall(call.name, text[at:end])
    return call


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
        head = _HERMES_HEAD.match(block)
        calls.append(_raw(call, block, head.end()) if head else call)
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
        calls.append(_raw(call, args, len(args) - len(args.lstrip())))
    return calls


def _partial_hermes(text: str) -> list[PartialCall]:
    """`<tool_call>` blocks whose name comes first, each streamed from its arguments' `{`."""
    out: list[PartialCall] = []
    pos = 0
    while (at := text.find("<tool_call>", pos)) >= 0 and not text[pos:at].strip():
        head = _HERMES_HEAD.match(text, at + len("<tool_call>"))
        if head is None:
            break
        value = scan(text, head.end())
        name = json.loads(head.group(1))
        if value.end is None:
            out.append(PartialCall(name, text[head.end() : value.safe], False, value.completion))
            break
        out.append(PartialCall(name, text[head.end() : value.end], True, ""))
        tail = _HERMES_TAIL.match(text, value.end)
        if tail is None:
            break
        pos = tail.end()
    return out


def _partial_deepseek(text: str) -> list[PartialCall]:
    """V3.1 calls (`name<｜tool▁sep｜>{...}`), each streamed from its arguments' `{`."""
    out: list[PartialCall] = []
    pos = len(_DS["calls_begin"])
    while text.startswith(_DS["call_begin"], pos):
        name, sep, _ = text[pos + len(_DS["call_begin"]) :].partition(_DS["sep"])
        if not sep or name.strip() in ("", "function") or "<｜" in name:
            break
        at = pos + len(_DS["call_begin"]) + len(name) + len(sep)
        at += len(text[at:]) - len(text[at:].lstrip())
        if not text.startswith("{", at):
            break
        value = scan(text, at)
        if value.end is None:
            out.append(PartialCall(name.strip(), text[at : value.safe], False, value.completion))
            break
        out.append(PartialCall(name.strip(), text[at : value.end], True, ""))
        rest = text[value.end :].lstrip()
        if not rest.startswith(_DS["call_end"]):
            break
        pos = len(text) - len(rest) + len(_DS["call_end"])
    return out
