"""A reply's tool calls as the client gets them: parsed from the model's own syntax
(tool_templates.py), given ids, and streamed as `delta.tool_calls` chunks.

Streaming sends content as it comes until the family's opening marker (or what may be its
start) appears; from there the text is held, and at the end it becomes `tool_calls` chunks
(each call's id, name and full arguments in one chunk, as OpenAI's clients accept), or, when
it does not parse as calls, content after all. A family whose calls are the whole reply
(llama3) holds a reply that begins with `{` the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.server.tool_templates import ParsedCall, ToolSyntax
from app.server.tools import ToolCall, Tools, new_call_id

_PYTHON_TAG = "<|python_tag|>"


def with_ids(syntax: ToolSyntax, parsed: list[ParsedCall], tools: Tools) -> list[ToolCall]:
    """Calls to functions the request offers, each with a fresh id (Mistral's templates take
    only 9 letters and digits); one call only when parallel calls are off."""
    offered = set(tools.names)
    calls = [
        ToolCall(
            new_call_id(9, prefix="") if syntax.family == "mistral" else new_call_id(),
            call.name,
            call.arguments,
        )
        for call in parsed
        if call.name in offered
    ]
    return calls[:1] if not tools.parallel else calls


def reply_calls(tools: Tools, syntax: ToolSyntax, content: str) -> tuple[str, list[ToolCall]]:
    """A finished reply's (content, calls) when the request offered tools."""
    if not tools.active:
        return content, []
    rest, parsed = syntax.parse(content)
    calls = with_ids(syntax, parsed, tools)
    return (rest, calls) if calls else (content, [])


@dataclass
class ToolStream:
    """Content that is safe to stream now, and the held rest that may be tool calls."""

    syntax: ToolSyntax
    _held: str = ""
    _holding: bool = False  # the calls may have begun: hold everything to the end
    _plain: bool = False  # decided: this reply is text only (the llama3 family)

    def feed(self, text: str) -> str:
        self._held += text
        if self._holding:
            return ""
        if self._plain:
            return self._take(len(self._held))
        if not self.syntax.start:  # the whole reply is the call: decide on its first text
            head = self._held.lstrip()
            if head.startswith(("{", _PYTHON_TAG)):
                self._holding = True
                return ""
            if not head or _PYTHON_TAG.startswith(head):
                return ""
            self._plain = True
            return self._take(len(self._held))
        at = self._held.find(self.syntax.start)
        if at >= 0:
            self._holding = True
            return self._take(at)
        return self._take(len(self._held) - _partial(self._held, self.syntax.start))

    def finish(self) -> tuple[str, str]:
        """(content still to send, text held as possible calls)."""
        held, self._held = self._held, ""
        return ("", held) if self._holding else (held, "")

    def _take(self, n: int) -> str:
        out, self._held = self._held[:n], self._held[n:]
        return out


def _partial(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
