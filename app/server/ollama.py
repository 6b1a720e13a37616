"""Ollama's API, for clients that speak only it: `POST /api/chat`, `POST /api/generate`,
`GET /api/tags`, `POST /api/show`, `GET /api/ps`, `GET /api/version`.

A request is translated into the OpenAI chat (or completion) request it means and runs on
the server's request core like every other dialect, so it gets the same exact replay of
replies, slots, KV reuse and grammar (`format`: "json" or a JSON schema). Ollama's
`options` map to the sampling (`temperature`, `top_p`, `top_k`, `min_p`, `seed`,
`num_predict`, `stop`, `repeat_penalty`, `presence_penalty`, `frequency_penalty`). Replies
stream as Ollama does by default (one JSON object a line, `done` on the last with its
counts and durations in nanoseconds) or come whole with `"stream": false`. The key is asked
for as on every route (Ollama's clients send it as a header: `Authorization: Bearer KEY`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from app.engine.protocol import EngineError
from app.pool.engines import Pooled
from app.server.errors import ApiError, invalid
from app.server.grammar import shaped
from app.server.http import engine_error
from app.server.replies import Reply, finish_reason
from app.server.requests import Job, RequestCore
from app.server.schema import parse_chat, parse_completion
from app.server.tool_replies import ToolStream
from app.toolcalls.reasoning import ReasoningSplitter
from app.toolcalls.tools import ToolCall

_OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "num_predict": "max_tokens",
    "stop": "stop",
    "repeat_penalty": "repeat_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
VERSION = "0.12.0"  # the Ollama API version whose shapes these routes follow


class OllamaApi:
    def __init__(self, core: RequestCore) -> None:
        self.core = core

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/api/chat", self.chat)
        app.router.add_post("/api/generate", self.generate)
        app.router.add_get("/api/tags", self.tags)
        app.router.add_post("/api/show", self.show)
        app.router.add_get("/api/ps", self.ps)
        app.router.add_get("/api/version", self.version)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self.core.body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise invalid("messages", "`messages` must be a non-empty list of messages.")
        chat_body = _common(body, self.core.model_id)
        chat_body["messages"] = [_message(i, m) for i, m in enumerate(messages)]
        if body.get("tools"):
            chat_body["tools"] = body["tools"]
        chat = parse_chat(chat_body)
        job, info = await self.core.chat_job(chat)
        return await self.core.generate(request, job, info, self._respond(body, "chat"))

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self.core.body(request)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise invalid("prompt", "`prompt` must be text.")
        if not prompt and not body.get("raw"):
            return web.json_response(self._done_body(body, "generate", None, ""))  # a load
        if body.get("raw"):
            completion = parse_completion({**_common(body, self.core.model_id), "prompt": prompt})
            params = shaped(completion)
            info = await self.core.model_ready(params)
            tokens = await self.core.engine.tokenize(prompt, special=True)
            job = Job("completion", params, tokens)
        else:
            said = [{"role": "user", "content": prompt}]
            if body.get("system"):
                said.insert(0, {"role": "system", "content": body["system"]})
            chat = parse_chat({**_common(body, self.core.model_id), "messages": said})
            job, info = await self.core.chat_job(chat)
        return await self.core.generate(request, job, info, self._respond(body, "generate"))

    async def tags(self, request: web.Request) -> web.Response:
        """Every model the server answers with, loaded or not (models on demand)."""
        return web.json_response({"models": [self._model_entry(m) for m in self.core.pool.models]})

    async def ps(self, request: web.Request) -> web.Response:
        """The models loaded now."""
        loaded = [
            {**self._model_entry(m), "expires_at": "0001-01-01T00:00:00Z", "size_vram": 0}
            for m in self.core.pool.models
            if m.state == "loaded"
        ]
        return web.json_response({"models": loaded})

    async def show(self, request: web.Request) -> web.Response:
        body = await self.core.body(request)
        name = body.get("model", body.get("name"))
        info = await self.core.ready(name if isinstance(name, str) else None)
        return web.json_response(
            {
                "modelfile": "",
                "parameters": "",
                "template": info.chat_template,
                "details": self._model_entry(self.core.model)["details"],
                "model_info": {"general.architecture": info.architecture},
                "capabilities": ["completion", "tools"],
            }
        )

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    @staticmethod
    def _model_entry(model: Pooled) -> dict[str, Any]:
        path = Path(model.engine.options.model_path)
        size = path.stat().st_size if path.is_file() else 0
        info = model.engine.info
        return {
            "name": model.name,
            "model": model.name,
            "modified_at": _now(),
            "size": size,
            "digest": info.fingerprint if info else "",
            "details": {
                "format": "gguf" if path.suffix == ".gguf" else "mlx",
                "family": info.architecture if info else "",
                "parameter_size": "",
                "quantization_level": "",
            },
        }

    def _respond(self, body: Mapping[str, Any], kind: str):
        stream = body.get("stream", True) is not False

        async def respond(request: web.Request, job: Job, slot: str, held: list[int]):
            if stream:
                return await self._stream(request, body, kind, job, slot, held)
            reply = Reply(job.params.stop)
            async with contextlib.aclosing(self.core.run(job, slot, held, reply)) as run:
                async for _ in run:
                    pass
            text, calls = self._finish(job, reply)
            return web.json_response(self._done_body(body, kind, reply, text, calls))

        return respond

    async def _stream(
        self,
        request: web.Request,
        body: Mapping[str, Any],
        kind: str,
        job: Job,
        slot: str,
        held: list[int],
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        splitter = ReasoningSplitter(opened=job.reasoning_opened)
        calls_text = ToolStream(job.syntax) if job.tools.active else None
        reply = Reply(job.params.stop)

        async def send(text: str) -> None:
            if text:
                await _line(response, self._piece(body, kind, text))

        try:
            async with contextlib.aclosing(self.core.run(job, slot, held, reply)) as run:
                async for piece, _ in run:
                    _, text = splitter.feed(piece)
                    await send(calls_text.feed(text) if calls_text else text)
            _, text = splitter.finish()
            await send(calls_text.feed(text) if calls_text else text)
            if calls_text is not None:
                shown, _ = calls_text.finish()
                await send(shown)
            _, calls = self._finish(job, reply)
            await _line(response, self._done_body(body, kind, reply, "", calls))
        except ConnectionResetError:
            self.core.client_left(job)
            return response
        except (ApiError, EngineError) as exc:  # the headers are sent: the error is a line
            error = exc if isinstance(exc, ApiError) else engine_error(exc)
            with contextlib.suppress(ConnectionResetError):
                await _line(response, {"error": error.message})
        await response.write_eof()
        return response

    def _finish(self, job: Job, reply: Reply) -> tuple[str, list[ToolCall]]:
        if job.kind == "completion":
            self.core.stats.answered()
            return reply.text, []
        _, content, calls = self.core.finish_reply(job, reply)
        return content, calls

    def _piece(self, body: Mapping[str, Any], kind: str, text: str) -> dict[str, Any]:
        head = {"model": body.get("model") or self.core.model_id, "created_at": _now()}
        if kind == "chat":
            return {**head, "message": {"role": "assistant", "content": text}, "done": False}
        return {**head, "response": text, "done": False}

    def _done_body(
        self,
        body: Mapping[str, Any],
        kind: str,
        reply: Reply | None,
        text: str,
        calls: list[ToolCall] | None = None,
    ) -> dict[str, Any]:
        out = self._piece(body, kind, text)
        out["done"] = True
        if kind == "chat" and calls:  # Ollama's arguments are objects, not JSON text
            out["message"]["tool_calls"] = [
                {"function": {"name": c.name, "arguments": json.loads(c.arguments or "{}")}}
                for c in calls
            ]
        stats = reply.stats if reply is not None else None
        if stats is None:
            return {**out, "done_reason": "load"}
        generated = len(reply.tokens)
        prefill_ns = _ns(stats.prefilled_tokens, stats.prefill_tok_s)
        decode_ns = _ns(generated, stats.decode_tok_s)
        return {
            **out,
            "done_reason": "length" if finish_reason(reply) == "length" else "stop",
            "total_duration": prefill_ns + decode_ns,
            "load_duration": 0,
            "prompt_eval_count": stats.prefilled_tokens,
            "prompt_eval_duration": prefill_ns,
            "eval_count": generated,
            "eval_duration": decode_ns,
        }


def _common(body: Mapping[str, Any], model_id: str) -> dict[str, Any]:
    """The OpenAI request fields an Ollama request's model, options, format and stream mean."""
    options = body.get("options") or {}
    if not isinstance(options, Mapping):
        raise invalid("options", "`options` must be an object.")
    out: dict[str, Any] = {
        "model": body.get("model") or model_id,
        "stream": body.get("stream", True) is not False,
    }
    for name, field in _OPTIONS.items():
        if options.get(name) is not None:
            out[field] = options[name]
    shape = body.get("format")
    if shape == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(shape, Mapping):
        out["response_format"] = {"type": "json_schema", "json_schema": {"schema": shape}}
    elif shape not in (None, ""):
        raise invalid("format", '`format` must be "json" or a JSON schema object.')
    return out


