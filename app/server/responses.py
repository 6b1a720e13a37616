"""OpenAI's Responses API over the same engine, prompts and replay as the chat route:
POST /v1/responses (streamed or not) with `input` (text, or message, function_call and
function_call_output items), `instructions`, function tools, `tool_choice`,
`max_output_tokens`, and `previous_response_id`.

A response's conversation (its input items after the previous one's, and its own output) is
kept in memory under its id, so `previous_response_id` continues it without the client
sending it again. The continued history is built from the same messages, the reply included
as the calls and text this server produced, so the transcript reuses the exact sampled ids
(replay) and the engine prefills only the new input. `instructions` are not carried over
from a previous response, as OpenAI's are not; send them each turn to keep the prefix.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from app.engine.protocol import EngineError
from app.server.errors import ApiError, invalid
from app.server.http import engine_error
from app.server.replies import Reply, finish_reason, usage
from app.server.requests import Job, RequestCore
from app.server.schema import parse_chat
from app.server.tool_replies import ToolStream
from app.toolcalls.reasoning import ReasoningSplitter
from app.toolcalls.tools import ToolCall

MAX_STORED = 1024  # conversations previous_response_id can continue


def _items(raw: Any) -> list[dict[str, Any]]:
    """`input` as chat messages."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise invalid("input", "`input` must be text or a non-empty list of items.")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, Mapping) else None
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _text(where, item)})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id", "")),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            messages.append(
                {"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text}
            )
        else:
            raise invalid(
                where,
                f"{where} is a {kind!r} item; Stoke takes message, function_call and "
                "function_call_output items.",
            )
    return messages


def _text(where: str, item: Mapping[str, Any]) -> str | list[dict[str, Any]]:
    """A message item's content as chat completions take it: text, or text and image_url
    parts when it holds an `input_image`."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}.content", f"{where}.content must be text or a list of parts.")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
        else:
            raise invalid(
                f"{where}.content", f"{where} has a part that is neither text nor an image."
            )
    if any(p["type"] == "image_url" for p in parts):
        return parts
    return "\n".join(p["text"] for p in parts)


def _tools(raw: Any) -> list[dict[str, Any]]:
    tools = []
    for i, tool in enumerate(raw or []):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise invalid(f"tools[{i}]", f"tools[{i}]: Stoke takes function tools only.")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        tools.append({"type": "function", "function": function})
    return tools


def _format(text: Any) -> dict[str, Any] | None:
    """`text.format` ({"type": "json_schema", "name", "schema", "strict"} or json_object or
    text) as the chat request's `response_format`."""
    if text is None:
        return None
    shape = text.get("format") if isinstance(text, Mapping) else None
    if shape is None:
        return None
    if not isinstance(shape, Mapping):
        raise invalid("text.format", "`text.format` must be an object with a `type`.")
    if shape.get("type") != "json_schema":
        return dict(shape)
    spec = {k: shape[k] for k in ("name", "schema", "strict") if k in shape}
    return {"type": "json_schema", "json_schema": spec}


