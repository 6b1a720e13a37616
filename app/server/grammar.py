"""The grammar a request asks for (its reply's shape under any field name constraints.py
reads, or a required or named `tool_choice`), put into its sampling: the grammar itself is
the tool-call room's (app/toolcalls/grammar.py); one the grammar library cannot use is
refused here as a 400 naming the field.
"""

from __future__ import annotations

import dataclasses

from app.engine.transcript import Tokenizer
from app.server.errors import invalid
from app.server.schema import ChatRequest, CompletionRequest, GenerationParams
from app.toolcalls.grammar import enforceable, format_grammar, reply_grammar
from app.toolcalls.syntax import ToolSyntax
from app.toolcalls.tools import ResponseFormat, ToolError


def constrained(chat: ChatRequest, syntax: ToolSyntax, tokenizer: Tokenizer) -> GenerationParams:
    """The request's generation params with the reply's grammar in its sampling; a schema
    the grammar library cannot use is refused in words."""
    grammar = reply_grammar(
        chat.response_format, chat.tools, syntax, lambda t: tokenizer.tokenize(t, special=True)
    )
    if grammar is None:
        return chat.params
    if chat.tools.forced:
        return _with(chat.params, grammar, "tools", "JSON schema")
    return _with(chat.params, grammar, chat.shaped_by, _what(chat.response_format))


def shaped(completion: CompletionRequest) -> GenerationParams:
    """A completion's generation params with the grammar its constraint field asks for."""
    fmt = completion.response_format
    grammar = format_grammar(fmt)
    if grammar is None:
        return completion.params
    return _with(completion.params, grammar, completion.shaped_by, _what(fmt))


def _what(fmt: ResponseFormat) -> str:
    return "grammar" if fmt.kind == "grammar" else "JSON schema"


def _with(params: GenerationParams, grammar: str, field: str, what: str) -> GenerationParams:
    try:
        enforceable(grammar, field, what)
    except ToolError as error:
        raise invalid(error.field, error.message) from None
    sampling = dataclasses.replace(params.sampling, grammar=grammar)
    return dataclasses.replace(params, sampling=sampling)
