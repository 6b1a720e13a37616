"""The request core every API of the server shares (app.py's OpenAI routes, anthropic.py,
responses.py): a request as a `Job` (its prompt, grammar and tools), generation on its
conversation's slot within the server's limits, and the finish of each reply (counted, logged,
handed to the sink, its exact ids kept for replay). The dialects are handed a `RequestCore`
and write the reply in their own shape; `ApiServer` is one, with its HTTP app around it.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from app.engine.chat_template import ChatTemplate, TemplateError
from app.engine.host import EngineClient, Generation
from app.engine.prewarm import Prewarmer
from app.engine.protocol import EngineError, GenerationStats, ModelInfo, ProgressCallback
from app.engine.remote_wire import WIRE_TEMPLATE
from app.engine.transcript import Tokenizer
from app.engine.worker import Priority
from app.pool.engines import DoesNotFit, EnginePool, Pooled
from app.server.grammar import constrained
from app.server.http import read_body
from app.server.metrics import DECODE_BUCKETS, TTFT_BUCKETS_S, Histogram
from app.server.prompts import ChatPrompts, passthrough_variables, with_tools
from app.server.replay import ReplyStore, calls_key
from app.server.replies import Reply, finish_reason
from app.server.schema import ApiError, ChatRequest, GenerationParams, Message
from app.server.served import ReplySink, ServedReply, client_of, served_messages
from app.server.slots import SlotMap
from app.toolcalls.calls import reply_calls, shown_text
from app.toolcalls.reasoning import opens_reasoning, split_reasoning
from app.toolcalls.syntax import FAMILIES, ToolSyntax, syntax_for
from app.toolcalls.tools import ToolCall, Tools

logger = logging.getLogger("stoke.server")

RETRY_AFTER_S = 2  # what a 429 tells the client to wait

# The model the request being handled leased from the pool (each request's handler runs in
# its own context): `RequestCore.engine`, `model_id` and `slots` are that model's. The
# middleware in app.py opens a request with a fresh list and releases what it leased.
_LEASED: contextvars.ContextVar[list[Pooled] | None] = contextvars.ContextVar(
    "stoke_leased", default=None
)


@dataclass(frozen=True)
class ServerConfig:
    api_key: str
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (ApiServer.port says which)
    cors_origins: tuple[str, ...] = ()  # none: browsers may not call it; "*" for any
    max_body_bytes: int = 8 << 20
    max_in_flight: int = 16
    max_connections: int = 64  # open at once; requests on the ones beyond get 429
    # Seconds a connection may take to send a request's headers, from connecting or from the
    # end of its last response: unfinished headers and idle keep-alive connections end there.
    header_timeout_s: float = 30.0
    body_timeout_s: float = 30.0  # to send the body once the headers are in (else 408)
    strict_model: bool = False  # an unknown model name gets 404 instead of this server's model


@dataclass
class ServerStats:
    """Counters for the settings page, /metrics and the tests."""

    requests: int = 0
    completed: int = 0
    disconnected: int = 0  # the client left mid-reply; its generation was cancelled
    rejected: int = 0  # answered with an error
    in_flight: int = 0
    prompt_tokens: int = 0  # of finished replies' prompts
    reused_tokens: int = 0  # of those, reused from the cache (resident or restored)
    generated_tokens: int = 0
    ttft_s: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    decode_tok_s: Histogram = field(default_factory=lambda: Histogram(DECODE_BUCKETS))
    # told after each answered request (on the server's loop), e.g. a window showing the count
    listeners: list[Callable[[], None]] = field(default_factory=list)

    def answered(self) -> None:
        """One more request answered, and everyone showing the count told."""
        self.completed += 1
        for listener in list(self.listeners):
            listener()

    def count(self, stats: GenerationStats, generated: int) -> None:
        """A finished reply's numbers into the totals."""
        self.prompt_tokens += stats.prompt_tokens
        self.reused_tokens += stats.reused_tokens
        self.generated_tokens += generated
        self.ttft_s.observe(stats.ttft_s)
        if generated:
            self.decode_tok_s.observe(stats.decode_tok_s)


@dataclass
class Job:
    """One generation request, whichever endpoint it came from."""

    kind: str  # "chat" | "completion"
    params: GenerationParams
    prompt: list[int]
    reasoning_opened: bool = False
    tools: Tools = field(default_factory=Tools)
    syntax: ToolSyntax = FAMILIES["hermes"]
    messages: tuple[Message, ...] = ()  # a chat's, as the model reads them (tools added)
    client: str | None = None  # who asked: the user agent
    endpoint: str = ""
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


