"""A reply's tool calls as the client gets them, streamed as `delta.tool_calls` chunks: parsed
from the model's own syntax and given ids as app/toolcalls/ reads every reply's calls.

Streaming sends content as it comes until the family's opening marker (or what may be its
start) appears; from there the text is held (and the blank before the marker is dropped, as
the whole reply's parse drops it). For the families whose calls can be read as
they are written (hermes, deepseek, DSML: `ToolSyntax.partial`), a call is sent once its
name is known and is one of the offered functions: a first delta with its index, id, type,
name and the arguments so far, then the arguments as they grow, as OpenAI streams them.
Nothing sent is taken back: the arguments only grow, and at the end the whole reply's parse
must extend what was sent (then its rest is sent); if it does not (the reply was cut, or
broke off into something that is not a call), each call sent is closed into a JSON object
with what it lacks, and those are the reply's calls. Calls that were never sent go out
whole at the end, and held text that is no call at all goes out as content. A family whose
calls are the whole reply (llama3) holds a reply that begins with `{` the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.toolcalls.calls import with_ids
from app.toolcalls.syntax import ToolSyntax
from app.toolcalls.tools import ToolCall, Tools, new_call_id

_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class CallDelta:
    """One entry of a chunk's `delta.tool_calls`: a call's first carries its id and name."""

    index: int
    id: str | None
    name: str | None
    arguments: str

    def openai(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            entry.update(id=self.id, type="function")
            function["name"] = self.name
        entry["function"] = function
        return entry


@dataclass
class _Sent:
    """A call the client has been sent: its id, name and the arguments so far."""

    id: str
    name: str
    arguments: str


@dataclass
class ToolStream:
    """Content that is safe to stream now, the held rest that may be tool calls, and (given
    the request's `tools`) the calls' deltas as they are written."""

    syntax: ToolSyntax
    tools: Tools | None = None  # None: calls are not streamed, only held
    _held: str = ""
    _holding: bool = False  # the calls may have begun: hold everything to the end
    _plain: bool = False  # decided: this reply is text only (the llama3 family)
    _content: str = ""  # the content handed out
    _sent: list[_Sent] = field(default_factory=list)
    _deltas: list[CallDelta] = field(default_factory=list)
    _stopped: bool = False  # a call that may not be streamed: the rest waits for the end
    _blank: str = ""  # the blank between the content and the calls' marker, held

    def feed(self, text: str) -> str:
        """Take reply text; returns the content now safe to send (`deltas()` the calls')."""
        out = self._feed(text)
        self._content += out
        return out

    def deltas(self) -> list[CallDelta]:
        """The call deltas written since the last call."""
        out, self._deltas = self._deltas, []
        return out

    def close(self) -> tuple[str, list[CallDelta], str, list[ToolCall]]:
        """At the reply's end: (content still to send, the last call deltas, all the content
        the client got, the reply's calls as the client has assembled them)."""
        assert self.tools is not None
        rest, held = self.finish()
        self._content += rest
        _, parsed = self.syntax.parse(held) if held else ("", [])
        wanted = with_ids(self.syntax, parsed, self.tools) if parsed else []
        sent = self._sent
        agrees = len(wanted) >= len(sent) and all(
            w.name == s.name and w.arguments.startswith(s.arguments)
            for w, s in zip(wanted, sent, strict=False)
        )
        if not sent and not wanted:  # no call after all: the held text is content
            self._content += held
            return rest + held, self.deltas(), self._content, []
        calls: list[ToolCall] = []
        if agrees:
            for i, w in enumerate(wanted):
                if i < len(sent):
                    extra, call_id = w.arguments[len(sent[i].arguments) :], sent[i].id
                    if extra:
                        self._deltas.append(CallDelta(i, None, None, extra))
                else:
                    call_id = w.id
                    self._deltas.append(CallDelta(i, w.id, w.name, w.arguments))
                calls.append(ToolCall(call_id, w.name, w.arguments))
        else:  # what was sent stands; each call is closed into a JSON object
            partial = self.syntax.partial(held.lstrip())
            for i, s in enumerate(sent):
                completion = partial[i].completion if i < len(partial) else "}"
                if completion:
                    self._deltas.append(CallDelta(i, None, None, completion))
                calls.append(ToolCall(s.id, s.name, s.arguments + completion))
        return rest, self.deltas(), self._content, calls

    def _feed(self, text: str) -> str:
        self._held += text
        if self._holding:
            self._advance()
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
        if at >= 0:  # the content ends here, less the blank it left before the calls
            self._holding = True
            out = self._take(at)
            content = out.rstrip()
            self._blank = out[len(content) :]
            self._advance()
            return content
        ready = self._held[: len(self._held) - _partial(self._held, self.syntax.start)]
        return self._take(len(ready.rstrip()))  # trailing blanks wait: calls may follow

    def _advance(self) -> None:
        """Send what the held calls have grown by; a new call once its name is known."""
        if self.tools is None or self._stopped:
            return
        for i, call in enumerate(self.syntax.partial(self._held)):
            if i < len(self._sent):
                sent = self._sent[i]
                if not call.arguments.startswith(sent.arguments):  # cannot happen: stop
                    self._stopped = True
                    return
                if len(call.arguments) > len(sent.arguments):
                    extra = call.arguments[len(sent.arguments) :]
                    self._deltas.append(CallDelta(i, None, None, extra))
                    sent.arguments = call.arguments
                continue
            if call.name not in self.tools.names or (i > 0 and not self.tools.parallel):
                self._stopped = True
                return
            sent = _Sent(new_call_id(), call.name, call.arguments)
            self._sent.append(sent)
            self._deltas.append(CallDelta(i, sent.id, sent.name, sent.arguments))

    def finish(self) -> tuple[str, str]:
        """(content still to send, text held as possible calls, with the blank before it)."""
        held, self._held = self._blank + self._held, ""
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
