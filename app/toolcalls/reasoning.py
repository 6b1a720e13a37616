"""A reply's reasoning and its content apart: reasoning is what a reply writes inside
`<think>...</think>` at its start (or after a generation prompt that opens the tag), content
the rest. Calls are read from the content only (calls.py), so a tool-call marker a model
writes while it reasons is never taken for a call; the API server streams the two apart.
"""

from __future__ import annotations

from app.engine.chat_template import ChatTemplate

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class ReasoningSplitter:
    """Routes a reply's text, as it streams, to reasoning (inside `<think>...</think>` at the
    start) or content. Text that may be the start of a tag is held until it is decided."""

    def __init__(self, *, opened: bool = False) -> None:
        self._state = "reasoning" if opened else "start"
        self._held = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) now safe to send."""
        self._held += text
        reasoning = content = ""
        while True:
            if self._state == "start":
                head = self._held.lstrip()
                if head.startswith(THINK_OPEN):
                    self._held, self._state = head[len(THINK_OPEN) :], "reasoning"
                    continue
                if THINK_OPEN.startswith(head):  # "", "<", "<th"...: not decided yet
                    return reasoning, content
                self._state = "content"
            elif self._state == "reasoning":
                inside, closed, after = self._held.partition(THINK_CLOSE)
                if closed:
                    reasoning += inside
                    self._held, self._state = after, "after"
                    continue
                keep = _partial_tag(self._held, THINK_CLOSE)
                reasoning += self._held[: len(self._held) - keep]
                self._held = self._held[len(self._held) - keep :]
                return reasoning, content
            elif self._state == "after":  # the whitespace between reasoning and content
                self._held = self._held.lstrip()
                if not self._held:
                    return reasoning, content
                self._state = "content"
            else:
                content += self._held
                self._held = ""
                return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What is still held once the reply has ended."""
        held, self._held = self._held, ""
        if self._state == "reasoning":
            return held, ""
        return "", "" if self._state == "after" else held


def split_reasoning(text: str, *, opened: bool = False) -> tuple[str, str]:
    """(reasoning, content) of a whole reply; the same split as streaming gives."""
    splitter = ReasoningSplitter(opened=opened)
    reasoning, content = splitter.feed(text)
    rest_reasoning, rest_content = splitter.finish()
    return reasoning + rest_reasoning, content + rest_content


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def opens_reasoning(template: ChatTemplate) -> bool:
    """Whether the template's generation prompt ends inside `<think>` (the reply then starts
    with reasoning and only closes the tag)."""
    probe = template.render([{"role": "user", "content": "x"}], add_generation_prompt=True)
    return probe.rstrip().endswith(THINK_OPEN)
