"""The OpenAI-compatible HTTP API over the app's engine host (aiohttp, on the app's loop).

Routes: GET /v1/models (and /v1/models/{id}), POST /v1/chat/completions, POST
/v1/completions, POST /v1/messages (Anthropic's, anthropic.py), POST /v1/responses
(responses.py) (each streaming as server-sent events or not), each also without the /v1
prefix as llama-server serves them, llama-server's /tokenize, /detokenize, /apply-template,
/props, /slots and /metrics (utility.py), Ollama's /api routes (ollama.py), embeddings
(embeddings.py: /v1/embeddings, /api/embed), and GET /health
(no key; the engine's status only). The
server answers with an engine pool's models (app/pool): `stoke serve` hands it the library's,
each loaded when a request names it (each request leases its model until it is answered:
the `_leases` middleware); the window hands it its own EngineClient as a pool of one, so it
runs on the same asyncio loop and the engine process serialises its work with the GUI's.
GET /v1/models lists the pool's models with their state, engine, capabilities, context and
size.

What makes it more than a proxy: a chat history is turned into tokens by the app's
Transcript with the exact ids of this server's earlier replies (prompts.py, replay.py), and
each client conversation keeps its own KV sequence (slots.py), so a stateless client's
follow-up turn prefills only what is new, as the window's turns do.
`usage.prompt_tokens_details.cached_tokens` reports the prompt tokens whose KV was reused.

Token-id contract (vLLM-compatible, what app/engine/remote.py relies on): /v1/completions
takes `prompt` as a list of token ids, used as is (no BOS added); with
`"return_token_ids": true` each choice, streamed or not, carries `token_ids` (the sampled
ids of that choice or chunk) and the response carries `prompt_token_ids` at top level (the
first chunk, when streaming).

Limits: bodies over `max_body_bytes` get 413; more than `max_in_flight` requests at once
get 429 (with Retry-After), and so do requests on connections beyond `max_connections`; a
prompt that does not fit the context gets 400 with both numbers. Slow clients cannot hold
connections: unfinished headers and idle keep-alive connections are closed after
`header_timeout_s`, a body that takes longer than `body_timeout_s` gets 408. A client that
disconnects mid-reply cancels its generation, so the engine is free for the next request.
Every error is OpenAI's JSON error object in words, HTTP that does not parse included; none
carries Python's exception text or echoes the request's bytes.

Beside it: requests.py (the request core every API runs on: a request as a job, its
generation, each reply's finish), http.py (connections and errors in words), replies.py (a
reply cut at its stop sequences, its usage), schema.py (requests), prompts.py and replay.py
(exact replies), served.py (each finished chat reply handed to the sink given, if any: the
window keeps them). The other APIs' routes (anthropic.py, responses.py, utility.py,
ollama.py, embeddings.py) are handed the core;
this module imports them, never the reverse.

After each reply the conversation's KV is snapshotted in the background (as the window does
after its replies), so a `kill -9` of the server loses no API conversation's KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from app.engine.host import EngineClient, EngineState
from app.engine.images import reads_images
from app.engine.protocol import EngineError, ModelInfo, PrefillProgress
from app.pool.engines import EnginePool, Pooled
from app.server import auth
from app.server.anthropic import AnthropicApi, error_shape
from app.server.embeddings import EmbeddingsApi
from app.server.errors import Shape
from app.server.grammar import shaped
from app.server.http import (
    FAILED,
    Connection,
    Gate,
    engine_error,
    http_error,
    write_event,
)
from app.server.logprobs import TokenTexts, chat_logprobs, completion_logprobs
from app.server.ollama import OllamaApi
from app.server.replies import Reply, finish_reason, timings, usage
from app.server.requests import RETRY_AFTER_S, Job, RequestCore, ServerConfig
from app.server.responses import ResponsesApi
from app.server.schema import (
    ApiError,
    CompletionRequest,
    parse_chat,
    parse_completion,
)
from app.server.served import ReplySink
from app.server.tool_replies import CallDelta, ToolStream
from app.server.utility import UtilityRoutes
from app.toolcalls.reasoning import ReasoningSplitter

logger = logging.getLogger("stoke.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_HEALTH = {  # engine state -> (HTTP status, /health's status word)
    EngineState.READY: (200, "ok"),
    EngineState.PREFILLING: (200, "ok"),
    EngineState.GENERATING: (200, "ok"),
    EngineState.STOPPED: (503, "loading"),
    EngineState.LOADING: (503, "loading"),
    EngineState.CRASHED: (503, "restarting"),
    EngineState.FAILED: (503, "error"),
}


class ApiServer(RequestCore):
    """The server: start() binds and serves on the running loop, stop() ends it. It is the
    request core (requests.py) its routes and the other APIs' run on."""

    def __init__(
        self,
        engine: EngineClient | EnginePool,
        config: ServerConfig,
        sink: ReplySink | None = None,
    ) -> None:
        super().__init__(engine, config, sink)
        self.responses = ResponsesApi(self)  # keeps the conversations it can continue
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._gate = Gate()
        self._listener: asyncio.Server | None = None

    @property
    def url(self) -> str:
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        return f"http://{host}:{self.port}/v1"

    @property
    def open_connections(self) -> int:
        return self._gate.open

    async def start(self) -> str:
        """Bind and serve; returns the base URL. Raises OSError when the port is taken."""
        app = web.Application(
            client_max_size=self.config.max_body_bytes,
            middlewares=[self._errors, self._admit, self._auth, self._leases],
        )
        for prefix in ("/v1", ""):  # llama-server serves both
            app.router.add_get(f"{prefix}/models", self._models)
            app.router.add_get(f"{prefix}/models/{{model_id}}", self._model)
            app.router.add_post(f"{prefix}/chat/completions", self._chat)
            app.router.add_post(f"{prefix}/completions", self._completions)
            app.router.add_get(f"{prefix}/health", self._health)
        AnthropicApi(self).add_routes(app)
        self.responses.add_routes(app)
        UtilityRoutes(self).add_routes(app)
        OllamaApi(self).add_routes(app)
        EmbeddingsApi(self).add_routes(app)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        self._runner = runner
        try:
            self._listener = await asyncio.get_running_loop().create_server(
                self._connection, self.config.host, self.config.port
            )
        except OSError:
            self._runner = None
            await runner.cleanup()
            raise
        self.port = self._listener.sockets[0].getsockname()[1]
        return self.url

    def _connection(self) -> Connection:
        """A new connection's handler (the listener's protocol factory), with the timeouts
        and the limit as the config says now."""
        server = self._runner.server
        return Connection(
            server,
            gate=self._gate,
            limit=self.config.max_connections,
            loop=asyncio.get_running_loop(),
            keepalive_timeout=self.config.header_timeout_s,  # aiohttp's idle timer
            access_log=None,
        )

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await listener.wait_closed()
        await self.prewarm.idle()

    # -- middleware: errors in the API's shape, CORS, the key ------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        shape = error_shape(request.path)  # OpenAI's error object, or Anthropic's
        try:
            response = await handler(request)
        except ApiError as exc:
            response = self._error_response(exc, shape)
        except web.HTTPException as exc:  # aiohttp's own: no such route, wrong method, 413
            response = self._error_response(http_error(exc), shape)
        except EngineError as exc:
            response = self._error_response(engine_error(exc), shape)
        except Exception:  # never a traceback or exception text to the client; the log has it
            logger.exception("request %s %s failed", request.method, request.path)
            response = self._error_response(ApiError(500, FAILED, kind="server_error"), shape)
        if not response.prepared:
            response.headers.update(self._cors_headers(request))
        return response

    @web.middleware
    async def _admit(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Requests on connections opened beyond the limit get 429 (and the connection ends),
        so slow or idle clients cannot take every connection unnoticed."""
        connection = request.protocol
        if isinstance(connection, Connection) and not connection.admitted:
            raise ApiError(
                429,
                f"The server has {self.config.max_connections} connections open, its limit; "
                "close idle ones or try again shortly.",
                kind="rate_limit_error",
                code="too_many_connections",
                retry_after=RETRY_AFTER_S,
                close=True,
            )
        return await handler(request)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS" and self.config.cors_origins:
            return web.Response(status=204, headers=self._cors_headers(request, preflight=True))
        if request.path in ("/health", "/v1/health"):
            return await handler(request)  # status only, for supervisors and load balancers
        key = self.config.api_key
        if not (
            auth.authorized(request.headers.get("Authorization"), key)
            or auth.authorized_key(request.headers.get("x-api-key"), key)
        ):
            raise ApiError(
                401,
                "Missing or wrong API key. Send it as 'Authorization: Bearer KEY' (or as "
                "'x-api-key: KEY'); Stoke shows it in Settings > API server, and "
                "`stoke serve --show-key` prints it.",
                code="invalid_api_key",
            )
        return await handler(request)

    @web.middleware
    async def _leases(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The models a request leases from the pool stay loaded until it is answered."""
        token = self.leasing()
        try:
            return await handler(request)
        finally:
            self.released(token)

    def _cors_headers(self, request: web.Request, *, preflight: bool = False) -> dict[str, str]:
        origin = request.headers.get("Origin")
        allowed = self.config.cors_origins
        if not origin or not ("*" in allowed or origin in allowed):
            return {}
        headers = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if preflight:
            headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
            headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type, x-api-key"
            headers["Access-Control-Max-Age"] = "600"
        return headers

    def _error_response(self, error: ApiError, shape: Shape = "openai") -> web.Response:
        self.stats.rejected += 1
        response = web.json_response(error.body(shape), status=error.http_status(shape))
        if error.retry_after is not None:
            response.headers["Retry-After"] = str(error.retry_after)
        if error.close:
            response.force_close()
        return response

    # -- routes ------------------------------------------------------------------------------

    def _model_entry(self, model: Pooled) -> dict[str, Any]:
        """A model as /v1/models lists it: OpenAI's fields, then whether it is loaded, its
        engine, what it can do, its context and its size."""
        info, entry = model.engine.info, model.entry
        context = info.n_ctx if info is not None and model.state == "loaded" else None
        if context is None:
            context = model.engine.options.n_ctx or (entry.context_length if entry else None)
        path = Path(model.engine.options.model_path) if model.engine.options.model_path else None
        gguf = path is not None and path.suffix == ".gguf"
        return {
            "id": model.name,
            "object": "model",
            "created": 0,
            "owned_by": "stoke",
            "state": model.state,
            "default": model is self.pool.default,
            "pinned": model.name == self.pool.pin,
            "engine": model.backend,
            "capabilities": {
                "completion": True,
                "tools": bool(entry.chat_template) if entry else True,
                "vision": reads_images(info if model.state == "loaded" else None, path),
                "embeddings": gguf and model.backend == "llama.cpp",
            },
            "context_length": context,
            "size_bytes": entry.size_bytes if entry else _size(path),
            "memory_bytes": model.need or None,
        }

    async def _models(self, request: web.Request) -> web.Response:
        data = [self._model_entry(model) for model in self.pool.models]
        return web.json_response({"object": "list", "data": data})

    async def _model(self, request: web.Request) -> web.Response:
        """One model by id: a lookup, so an unknown id is 404 even when requests naming it
        would be served."""
        model = self.pool.find(request.match_info["model_id"])
        if model is None:
            raise self.unknown_model(request.match_info["model_id"])
        return web.json_response(self._model_entry(model))

    async def _health(self, request: web.Request) -> web.Response:
        state = self.engine.state
        if state == EngineState.STOPPED and not self.pool.default.resident:
            state = EngineState.READY  # unloaded by the pool: the next request loads it
        status, word = _HEALTH.get(state, (503, "error"))
        body: dict[str, Any] = {"status": word}
        if self.engine.retry_at is not None:  # a crash loop's back-off: when it tries again
            body["retry_in_s"] = round(max(self.engine.retry_at - time.monotonic(), 0.0), 1)
        return web.json_response(body, status=status)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        job, info = await self.chat_job(parse_chat(await self.body(request)))
        return await self.generate(request, job, info, self._respond)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        completion = parse_completion(await self.body(request))
        params = shaped(completion)
        info = await self.model_ready(params)
        job = Job("completion", params, self._raw_prompt(completion, info))
        return await self.generate(request, job, info, self._respond)

    # -- building prompts --------------------------------------------------------------------

    def _raw_prompt(self, completion: CompletionRequest, info: ModelInfo) -> list[int]:
        if isinstance(completion.prompt, tuple):
            bad = [t for t in completion.prompt if not 0 <= t < info.n_vocab]
            if bad:
                raise ApiError(
                    400,
                    f"`prompt` holds token ids outside the vocabulary (0 to {info.n_vocab - 1}): "
                    f"{bad[:5]}",
                    param="prompt",
                )
            return list(completion.prompt)
        tokens = self.engine.local_tokenizer().tokenize(completion.prompt, special=True)
        bos = [info.bos_id] if info.add_bos and info.bos_id is not None else []
        return bos + tokens

    # -- generation --------------------------------------------------------------------------

    async def _respond(
        self, request: web.Request, job: Job, slot: str, held: list[int]
    ) -> web.StreamResponse:
        """The reply in OpenAI's shape, streamed or whole."""
        if job.params.stream:
            return await self._stream(request, job, slot, held)
        return await self._whole(job, slot, held)

    async def _whole(self, job: Job, slot: str, held: list[int]) -> web.Response:
        """The reply, or `n` of them: each from the same prompt (its KV reused), seeded one
        after another from the request's seed where it gave one."""
        choices, replies = [], []
        for index in range(job.params.n):
            held[:] = job.prompt  # each choice starts from the prompt alone
            one = job if index == 0 else _nth(job, index)
            reply = Reply(job.params.stop)
            async with contextlib.aclosing(self.run(one, slot, held, reply)) as events:
                async for _ in events:
                    pass
            choices.append(self._choice(one, reply, index))
            replies.append(reply)
        body = self._envelope(job, chunk=False)
        body["choices"] = choices
        body["usage"] = usage(*replies)
        body["timings"] = timings(replies[0])
        if job.params.return_token_ids:
            body["prompt_token_ids"] = job.prompt
        return web.json_response(body)

    def _choice(self, job: Job, reply: Reply, index: int) -> dict[str, Any]:
        reasoning, content, calls = self.finish_reply(job, reply)
        choice: dict[str, Any] = {"index": index}
        if job.kind == "chat":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": content if content or not calls else None,
            }
            if reasoning:
                message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = [call.openai() for call in calls]
            choice["message"] = message
        else:
            choice["text"] = reply.text
        choice["logprobs"] = self._logprobs(job, reply, 0)
        choice["finish_reason"] = "tool_calls" if calls else finish_reason(reply)
        if job.params.return_token_ids:
            choice["token_ids"] = reply.tokens
        return choice

    async def _stream(
        self, request: web.Request, job: Job, slot: str, held: list[int]
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **self._cors_headers(request),
            }
        )
        await response.prepare(request)
        chat = job.kind == "chat"
        splitter = ReasoningSplitter(opened=job.reasoning_opened) if chat else None
        calls_text = ToolStream(job.syntax, job.tools) if job.tools.active else None
        reply = Reply(job.params.stop)
        scored = 0  # tokens whose logprobs have been sent

        async def send(
            text: str = "",
            reasoning: str = "",
            ids: list[int] | None = None,
            *,
            finish: str | None = None,
            first: bool = False,
            calls: list[CallDelta] | None = None,
        ) -> None:
            body = self._envelope(job, chunk=True)
            choice: dict[str, Any] = {"index": 0}
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
                if text:
                    delta["content"] = text
                if reasoning:
                    delta["reasoning_content"] = reasoning
                if calls:
                    delta["tool_calls"] = [call.openai() for call in calls]
                choice["delta"] = delta
            else:
                choice["text"] = text
            nonlocal scored
            choice["logprobs"] = self._logprobs(job, reply, scored)
            scored = len(reply.tokens)
            choice["finish_reason"] = finish
            if job.params.return_token_ids:
                choice["token_ids"] = ids or []
                if first:
                    body["prompt_token_ids"] = job.prompt
            body["choices"] = [choice]
            async with writing:
                await write_event(response, body)

        writing = asyncio.Lock()  # progress chunks and the reply's, one at a time, in order
        progress = _ProgressChunks(self._envelope(job, chunk=True), response, writing)
        try:
            await send(first=True)
            events = self.run(
                job, slot, held, reply, progress.heard if job.params.return_progress else None
            )
            async with contextlib.aclosing(events) as events:
                async for piece, ids in events:
                    reasoning, text = splitter.feed(piece) if splitter else ("", piece)
                    text = calls_text.feed(text) if calls_text else text
                    deltas = calls_text.deltas() if calls_text else []
                    if text or reasoning or deltas or (ids and job.params.return_token_ids):
                        await send(text, reasoning, ids, calls=deltas)
            if splitter is not None:
                reasoning, text = splitter.finish()
                text = calls_text.feed(text) if calls_text else text
                deltas = calls_text.deltas() if calls_text else []
                if text or reasoning or deltas:
                    await send(text, reasoning, calls=deltas)
            streamed = None
            if calls_text is not None:
                text, deltas, content, calls = calls_text.close()
                streamed = (content, calls)
                if text or deltas:
                    await send(text, calls=deltas)
            await progress.sent()
            _, _, calls = self.finish_reply(job, reply, streamed)
            await send(finish="tool_calls" if calls else finish_reason(reply))
            if job.params.include_usage:
                body = self._envelope(job, chunk=True)
                body["choices"] = []
                body["usage"] = usage(reply)
                body["timings"] = timings(reply)
                await write_event(response, body)
            await response.write(b"data: [DONE]\n\n")
        except ConnectionResetError:
            self.client_left(job)
        except (ApiError, EngineError) as exc:  # headers are sent: the error goes in the stream
            error = exc if isinstance(exc, ApiError) else engine_error(exc)
            self.stats.rejected += 1
            with contextlib.suppress(ConnectionResetError):
                await write_event(response, error.body())
                await response.write(b"data: [DONE]\n\n")
        return response

    # -- helpers -----------------------------------------------------------------------------

    def _envelope(self, job: Job, *, chunk: bool) -> dict[str, Any]:
        if job.kind == "chat":
            obj, prefix = ("chat.completion.chunk" if chunk else "chat.completion"), "chatcmpl-"
        else:
            obj, prefix = "text_completion", "cmpl-"
        return {
            "id": prefix + job.id,
            "object": obj,
            "created": job.created,
            "model": self.model_id,
        }

    def _logprobs(self, job: Job, reply: Reply, start: int) -> dict[str, Any] | None:
        """The logprobs of the reply's tokens from `start` on, when the request asked."""
        if job.params.sampling.logprobs is None:
            return None
        texts = TokenTexts(self.engine.local_tokenizer())
        shape = chat_logprobs if job.kind == "chat" else completion_logprobs
        return shape(reply.tokens[start:], reply.scores[start:], texts)