def _echoed(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's settings a response repeats back, as sent."""
    return {
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": list(body.get("tools") or []),
        "text": body.get("text") or {"format": {"type": "text"}},
    }


def _choice(raw: Any) -> Any:
    if isinstance(raw, Mapping) and raw.get("type") == "function":
        return {"type": "function", "function": {"name": raw.get("name")}}
    return raw


class ResponsesApi:
    """The route, over the server's request core (requests.py), and the conversations it
    can continue."""

    def __init__(self, core: RequestCore) -> None:
        self.core = core
        self._stored: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def add_routes(self, app: web.Application) -> None:
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/responses", self.create)

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = await self.core.body(request)
        history: list[dict[str, Any]] = []
        previous = body.get("previous_response_id")
        if previous is not None:
            if previous not in self._stored:
                raise ApiError(
                    404,
                    f"No stored response {str(previous)[:64]!r}: this server keeps its latest "
                    f"{MAX_STORED} in memory, and forgets them when it restarts.",
                    param="previous_response_id",
                )
            history = list(self._stored[previous])
        conversation = history + _items(body.get("input"))
        system = (
            [{"role": "system", "content": body["instructions"]}]
            if body.get("instructions")
            else []
        )
        chat_body: dict[str, Any] = {
            "model": body.get("model"),
            "messages": system + conversation,
            "stream": body.get("stream", False),
        }
        for name in ("temperature", "top_p", "parallel_tool_calls"):
            if body.get(name) is not None:
                chat_body[name] = body[name]
        if body.get("max_output_tokens") is not None:
            chat_body["max_tokens"] = body["max_output_tokens"]
        if body.get("tools"):
            chat_body["tools"] = _tools(body["tools"])
        if body.get("tool_choice") is not None:
            chat_body["tool_choice"] = _choice(body["tool_choice"])
        shape = _format(body.get("text"))
        if shape is not None:
            chat_body["response_format"] = shape
        chat = parse_chat(chat_body)
        job, info = await self.core.chat_job(chat)

        async def respond(request: web.Request, job: Job, slot: str, held: list[int]):
            writer = _Writer(self, job, previous, conversation, _echoed(body))
            if chat.params.stream:
                return await writer.stream(request, slot, held)
            return await writer.whole(slot, held)

        return await self.core.generate(request, job, info, respond)

    def store(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        self._stored[response_id] = messages
        while len(self._stored) > MAX_STORED:
            self._stored.popitem(last=False)


class _Writer:
    """One response: its output items, whole or as Responses stream events."""

    def __init__(
        self,
        api: ResponsesApi,
        job: Job,
        previous: str | None,
        conversation: list,
        echoed: dict[str, Any],
    ) -> None:
        self.api, self.job, self.previous, self.conversation = api, job, previous, conversation
        self.echoed = echoed
        self.id = "resp_" + job.id
        self._sequence = 0

    def envelope(self, status: str, output: list, reply: Reply | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "model": self.api.core.model_id,
            "output": output,
            "previous_response_id": self.previous,
            "parallel_tool_calls": self.job.tools.parallel,
            **self.echoed,
        }
        if reply is not None:
            used = usage(reply)
            body["usage"] = {
                "input_tokens": used["prompt_tokens"],
                "input_tokens_details": {
                    "cached_tokens": used["prompt_tokens_details"]["cached_tokens"]
                },
                "output_tokens": used["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": used["total_tokens"],
            }
        return body

    def finish(self, reply: Reply) -> tuple[list[dict[str, Any]], list[ToolCall]]:
        """The output items; the conversation is stored to be continued."""
        _, content, calls = self.api.core.finish_reply(self.job, reply)
        output: list[dict[str, Any]] = []
        if content or not calls:
            output.append(_message_item(self.job.id, content))
        output += [_call_item(call) for call in calls]
        said: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            said["tool_calls"] = [call.openai() for call in calls]
        self.api.store(self.id, [*self.conversation, said])
        return output, calls

    async def whole(self, slot: str, held: list[int]) -> web.Response:
        reply = Reply(self.job.params.stop)
        async with contextlib.aclosing(self.api.core.run(self.job, slot, held, reply)) as run:
            async for _ in run:
                pass
        output, _ = self.finish(reply)
        body = self.envelope(_status(reply), output, reply)
        return web.json_response(body)

    async def event(self, response: web.StreamResponse, kind: str, data: dict) -> None:
        payload = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        await response.write(f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode())

    async def stream(self, request: web.Request, slot: str, held: list[int]):
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        job = self.job
        splitter = ReasoningSplitter(opened=job.reasoning_opened)
        calls_text = ToolStream(job.syntax) if job.tools.active else None
        reply = Reply(job.params.stop)
        text_item = _message_item(job.id, "", status="in_progress")
        text_item["content"] = []
        opened = False
        sent = ""

        async def send_text(text: str) -> None:
            nonlocal opened, sent
            if not text:
                return
            if not opened:
                opened = True
                await self.event(
                    response, "response.output_item.added", {"output_index": 0, "item": text_item}
                )
                part = {"type": "output_text", "text": "", "annotations": []}
                await self.event(
                    response,
                    "response.content_part.added",
                    {
                        "item_id": text_item["id"],
                        "output_index": 0,
                        "content_index": 0,
                        "part": part,
                    },
                )
            sent += text
            await self.event(
                response,
                "response.output_text.delta",
                {"item_id": text_item["id"], "output_index": 0, "content_index": 0, "delta": text},
            )

        try:
            created = self.envelope("in_progress", [], None)
            await self.event(response, "response.created", {"response": created})
            await self.event(response, "response.in_progress", {"response": created})
            async with contextlib.aclosing(self.api.core.run(job, slot, held, reply)) as run:
                async for piece, _ in run:
                    _, text = splitter.feed(piece)
                    await send_text(calls_text.feed(text) if calls_text else text)
            _, text = splitter.finish()
            await send_text(calls_text.feed(text) if calls_text else text)
            output, calls = self.finish(reply)
            if calls_text is not None:
                text, held_text = calls_text.finish()
                await send_text(text if calls else text + held_text)
            if opened:
                done_part = {"type": "output_text", "text": sent, "annotations": []}
                ids = {"item_id": text_item["id"], "output_index": 0, "content_index": 0}
                await self.event(response, "response.output_text.done", {**ids, "text": sent})
                await self.event(response, "response.content_part.done", {**ids, "part": done_part})
                message = output[0] if output[0]["type"] == "message" else {**text_item}
                await self.event(
                    response, "response.output_item.done", {"output_index": 0, "item": message}
                )
            for index, item in enumerate(output):
                if item["type"] != "function_call":
                    continue
                await self.event(
                    response,
                    "response.output_item.added",
                    {"output_index": index, "item": {**item, "arguments": ""}},
                )
                ids = {"item_id": item["id"], "output_index": index}
                await self.event(
                    response,
                    "response.function_call_arguments.delta",
                    {**ids, "delta": item["arguments"]},
                )
                await self.event(
                    response,
                    "response.function_call_arguments.done",
                    {**ids, "arguments": item["arguments"]},
                )
                await self.event(
                    response, "response.output_item.done", {"output_index": index, "item": item}
                )
            done = self.envelope(_status(reply), output, reply)
            await self.event(response, "response.completed", {"response": done})
        except ConnectionResetError:
            self.api.core.client_left(job)
        except (ApiError, EngineError) as exc:
            error = exc if isinstance(exc, ApiError) else engine_error(exc)
            with contextlib.suppress(ConnectionResetError):
                await self.event(response, "error", {"message": error.message, "code": error.code})
        return response


def _status(reply: Reply) -> str:
    return "incomplete" if finish_reason(reply) == "length" else "completed"


def _message_item(job_id: str, text: str, *, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_" + job_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + call.id.removeprefix("call_"),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }
