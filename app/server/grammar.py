"""The grammar a chat request asks for (`response_format`, a required or named
`tool_choice`), put into its sampling: the grammar itself is the tool-call room's
(app/toolcalls/grammar.py); a schema the grammar library cannot use is refused here as a 400.
"""

from __future__ import annotations

import dataclasses

from app.engine.transcript import Tokenizer
from app.server.errors import invalid
from app.server.schema import ChatRequest, GenerationParams
from app.toolcalls.grammar import enforceable, reply_grammar
from app.toolcalls.syntax import ToolSyntax
from app.toolcalls.tools import ToolError


def constrained(chat: ChatRequest, syntax: ToolSyntax, tokenizer: Tokenizer) -> GenerationParams:
    """The request's generation params with the reply's grammar in its sampling; a schema
    the grammar library cannot use is refused in words."""
    grammar = reply_grammar(
        chat.response_format, chat.tools, syntax, lambda t: tokenizer.tokenize(t, special=True)
    )
    if grammar is None:
        return chat.params
    try:
        enforceable(grammar, "tools" if chat.tools.forced else "response_format")
    except ToolError as error:
        raise invalid(error.field, error.message) from None
    sampling = dataclasses.replace(chat.params.sampling, grammar=grammar)
    return dataclasses.replace(chat.params, sampling=sampling)