def _message(index: int, raw: Any) -> dict[str, Any]:
    """An Ollama message as an OpenAI one: its images (base64) as image_url parts after the
    text, tool calls' arguments (objects in Ollama's API) as JSON text, a tool result's name
    kept."""
    where = f"messages[{index}]"
    if not isinstance(raw, Mapping):
        raise invalid(where, f"{where} must be an object with `role` and `content`.")
    out: dict[str, Any] = {"role": raw.get("role"), "content": raw.get("content") or ""}
    images = raw.get("images") or []
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise invalid(f"{where}.images", f"{where}.images must be a list of base64 images.")
    if images:
        out["content"] = [
            {"type": "text", "text": out["content"]},
            *(
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}
                for image in images
            ),
        ]
    calls = raw.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {
                "id": f"call_{index}_{i}",
                "type": "function",
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": json.dumps((call.get("function") or {}).get("arguments") or {}),
                },
            }
            for i, call in enumerate(calls)
            if isinstance(call, Mapping)
        ]
    if raw.get("role") == "tool":
        out["tool_call_id"] = raw.get("tool_call_id") or raw.get("tool_name") or ""
    return out


def _ns(tokens: int, rate: float) -> int:
    return int(1e9 * tokens / rate) if rate else 0


async def _line(response: web.StreamResponse, body: dict[str, Any]) -> None:
    await response.write((json.dumps(body) + "\n").encode())


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")