# Writes one job's reply in its API's shape: (request, job, slot, held tokens) -> the response
Respond = Callable[[web.Request, Job, str, list[int]], Awaitable[web.StreamResponse]]


class RequestCore:
    """What every route of the server runs on: the engine, the limits, the exact-reply
    store, the conversations' slots and the counters (see the module's docstring)."""

    def __init__(
        self, engine: EngineClient | EnginePool, config: ServerConfig, sink: ReplySink | None = None
    ) -> None:
        # One engine (the window's) is a pool of one; `stoke serve` hands the library's pool.
        self.pool = engine if isinstance(engine, EnginePool) else EnginePool.of_engine(engine)
        self.config = config
        self.sink = sink  # told of each finished chat reply (served.py); None: nobody
        self.replies = ReplyStore()
        self.prompts = ChatPrompts(self.replies)
        # Slot names key the KV snapshots: a restarted server must not reuse the names of
        # the conversations an earlier one snapshotted, or its first snapshot replaces theirs.
        # Each model has its own map (a conversation is one model's), named apart.
        self._slot_prefix = f"api-{uuid.uuid4().hex[:8]}"
        self._slots: dict[str, SlotMap] = {}
        self.stats = ServerStats()
        self.prewarm = Prewarmer(self)  # the snapshots after replies
        self._opened: dict[tuple, bool] = {}  # template key -> generation prompt opens <think>

    @property
    def model(self) -> Pooled:
        """The model this request leased, else the default one."""
        leased = _LEASED.get()
        return leased[-1] if leased else self.pool.default

    @property
    def engine(self) -> EngineClient:
        return self.model.engine

    @property
    def model_id(self) -> str:
        """The id clients name: the library's name of the model, or its file's name (or, for
        a model without a local file, the loaded model's)."""
        return self.model.name

    @property
    def slots(self) -> SlotMap:
        """The conversations' slots on this request's model."""
        name = self.model.name
        if name not in self._slots:
            self._slots[name] = SlotMap(prefix=f"{self._slot_prefix}-{len(self._slots)}")
        return self._slots[name]

    @staticmethod
    def leasing() -> contextvars.Token:
        """Open a request: what it leases is kept to be released by `released`."""
        return _LEASED.set([])

    def released(self, token: contextvars.Token) -> None:
        """Close a request: release the models it leased."""
        for model in _LEASED.get() or ():
            self.pool.release(model)
        _LEASED.reset(token)

    async def body(self, request: web.Request) -> dict[str, Any]:
        return await read_body(request, self.config.max_body_bytes, self.config.body_timeout_s)

    async def model_ready(self, params: GenerationParams) -> ModelInfo:
        return await self.ready(params.model)

    async def ready(self, name: str | None = None) -> ModelInfo:
        """The named model loaded (the default model when `name` is empty), leased until the
        request ends. A name the pool does not have is served by the default model (as
        llama-server and LM Studio serve any name), unless the server is strict about names.
        A model that cannot fit the budget is a 503 in words."""
        model = self.pool.find(name)
        if model is None:
            if self.config.strict_model:
                raise self.unknown_model(name or "")
            model = self.pool.default
        leased = _LEASED.get()
        try:
            await self.pool.lease(model)
        except DoesNotFit as exc:
            raise ApiError(503, str(exc), kind="server_error", code="model_does_not_fit") from exc
        if leased is None:  # outside a request (a test's call): nothing would release it
            self.pool.release(model)
        else:
            leased.append(model)
        return await model.engine.ready()

    def unknown_model(self, name: str) -> ApiError:
        names = ", ".join(repr(m.name) for m in self.pool.models)
        return ApiError(
            404,
            f"The model {name[:100]!r} does not exist here; this server has {names} "
            "(see /v1/models).",
            param="model",
            code="model_not_found",
        )

    async def chat_job(self, chat: ChatRequest) -> tuple[Job, ModelInfo]:
        """A chat request as the job to run: its prompt, grammar and tools (every chat API
        of this server goes through here)."""
        info = await self.model_ready(chat.params)
        source = ChatTemplate(info.chat_template).source
        syntax = syntax_for(source, info.architecture)
        passthrough = source == WIRE_TEMPLATE  # a chat-mode remote: its server does tools
        said, start = _prefill(chat)
        if start and passthrough:
            raise ApiError(
                400,
                "This model runs on a remote server in chat mode, which cannot continue a "
                "last assistant message; end with a user message.",
                param="messages",
            )
        messages, variables = (
            (list(chat.messages), passthrough_variables(chat))
            if passthrough
            else with_tools(said, chat.tools, source, syntax)
        )
        template = ChatTemplate(
            info.chat_template,
            bos_token=info.bos_token,
            eos_token=info.eos_token,
            variables={**chat.template_variables, **variables},
        )
        images = await self._image_runs(messages)
        try:
            prompt = self.prompts.build(
                messages, template, info, self.engine.local_tokenizer(), syntax, images
            ) + self.engine.local_tokenizer().tokenize(start)
            opened = self._opens_reasoning(template)
        except TemplateError as exc:
            raise ApiError(400, f"The model's chat template refused these messages: {exc}") from exc
        tokenizer = self.engine.local_tokenizer()
        params = chat.params if passthrough else constrained(chat, syntax, tokenizer)
        return Job("chat", params, prompt, opened, chat.tools, syntax, tuple(messages)), info

    async def _image_runs(self, messages: Sequence[Message]) -> dict[bytes, tuple[int, ...]]:
        """Each image of the history as the ids its prompt holds, registered with the model's
        projector; a model without one, or a file that is not an image, is a 400 in words."""
        runs: dict[bytes, tuple[int, ...]] = {}
        for message in messages:
            for image in message.images:
                if image not in runs:
                    try:
                        runs[image] = tuple(await self.engine.image_run(image))
                    except EngineError as exc:
                        raise ApiError(400, str(exc), param="messages") from None
        return runs

    def _opens_reasoning(self, template: ChatTemplate) -> bool:
        """Whether the template's generation prompt ends inside `<think>` (the reply then
        starts with reasoning and only closes the tag)."""
        if template.key not in self._opened:
            self._opened[template.key] = opens_reasoning(template)
        return self._opened[template.key]

    async def generate(
        self, request: web.Request, job: Job, info: ModelInfo, respond: Respond
    ) -> web.StreamResponse:
        """Run the job on its conversation's slot (or refuse it: too long, a bad logit bias,
        too many at once); `respond` writes the reply in its API's shape."""
        if len(job.prompt) >= info.n_ctx:
            raise ApiError(
                400,
                f"The prompt is {len(job.prompt):,} tokens but the model's context holds "
                f"{info.n_ctx:,} (prompt and reply together). Leave out the oldest messages, "
                "or load the model with a larger context.",
                param="messages" if job.kind == "chat" else "prompt",
                code="context_length_exceeded",
            )
        if job.params.text_bias:
            job.params = with_text_bias(job.params, self.engine.local_tokenizer())
        bad = [t for t, _ in job.params.sampling.logit_bias if t >= info.n_vocab]
        if bad:
            raise ApiError(
                400,
                f"`logit_bias` names token ids outside the vocabulary (0 to {info.n_vocab - 1}): "
                f"{bad[:5]}.",
                param="logit_bias",
            )
        if self.stats.in_flight >= self.config.max_in_flight:
            raise ApiError(
                429,
                f"The server is busy with {self.stats.in_flight} requests; try again shortly.",
                kind="rate_limit_error",
                code="too_many_requests",
                retry_after=RETRY_AFTER_S,
            )
        self.stats.requests += 1
        self.stats.in_flight += 1
        job.client, job.endpoint = client_of(request.headers.get("User-Agent")), request.path
        slot = self.slots.acquire(job.prompt)
        held = list(job.prompt)  # what the slot holds when this request ends
        try:
            return await respond(request, job, slot, held)
        except asyncio.CancelledError:  # the client disconnected (aiohttp cancels the handler)
            self.client_left(job)
            raise
        finally:
            self.stats.in_flight -= 1
            self.slots.release(slot, held)
            self.prewarm.after_reply(slot)  # on disk soon: a crash keeps this KV

    async def run(
        self,
        job: Job,
        slot: str,
        held: list[int],
        reply: Reply,
        on_progress: ProgressCallback | None = None,
    ) -> AsyncIterator[tuple[str, list[int]]]:
        """Drive the engine: yields (text now safe to send, ids sampled since the last
        yield); afterwards `reply` holds the whole reply and its stats. `on_progress` hears
        the prompt's prefill chunk by chunk. Closing it early (a disconnect) cancels the
        generation, so the engine is free at once."""
        if job.params.max_tokens == 0:
            reply.stats = await self.engine.prefill(job.prompt, slot=slot, priority=Priority.USER)
            return
        room = self.engine.info.n_ctx - len(job.prompt)
        limit = job.params.max_tokens
        generation: Generation = await self.engine.generate(
            job.prompt,
            job.params.sampling,
            room if limit is None else min(limit, room),
            slot=slot,
            priority=Priority.USER,
            on_progress=on_progress,
        )
        try:
            async for event in generation:
                if reply.stopped:
                    continue  # cancelled at a stop sequence; the engine is winding down
                piece = reply.add(event.token_id, event.text, event.logprob, event.top)
                if reply.stopped:
                    generation.cancel()
                yield piece, [event.token_id]
            yield reply.finish(), []
            reply.stats = generation.stats
        finally:
            if generation.stats is None:
                generation.cancel()
            held.extend(reply.kept_tokens())

    def finish_reply(
        self, job: Job, reply: Reply, streamed: tuple[str, list[ToolCall]] | None = None
    ) -> tuple[str, str, list[ToolCall]]:
        """Count and log a finished reply, hand a chat reply to the sink, and keep its exact
        ids under the text (or the tool calls) the client saw: `streamed` (content, calls)
        as a ToolStream sent them, else as the whole reply parses; returns its (reasoning,
        content, calls)."""
        self.stats.answered()
        stats = reply.stats
        if stats is not None:
            self.stats.count(stats, len(reply.tokens))
            logger.info(
                "%s %s: prompt %d (cached %d), generated %d, ttft %.3f s",
                job.kind,
                job.id,
                stats.prompt_tokens,
                stats.reused_tokens,
                len(reply.tokens),
                stats.ttft_s,
            )
        if job.kind != "chat":
            return "", reply.text, []
        reasoning, content = split_reasoning(reply.text, opened=job.reasoning_opened)
        content, calls = streamed or reply_calls(job.tools, job.syntax, content)
        self._hand_over(job, reply, (reasoning, content, calls))  # before its ids are filed
        exact = reply.exact_tokens()
        if exact is not None and job.params.max_tokens != 0:
            self.replies.put(
                reply.text,
                exact,
                self.engine.info.fingerprint,
                reasoning=reasoning,
                content=content,
                calls=calls_key(content, [c.canonical() for c in calls]) if calls else None,
                prompt=job.prompt,
            )
        return reasoning, content, calls

    def _hand_over(self, job: Job, reply: Reply, split: tuple[str, str, list[ToolCall]]) -> None:
        """Give a finished chat reply, (reasoning, content, calls) as the client got them, to the
        server's sink, if it has one; a record it cannot take or a sink that fails is logged,
        and the client has its reply either way."""
        if self.sink is None or job.kind != "chat" or job.params.max_tokens == 0:
            return
        info = self.engine.info
        history = served_messages(job.messages, self.replies, info.fingerprint)
        if history is None:
            logger.info("chat %s: not kept (a system message inside the conversation)", job.id)
            return
        reasoning, content, calls = split
        exact = reply.exact_tokens()
        record = ServedReply(
            endpoint=job.endpoint,
            model=self.model_id,
            model_path=self.engine.options.model_path,
            fingerprint=info.fingerprint,
            system=history[0],
            messages=history[1],
            text=shown_text(reply.text, reasoning, content, calls),
            tool_calls=tuple(calls),
            prompt_tokens=tuple(job.prompt),
            reply_tokens=None if exact is None else tuple(exact),
            finish_reason="tool_calls" if calls else finish_reason(reply),
            stats=reply.stats.as_dict() if reply.stats else None,
            client=job.client,
        )
        try:
            self.sink.served(record)
        except Exception:  # the reply is the client's whatever the sink does; the log says why
            logger.exception("chat %s: served, but the reply sink failed to take it", job.id)

    def client_left(self, job: Job) -> None:
        self.stats.disconnected += 1
        logger.info("%s %s: the client left; its generation was cancelled", job.kind, job.id)


def _prefill(chat: ChatRequest) -> tuple[tuple[Message, ...], str]:
    """The messages the template renders and the start of the reply: a last assistant
    message (Anthropic's prefill, llama-server's continue) is not a turn of its own but the
    words the reply begins with; the reply sent back is what follows them."""
    last = chat.messages[-1]
    if last.role != "assistant":
        return chat.messages, ""
    return chat.messages[:-1], last.text


def with_text_bias(params: GenerationParams, tokenizer: Tokenizer) -> GenerationParams:
    """`params` with each biased text's tokens biased by id (an id given both ways keeps
    the id's bias)."""
    by_id = dict(params.sampling.logit_bias)
    for text, bias in params.text_bias:
        for token in tokenizer.tokenize(text):
            by_id.setdefault(token, bias)
    sampling = dataclasses.replace(params.sampling, logit_bias=tuple(sorted(by_id.items())))
    return dataclasses.replace(params, sampling=sampling, text_bias=())
