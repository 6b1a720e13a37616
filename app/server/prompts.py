"""Chat histories to prompt tokens: the app's Transcript, with this server's replies as their
exact ids (replay.py), extended from the last request's transcript where it can be.

A stateless client sends the whole history every turn. Building the transcript afresh
renders the template once per reply in it, so a long agent conversation would cost seconds
of the event loop per request; keeping the transcript as it stood at the last assistant
message of each recent request (keyed by a running hash of the messages) means a follow-up
renders only what it adds.

Tools: a request's functions reach the model through its template's own `tools` (passed as a
template variable by the caller) or, for a template that never mentions them, as a system
block in the family's syntax (app/toolcalls/); tool results are `tool` messages for the
template; an assistant message's calls are the reply that made them (replay rule 4) or, new
to this server, the calls written in the model's own syntax. A remote engine in chat mode
gets them as OpenAI's fields instead (passthrough_variables), for its server to apply.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from app.engine.chat_template import ChatTemplate
from app.engine.protocol import ModelInfo
from app.engine.remote_wire import REQUEST_VARIABLE
from app.engine.transcript import Tokenizer, Transcript
from app.server.replay import ReplyStore, calls_key
from app.server.schema import ChatRequest, Message
from app.toolcalls.prompt import tool_prompt
from app.toolcalls.syntax import FAMILIES, ToolSyntax
from app.toolcalls.tools import Tools

MAX_CACHED = 64  # conversations whose transcript is kept


class ChatPrompts:
    def __init__(self, replies: ReplyStore, max_cached: int = MAX_CACHED) -> None:
        self.replies = replies
        self._cached: OrderedDict[bytes, Transcript] = OrderedDict()
        self._max_cached = max_cached

    def build(
        self,
        messages: Sequence[Message],
        template: ChatTemplate,
        info: ModelInfo,
        tokenizer: Tokenizer,
        syntax: ToolSyntax = FAMILIES["hermes"],
        images: Mapping[bytes, tuple[int, ...]] | None = None,
    ) -> list[int]:
        """The prompt tokens for `messages` (the last one not the assistant's); `images`:
        each image's ids (the engine's `image_run`), by the image's bytes."""
        running = hashlib.sha256(repr((template.key, info.fingerprint)).encode())
        keys = []
        for message in messages:
            running.update(message.key().encode())
            keys.append(running.copy().digest())
        start, transcript = 0, None
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].role == "assistant" and keys[i] in self._cached:
                transcript, start = self._cached[keys[i]].copy(), i + 1
                self._cached.move_to_end(keys[i])
                break
        if transcript is None:
            transcript = Transcript(
                template, tokenizer, info.fingerprint, bos_id=info.bos_id, add_bos=info.add_bos
            )
        last_reply = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        for i in range(start, len(messages)):
            message = messages[i]
            if message.role != "assistant":
                fields = (("tool_call_id", message.tool_call_id),) if message.tool_call_id else ()
                runs = tuple(images[image] for image in message.images) if images else ()
                transcript.add_message(message.role, message.text, fields, runs)
                continue
            calls = (
                calls_key(message.text, [c.canonical() for c in message.tool_calls])
                if message.tool_calls
                else None
            )
            stored = self.replies.find(
                message.text, message.reasoning, calls, prompt=transcript.prompt
            )
            if stored is not None:
                transcript.add_reply(message.text, stored.tokens, stored.fingerprint)
            elif message.tool_calls:  # the calls as this model writes them
                content, written = syntax.write(message.text, message.tool_calls)
                tokens = tokenizer.tokenize(content) + tokenizer.tokenize(written, special=True)
                transcript.add_reply(content + written, tokens, info.fingerprint)
            else:
                transcript.add_reply(message.text)
            if i == last_reply:  # where the next turn of this conversation picks up
                self._cached[keys[i]] = transcript.copy()
                while len(self._cached) > self._max_cached:
                    self._cached.popitem(last=False)
        return transcript.prompt()


def passthrough_variables(chat: ChatRequest) -> dict[str, Any]:
    """For a remote engine in chat mode (engine/remote_wire.py), whose server applies tools
    itself: the request's tools, tool choice and response format as OpenAI's fields, in the
    one template variable its wire template writes."""
    fields: dict[str, Any] = {}
    tools = chat.tools
    if tools.functions:
        fields["tools"] = [dict(t) for t in tools.functions]
        fields["tool_choice"] = (
            {"type": "function", "function": {"name": tools.name}}
            if tools.choice == "function"
            else tools.choice
        )
        fields["parallel_tool_calls"] = tools.parallel
    answer = chat.response_format
    if answer.kind == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif answer.kind == "json_schema":  # the schema's name is not kept: any name serves
        spec = {"name": "response", "schema": answer.schema, "strict": answer.strict}
        fields["response_format"] = {"type": "json_schema", "json_schema": spec}
    return {REQUEST_VARIABLE: fields or None}


def with_tools(
    messages: Sequence[Message], tools: Tools, source: str, syntax: ToolSyntax
) -> tuple[list[Message], dict[str, Any]]:
    """The messages and extra template variables that tell the model about `tools`
    (app/toolcalls/prompt.py): the block goes at the end of the first system message, or is
    one."""
    messages = list(messages)
    told = tool_prompt(tools, source, syntax)
    if told.block and messages and messages[0].role == "system":
        messages[0] = dataclasses.replace(messages[0], text=told.system(messages[0].text) or "")
    elif told.block:
        messages.insert(0, Message("system", told.block))
    return messages, dict(told.variables)