def _size(path: Path | None) -> int | None:
    """Bytes of a model's file or folder (None: no local model)."""
    if path is None or not path.exists():
        return None
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _nth(job: Job, index: int) -> Job:
    """The job of choice `index`: the request's seed moved on by `index` where it gave one
    (else each choice draws its own)."""
    sampling = job.params.sampling
    seed = None if sampling.seed is None else sampling.seed + index
    params = dataclasses.replace(job.params, sampling=dataclasses.replace(sampling, seed=seed))
    return dataclasses.replace(job, params=params)


class _ProgressChunks:
    """llama-server's `prompt_progress` chunks (`return_progress`): each prefill step the
    engine reports is written as it comes (total, processed, time_ms), ordered with the
    reply's own chunks by their shared lock."""

    def __init__(
        self, envelope: dict[str, Any], response: web.StreamResponse, lock: asyncio.Lock
    ) -> None:
        self._envelope, self._response, self._lock = envelope, response, lock
        self._start = time.monotonic()
        self._writes: list[asyncio.Task] = []

    def heard(self, step: PrefillProgress) -> None:
        body = {
            **self._envelope,
            "choices": [],
            "prompt_progress": {
                "total": step.total,
                "processed": step.done,
                "time_ms": round(1000 * (time.monotonic() - self._start), 1),
            },
        }
        self._writes.append(asyncio.get_running_loop().create_task(self._write(body)))

    async def _write(self, body: dict[str, Any]) -> None:
        async with self._lock:
            with contextlib.suppress(ConnectionResetError):
                await write_event(self._response, body)

    async def sent(self) -> None:
        """Every progress chunk written."""
        await asyncio.gather(*self._writes)
