"""How a model is told about tools: through its chat template's own `tools` variable where the
template renders them, else as the family's system block (syntax.py's `instructions`) at the
end of the system message, or as the system message when there is none. The API server
applies it to a request's messages, the chat's tool loop to a conversation's system prompt:
the same tools give the same prompt either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.toolcalls.syntax import ToolSyntax, renders_tools
from app.toolcalls.tools import Tools


@dataclass(frozen=True)
class ToolPrompt:
    """What the prompt gains from tools: template variables, or a system block (or neither,
    when no tools are active)."""

    variables: Mapping[str, Any] = field(default_factory=dict)  # {"tools": [...]} or {}
    block: str = ""  # the family's system block, for a template that does not render tools

    def system(self, prompt: str | None) -> str | None:
        """The system message with the block at its end: the block alone when there is none."""
        if not self.block:
            return prompt
        return f"{prompt or ''}\n\n{self.block}".lstrip()


def tool_prompt(tools: Tools, template_source: str, syntax: ToolSyntax) -> ToolPrompt:
    """How `tools` reach a model whose chat template is `template_source`."""
    if not tools.active:
        return ToolPrompt()
    functions = [dict(t) for t in tools.functions]
    if renders_tools(template_source):
        return ToolPrompt(variables={"tools": functions})
    return ToolPrompt(block=syntax.instructions([f["function"] for f in functions]))
