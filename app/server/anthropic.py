"""Anthropic's Messages API over the same engine, prompts and replay as the OpenAI routes:
POST /v1/messages (streamed or not) and POST /v1/messages/count_tokens, so a client
configured with a base URL and key (as Claude Code-style tools are) works unchanged.

A request is translated into the OpenAI chat request it means (system, `text` blocks,
`tool_use` as tool_calls, `tool_result` as tool messages, `thinking` as the reply's
reasoning; `tools` with `input_schema`, `tool_choice` auto/any/tool/none,
`disable_parallel_tool_use`, `stop_sequences`, `thinking` enabled/disabled as the template's
`enable_thinking`) and runs as one: the same template, the same
exact-reply replay (a `tool_use` block sent back with its input re-serialized still reuses
the KV), the same grammar for `any`/`tool` choices. The reply comes back as content blocks
(thinking, text, tool_use) with `stop_reason` end_turn, max_tokens, stop_sequence or
tool_use, and `usage.cache_read_input_tokens` = the prompt tokens whose KV was reused
(`input_tokens` counts only the rest, as Anthropic's do). Streaming sends Anthropic's event
sequence: message_start, content_block_start / content_block_delta (text_delta,
thinking_delta, input_json_delta) / content_block_stop per block, message_delta, message_stop;
a tool call's input streams as the model writes it (tool_replies.ToolStream), its block
opened once the function's name is known.

Errors on these routes come in Anthropic's shape (errors.py): `{"type": "error", "error":
{"type": "invalid_request_error" | "authentication_error" | ..., "message": ...}}` with the
status its SDKs map to their exception classes; once a stream has begun, as an `error` event.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from app.engine.protocol import EngineError
from app.engine.transcript import IMAGE_MARK
from app.server.errors import ApiError, Shape, invalid
from app.server.http import engine_error
from app.server.replies import Reply, finish_reason
from app.server.requests import Job, RequestCore
from app.server.schema import parse_chat
from app.server.tool_replies import CallDelta, ToolStream
from app.toolcalls.reasoning import ReasoningSplitter
from app.toolcalls.tools import ToolCall

_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_ROUTES = ("/messages", "/messages/count_tokens")


def error_shape(path: str) -> Shape:
    """Anthropic's error shape on its routes (with or without /v1), OpenAI's elsewhere."""
    return "anthropic" if path.removeprefix("/v1").rstrip("/") in _ROUTES else "openai"


def to_chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI chat request an Anthropic Messages request means."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, list):
        system = "\n".join(_text_of("system", system))
    if system:
        messages.append({"role": "system", "content": system})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise invalid("messages", "`messages` must be a non-empty list of messages.")
    for i, message in enumerate(raw):
        messages.extend(_message(i, message))
    if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
        raise invalid("max_tokens", "`max_tokens` is required: the longest reply, in tokens.")
    chat: dict[str, Any] = {
        "model": body.get("model"),
        "messages": messages,
        "max_tokens": body["max_tokens"],
        "stream": body.get("stream", False),
    }
    for name in ("temperature", "top_p", "top_k", "metadata"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    thinking = body.get("thinking")
    if thinking is not None:  # templates that read it switch their reasoning on or off
        kind = thinking.get("type") if isinstance(thinking, Mapping) else None
        if kind not in ("enabled", "disabled"):
            raise invalid("thinking", '`thinking.type` must be "enabled" or "disabled".')
        chat["chat_template_kwargs"] = {"enable_thinking": kind == "enabled"}
    if body.get("tools") is not None:
        chat["tools"] = [_tool(i, t) for i, t in enumerate(_list("tools", body["tools"]))]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        kind = choice.get("type")
        if kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif kind in _CHOICES:
            chat["tool_choice"] = _CHOICES[kind]
        else:
            raise invalid("tool_choice", "`tool_choice.type` must be auto, any, tool or none.")
        if choice.get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    return chat


def _list(where: str, raw: Any) -> list:
    if not isinstance(raw, list):
        raise invalid(where, f"`{where}` must be a list.")
    return raw


def _text_of(where: str, blocks: list) -> list[str]:
    texts = []
    for block in blocks:
        if not isinstance(block, Mapping) or block.get("type") != "text":
            raise invalid(where, f"{where} takes text blocks only.")
        texts.append(str(block.get("text", "")))
    return texts


def _image_url(where: str, source: Any) -> str:
    """An image block's source as a data URL (base64 sources; Stoke fetches no URL)."""
    if not isinstance(source, Mapping) or source.get("type") != "base64":
        raise invalid(
            f"{where}.source",
            f"{where} must carry its image as a base64 source; this server fetches nothing.",
        )
    media = str(source.get("media_type", "image/png"))
    return f"data:{media};base64,{source.get('data', '')}"


