"""The engine host: the backend runs in a child process, the app talks to it with asyncio.

A crash or out-of-memory inside a runtime must never take the window or the conversation with
it, so the runtime lives in a child. The client never blocks the event loop: a reader thread
turns the child's messages into asyncio futures and queues. Work is ordered by priority and a
user's send preempts a background prefill. A dead child is noticed (the pipe closes), every
request in flight fails with EngineCrashedError, and the child is restarted with the same model.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from multiprocessing.connection import Connection
from typing import Any

from app.engine.protocol import (
    CancelToken,
    Engine,
    EngineError,
    FinishReason,
    GenerationStats,
    LoadOptions,
    ModelInfo,
    SamplingParams,
    TokenEvent,
)


class Priority(IntEnum):
    """Lower runs first. A USER request preempts a running prefill of lower priority."""

    USER = 0
    TYPING = 1
    BACKGROUND = 2


class EngineState(StrEnum):
    STOPPED = "stopped"
    LOADING = "loading"
    READY = "ready"
    PREFILLING = "prefilling"
    GENERATING = "generating"
    CRASHED = "crashed"
    FAILED = "failed"  # the model could not be loaded


class EngineCrashedError(EngineError):
    """The engine process died; the client restarts it."""


_IMMEDIATE = frozenset({"tokenize", "detokenize"})  # answered at once, beside running work


def make_engine(backend: str) -> Engine:
    """The backend object for a name; imported in the child only."""
    if backend == "llama.cpp":
        from app.engine.llamacpp.backend import LlamaCppEngine

        return LlamaCppEngine()
    raise EngineError(f"Unknown engine {backend!r}. Available: llama.cpp.")


# -- the child process ---------------------------------------------------------------------


@dataclass(order=True)
class _Job:
    priority: int
    order: int
    req_id: int = field(compare=False)
    method: str = field(compare=False)
    args: tuple = field(compare=False)
    kwargs: dict = field(compare=False)
    cancel: CancelToken = field(compare=False, default_factory=CancelToken)


class _Child:
    """Runs in the engine process: a reader thread queues jobs, the main thread works."""

    def __init__(self, conn: Connection, backend: str) -> None:
        self.conn = conn
        self.backend = backend
        self.engine: Engine | None = None
        self.send_lock = threading.Lock()
        self.cond = threading.Condition()
        self.queue: list[_Job] = []
        self.jobs: dict[int, _Job] = {}
        self.running: _Job | None = None
        self.closing = False

    def send(self, *message: Any) -> None:
        with self.send_lock:
            self.conn.send(message)

    def read_loop(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                message = ("shutdown",)
            kind = message[0]
            if kind == "shutdown":
                with self.cond:
                    self.closing = True
                    for job in self.jobs.values():
                        job.cancel.cancel()
                    self.cond.notify()
                return
            if kind == "cancel":
                with self.cond:
                    job = self.jobs.get(message[1])
                    if job is not None:
                        job.cancel.cancel()
                continue
            _, req_id, priority, method, args, kwargs = message
            if method in _IMMEDIATE and self.engine is not None:
                self.answer(req_id, method, args, kwargs, None)
                continue
            job = _Job(priority, req_id, req_id, method, args, kwargs)
            with self.cond:
                self.jobs[req_id] = job
                heapq.heappush(self.queue, job)
                running = self.running
                if running and running.method == "prefill" and priority < running.priority:
                    running.cancel.cancel()  # a user's send preempts a background prefill
                self.cond.notify()

    def work_loop(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closing:
                    self.cond.wait()
                if self.closing:
                    return
                job = heapq.heappop(self.queue)
                self.running = job
            if job.cancel.cancelled and job.method in ("generate", "prefill"):
                self.send("done", job.req_id, _cancelled_stats(len(job.args[0])))
            else:
                self.answer(job.req_id, job.method, job.args, job.kwargs, job.cancel)
            with self.cond:
                self.running = None
                self.jobs.pop(job.req_id, None)

    def answer(self, req_id: int, method: str, args: tuple, kwargs: dict, cancel) -> None:
        try:
            if method == "load":
                if self.engine is None:
                    self.engine = make_engine(self.backend)
                result = self.engine.load(*args)
            elif method == "generate":
                self.send("state", EngineState.GENERATING)
                result = None
                for event in self.engine.generate(*args, cancel=cancel, **kwargs):
                    if isinstance(event, GenerationStats):
                        result = event
                    else:
                        self.send("event", req_id, event)
            elif method == "prefill":
                self.send("state", EngineState.PREFILLING)
                result = self.engine.prefill(*args, cancel=cancel, **kwargs)
            else:
                result = getattr(self.engine, method)(*args, **kwargs)
        except Exception as exc:  # every failure travels back to the caller as words
            if not isinstance(exc, EngineError):
                exc = EngineError(f"The engine failed: {type(exc).__name__}: {exc}")
            self.send("error", req_id, exc, None)
        else:
            self.send("done", req_id, result)
        finally:
            if method in ("generate", "prefill"):
                self.send("state", EngineState.READY)


def _cancelled_stats(prompt_tokens: int) -> GenerationStats:
    """What a request cancelled before it started reports."""
    return GenerationStats(prompt_tokens, 0, 0, 0, 0.0, 0.0, 0.0, FinishReason.CANCELLED)


def _child_main(conn: Connection, backend: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C belongs to the app, not the engine
    child = _Child(conn, backend)
    threading.Thread(target=child.read_loop, name="engine-reader", daemon=True).start()
    child.work_loop()


# -- the asyncio client --------------------------------------------------------------------


class Generation:
    """A streaming reply: iterate for TokenEvents; `stats` is set when it ends."""

    def __init__(self, client: EngineClient, req_id: int) -> None:
        self._client = client
        self.req_id = req_id
        self.queue: asyncio.Queue[TokenEvent | GenerationStats | BaseException] = asyncio.Queue()
        self.stats: GenerationStats | None = None
        self.tokens: list[int] = []

    def cancel(self) -> None:
        """Stop after the current token; the stats then say `cancelled`."""
        self._client._send_cancel(self.req_id)

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TokenEvent]:
        while True:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, GenerationStats):
                self.stats = item
                return
            self.tokens.append(item.token_id)
            yield item


@dataclass
class _Pending:
    future: asyncio.Future | None = None
    generation: Generation | None = None


class EngineClient:
    """The app's handle on the engine process. All methods are coroutines or non-blocking."""

    MAX_RESTARTS = 3
    RESTART_WINDOW_S = 60.0

    def __init__(
        self,
        options: LoadOptions,
        *,
        backend: str = "llama.cpp",
        on_state: Callable[[EngineState, str], None] | None = None,
    ) -> None:
        self.options = options
        self.backend = backend
        self.info: ModelInfo | None = None
        self.state = EngineState.STOPPED
        self.last_error = ""
        self._on_state = on_state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._process: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._ready: asyncio.Future[ModelInfo] | None = None
        self._restarts: list[float] = []
        self._closing = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    # -- lifecycle --

    async def start(self) -> ModelInfo:
        """Spawn the engine process and load the model; raises ModelLoadError with reasons."""
        self._loop = asyncio.get_running_loop()
        self._closing = False
        self._ready = self._loop.create_future()
        self._spawn()
        return await self._ready

    def _spawn(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        process = ctx.Process(
            target=_child_main, args=(child, self.backend), name="stoke-engine", daemon=True
        )
        process.start()
        child.close()
        self._process, self._conn = process, parent
        threading.Thread(
            target=self._read_loop, args=(parent, process), name="engine-client", daemon=True
        ).start()
        self._set_state(EngineState.LOADING, "")
        self._loop.create_task(self._load())

    async def _load(self) -> None:
        ready = self._ready
        try:
            info = await self._call("load", (self.options,), priority=Priority.USER)
        except EngineCrashedError:
            return  # _on_child_died has handled it
        except EngineError as exc:
            self._set_state(EngineState.FAILED, str(exc))
            if ready is not None and not ready.done():
                ready.set_exception(exc)
            self._stop_process()
            return
        self.info = info
        self._set_state(EngineState.READY, "")
        if ready is not None and not ready.done():
            ready.set_result(info)

    async def ready(self) -> ModelInfo:
        """Wait until the engine has a model loaded (after a start or a restart)."""
        if self._ready is None:
            raise EngineError("The engine has not been started.")
        return await asyncio.shield(self._ready)

    async def close(self) -> None:
        self._closing = True
        if self._conn is not None:
            with contextlib.suppress(EngineCrashedError):
                self._send(("shutdown",))
        process = self._process
        if process is not None:
            await asyncio.get_running_loop().run_in_executor(None, process.join, 5)
            if process.is_alive():
                process.kill()
        self._stop_process()
        self._set_state(EngineState.STOPPED, "")

    def _stop_process(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    # -- requests --

    async def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return await self._call("tokenize", (text,), {"special": special})

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return await self._call("detokenize", (list(tokens),))

    async def prefill(
        self,
        tokens: Sequence[int],
        *,
        slot: str = "default",
        priority: Priority = Priority.BACKGROUND,
    ) -> GenerationStats:
        """Prefill-only (the max_tokens 0 prewarm). Preempted or cancelled: `cancelled`."""
        await self.ready()
        return await self._call("prefill", (list(tokens),), {"slot": slot}, priority=priority)

    async def generate(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        max_tokens: int,
        *,
        slot: str = "default",
        priority: Priority = Priority.USER,
    ) -> Generation:
        """Start a reply; iterate the returned Generation for tokens."""
        await self.ready()
        req_id = next(self._ids)
        generation = Generation(self, req_id)
        self._pending[req_id] = _Pending(generation=generation)
        self._send(
            (
                "call",
                req_id,
                int(priority),
                "generate",
                (list(tokens), sampling, max_tokens),
                {"slot": slot},
            )
        )
        return generation

    async def _call(
        self, method: str, args: tuple = (), kwargs: dict | None = None, *, priority: int = 0
    ) -> Any:
        future = self._loop.create_future()
        req_id = next(self._ids)
        self._pending[req_id] = _Pending(future=future)
        self._send(("call", req_id, int(priority), method, args, kwargs or {}))
        return await future

    def _send(self, message: tuple) -> None:
        conn = self._conn
        if conn is None:
            raise EngineCrashedError(self.last_error or "The engine is not running.")
        try:
            with self._send_lock:
                conn.send(message)
        except (OSError, ValueError) as exc:
            raise EngineCrashedError("The engine stopped unexpectedly.") from exc

    def _send_cancel(self, req_id: int) -> None:
        with contextlib.suppress(EngineCrashedError):
            self._send(("cancel", req_id))

    # -- the reader thread and its hand-off to the loop --

    def _read_loop(self, conn: Connection, process: mp.process.BaseProcess) -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            self._loop.call_soon_threadsafe(self._dispatch, message)
        process.join(timeout=5)
        self._loop.call_soon_threadsafe(self._on_child_died, process, process.exitcode)

    def _dispatch(self, message: tuple) -> None:
        kind = message[0]
        if kind == "state":
            self._set_state(message[1], "")
            return
        req_id = message[1]
        pending = self._pending.get(req_id)
        if pending is None:
            return
        if kind == "event":
            pending.generation.queue.put_nowait(message[2])
            return
        del self._pending[req_id]
        if kind == "done":
            result = message[2]
            if pending.generation is not None:
                pending.generation.queue.put_nowait(result)
            elif not pending.future.done():
                pending.future.set_result(result)
            return
        error = message[2]
        if pending.generation is not None:
            pending.generation.queue.put_nowait(error)
        elif not pending.future.done():
            pending.future.set_exception(error)

    def _on_child_died(self, process: mp.process.BaseProcess, exitcode: int | None) -> None:
        if process is not self._process:
            return  # an old child we already replaced
        self._process = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._closing:
            return
        reason = _describe_exit(exitcode)
        crash = EngineCrashedError(f"The engine stopped unexpectedly ({reason}). Restarting it.")
        for pending in self._pending.values():
            if pending.generation is not None:
                pending.generation.queue.put_nowait(crash)
            elif not pending.future.done():
                pending.future.set_exception(crash)
        self._pending.clear()
        if self.state == EngineState.FAILED:
            return
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < self.RESTART_WINDOW_S] + [now]
        if len(self._restarts) > self.MAX_RESTARTS:
            message = (
                f"The engine crashed {len(self._restarts)} times in a minute ({reason}); "
                "it was not restarted. Try a smaller context or another model."
            )
            self._set_state(EngineState.FAILED, message)
            failed = EngineError(message)
            if self._ready is None or self._ready.done():
                self._ready = self._loop.create_future()
            self._ready.set_exception(failed)
            self._ready.exception()  # mark retrieved: callers get it from ready()
            return
        self._set_state(EngineState.CRASHED, str(crash))
        if self._ready is None or self._ready.done():
            self._ready = self._loop.create_future()
        self._spawn()

    def _set_state(self, state: EngineState, detail: str) -> None:
        self.state = state
        if detail:
            self.last_error = detail
        if self._on_state is not None:
            self._on_state(state, detail)


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "no exit code"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"