def _message(index: int, raw: Any) -> list[dict[str, Any]]:
    where = f"messages[{index}]"
    role = raw.get("role") if isinstance(raw, Mapping) else None
    if role not in ("user", "assistant"):
        raise invalid(f"{where}.role", f"{where} must have role user or assistant.")
    content = raw.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    texts, thinking, calls, results = [], [], [], []
    images: list[tuple[int, str]] = []  # (where among texts, its data URL)
    for j, block in enumerate(_list(f"{where}.content", content)):
        kind = block.get("type") if isinstance(block, Mapping) else None
        at = f"{where}.content[{j}]"
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "image" and role == "user":
            images.append((len(texts), _image_url(at, block.get("source"))))
            texts.append(IMAGE_MARK)
        elif kind == "thinking" and role == "assistant":
            thinking.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use" and role == "assistant":
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
        elif kind == "tool_result" and role == "user":
            inner = block.get("content", "")
            text = inner if isinstance(inner, str) else "\n".join(_text_of(at, _list(at, inner)))
            results.append(
                {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": text}
            )
        else:
            raise invalid(
                at,
                f"{at} is a {kind!r} block; Stoke takes text, image, thinking, tool_use "
                "and tool_result blocks.",
            )
    if role == "user" and images:
        urls = dict(images)
        parts = [
            {"type": "image_url", "image_url": {"url": urls[i]}}
            if i in urls
            else {"type": "text", "text": text}
            for i, text in enumerate(texts)
        ]
        return [*results, {"role": "user", "content": parts}]
    if role == "user":
        return results + ([{"role": "user", "content": "\n".join(texts)}] if texts else [])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    return [message]


def _tool(index: int, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        raise invalid(f"tools[{index}]", f"tools[{index}] needs a name and an input_schema.")
    function = {"name": raw["name"], "parameters": raw.get("input_schema") or {"type": "object"}}
    if isinstance(raw.get("description"), str):
        function["description"] = raw["description"]
    return {"type": "function", "function": function}


def _usage(reply: Reply, n_prompt: int) -> dict[str, int]:
    stats = reply.stats
    prompt = stats.prompt_tokens if stats else n_prompt
    cached = stats.reused_tokens if stats else 0
    return {
        "input_tokens": prompt - cached,
        "output_tokens": len(reply.tokens),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def _stop_reason(reply: Reply, calls: list[ToolCall]) -> str:
    if calls:
        return "tool_use"
    if reply.stopped:
        return "stop_sequence"
    return "max_tokens" if finish_reason(reply) == "length" else "end_turn"


class AnthropicApi:
    """The routes, over the server's request core (requests.py)."""

    def __init__(self, core: RequestCore) -> None:
        self.core = core

    def add_routes(self, app: web.Application) -> None:
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/messages", self.create)
            app.router.add_post(f"{prefix}/messages/count_tokens", self.count_tokens)

    async def create(self, request: web.Request) -> web.StreamResponse:
        chat = parse_chat(to_chat_body(await self.core.body(request)))
        job, info = await self.core.chat_job(chat)
        respond = self._stream if chat.params.stream else self._whole
        return await self.core.generate(request, job, info, respond)

    async def count_tokens(self, request: web.Request) -> web.Response:
        body = dict(await self.core.body(request))
        body.setdefault("max_tokens", 1)
        job, _ = await self.core.chat_job(parse_chat(to_chat_body(body)))
        return web.json_response({"input_tokens": len(job.prompt)})

    def _message(self, job: Job) -> dict[str, Any]:
        return {
            "id": "msg_" + job.id,
            "type": "message",
            "role": "assistant",
            "model": self.core.model_id,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
        }

    async def _whole(
        self, request: web.Request, job: Job, slot: str, held: list[int]
    ) -> web.Response:
        reply = Reply(job.params.stop)
        async with contextlib.aclosing(self.core.run(job, slot, held, reply)) as events:
            async for _ in events:
                pass
        reasoning, content, calls = self.core.finish_reply(job, reply)
        blocks: list[dict[str, Any]] = []
        if reasoning:
            blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if content or not calls:  # a reply with no words and no call is one empty text block
            blocks.append({"type": "text", "text": content})
        blocks += [_tool_use(call) for call in calls]
        message = self._message(job)
        message.update(
            content=blocks,
            stop_reason=_stop_reason(reply, calls),
            stop_sequence=reply.matched,
            usage=_usage(reply, len(job.prompt)),
        )
        return web.json_response(message)

    async def _stream(
        self, request: web.Request, job: Job, slot: str, held: list[int]
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        blocks = _Blocks(response)
        splitter = ReasoningSplitter(opened=job.reasoning_opened)
        calls_text = ToolStream(job.syntax, job.tools) if job.tools.active else None
        reply = Reply(job.params.stop)

        async def add(reasoning: str, text: str) -> None:
            await blocks.add(reasoning, calls_text.feed(text) if calls_text else text)
            if calls_text is not None:
                await blocks.tool_use(calls_text.deltas())

        try:
            start = self._message(job)
            start["usage"] = {"input_tokens": len(job.prompt), "output_tokens": 0}
            await blocks.event("message_start", {"message": start})
            async with contextlib.aclosing(self.core.run(job, slot, held, reply)) as events:
                async for piece, _ in events:
                    await add(*splitter.feed(piece))
            await add(*splitter.finish())
            streamed = None
            if calls_text is not None:
                text, deltas, content, calls = calls_text.close()
                await blocks.add("", text)
                await blocks.tool_use(deltas)
                streamed = (content, calls)
            _, _, calls = self.core.finish_reply(job, reply, streamed)
            await blocks.close()
            delta = {"stop_reason": _stop_reason(reply, calls), "stop_sequence": reply.matched}
            await blocks.event(
                "message_delta", {"delta": delta, "usage": _usage(reply, len(job.prompt))}
            )
            await blocks.event("message_stop", {})
        except ConnectionResetError:
            self.core.client_left(job)
        except (ApiError, EngineError) as exc:
            error = exc if isinstance(exc, ApiError) else engine_error(exc)
            self.core.stats.rejected += 1
            with contextlib.suppress(ConnectionResetError):
                await blocks.event("error", error.body("anthropic"))
        return response


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": json.loads(call.arguments),
    }


class _Blocks:
    """The content blocks of a streamed reply: one open at a time, each started, fed with
    deltas and stopped in order."""

    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response
        self._index = -1
        self._open: str | None = None  # "thinking" | "text" | "tool_use"

    async def event(self, kind: str, data: dict[str, Any]) -> None:
        payload = json.dumps({"type": kind, **data}, ensure_ascii=False)
        await self._response.write(f"event: {kind}\ndata: {payload}\n\n".encode())

    async def add(self, reasoning: str, text: str) -> None:
        if reasoning:
            await self._delta("thinking", {"type": "thinking_delta", "thinking": reasoning})
        if text:
            await self._delta("text", {"type": "text_delta", "text": text})

    async def _delta(self, kind: str, delta: dict[str, Any]) -> None:
        if self._open != kind:
            await self.close()
            self._index += 1
            self._open = kind
            block = {"type": kind, kind: ""} if kind == "thinking" else {"type": "text", "text": ""}
            if kind == "thinking":
                block["signature"] = ""
            await self.event("content_block_start", {"index": self._index, "content_block": block})
        await self.event("content_block_delta", {"index": self._index, "delta": delta})

    async def close(self) -> None:
        if self._open is not None:
            await self.event("content_block_stop", {"index": self._index})
            self._open = None

    async def tool_use(self, deltas: list[CallDelta]) -> None:
        """Tool calls as they stream: a call's first delta opens its block."""
        for delta in deltas:
            if delta.id is not None:
                await self.close()
                self._index += 1
                self._open = "tool_use"
                block = {"type": "tool_use", "id": delta.id, "name": delta.name, "input": {}}
                await self.event(
                    "content_block_start", {"index": self._index, "content_block": block}
                )
            if delta.arguments:
                data = {"type": "input_json_delta", "partial_json": delta.arguments}
                await self.event("content_block_delta", {"index": self._index, "delta": data})
