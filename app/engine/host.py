"""The engine host: the backend runs in a child process, the app talks to it with asyncio.

A crash or out-of-memory inside a runtime must never take the window or the conversation with
it, so the runtime lives in a child. The client never blocks the event loop: a reader thread
turns the child's messages into asyncio futures and queues. Work is ordered by priority and a
user's send preempts a background prefill. A dead child is noticed (the pipe closes), every
request in flight fails with EngineCrashedError, and the child is restarted with the same model.

One crash is different: a child killed by a signal in the first decode after a load (llama.cpp's
AMX matmul on some Intel CPUs does that). The host then restarts it once with conservative
settings (engine/safe_mode.py), records that for this model, machine and load settings so later
starts with those settings load it that way at once, tells its notice listeners in one line,
and sends the decode that was in flight again, so the turn completes. A second crash is
reported as any other. Each `start` asks the records afresh, so a model switch or a changed
setting leaves safe mode behind; `clear_safe_mode` forgets the record of the model.

An engine split over llama.cpp rpc-servers dies when one of them goes away (ggml-rpc aborts
its process on a lost server). The host then asks each server whether it still answers and
says which one went, in words; the reply so far is kept by its caller, as after any crash; and
the model loads again without that server (`rpc_devices.without`: this machine takes its
layers) or, with `rpc_on_drop` "wait", once every server answers again.

Crashes that come too fast (more than MAX_RESTARTS in RESTART_WINDOW_S) are a loop: the host
waits out each of `backoff_s` in turn and tries again with conservative settings, and only when
those are spent does it give up (state FAILED), so a server's supervisor can restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from app.engine import rpc_devices, safe_mode
from app.engine.choice import choose_engine
from app.engine.protocol import (
    EngineError,
    GenerationStats,
    LoadOptions,
    ModelInfo,
    PrefillProgress,
    ProgressCallback,
    SamplingParams,
    TokenEvent,
)
from app.engine.transcript import Tokenizer
from app.engine.worker import EngineState, Priority, load_tokenizer

__all__ = ["EngineClient", "EngineCrashedError", "EngineState", "Generation", "Priority"]


StateListener = Callable[[EngineState, str], None]
NoticeListener = Callable[[str], None]
_DECODES = ("generate", "prefill")
# Deaths by these signals are the runtime's own faults, worth a conservative retry.
_CRASH_SIGNALS = frozenset(
    int(s) for s in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)
)
SHUTDOWN_S = 60.0  # a clean exit writes snapshots of resident conversations first
SERVER_POLL_S = 2.0  # how often a host waiting for a lost rpc-server asks again


class EngineCrashedError(EngineError):
    """The engine process died; the client restarts it."""


# -- the asyncio client --------------------------------------------------------------------


class Generation:
    """A streaming reply: iterate for TokenEvents; `stats` is set when it ends."""

    def __init__(self, client: EngineClient, req_id: int) -> None:
        self._client = client
        self.req_id = req_id
        self.progress: PrefillProgress | None = None  # the prompt's prefill, as last heard
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
    message: tuple = ()  # as sent, so a decode can be sent again after a safe-mode restart
    on_progress: ProgressCallback | None = None  # a decode's prompt, chunk by chunk

    def untouched_decode(self) -> bool:
        """A generate or prefill that has not yielded anything yet: safe to send again."""
        if len(self.message) < 4 or self.message[3] not in _DECODES:
            return False
        return self.generation is None or (
            not self.generation.tokens and self.generation.queue.empty()
        )


class EngineClient:
    """The app's handle on the engine process. All methods are coroutines or non-blocking."""

    MAX_RESTARTS = 3
    RESTART_WINDOW_S = 60.0
    BACKOFF_S = (5.0, 20.0, 60.0)  # waits before each retry of a crash loop; then give up

    def __init__(
        self,
        options: LoadOptions,
        *,
        backend: str | None = None,  # default: engine/choice.py's pick for the options
        on_state: StateListener | None = None,
        log_path: Path | None = None,
        backoff_s: Sequence[float] | None = None,  # default: BACKOFF_S
    ) -> None:
        self.options = options
        self._backend = backend
        self.info: ModelInfo | None = None
        self.state = EngineState.STOPPED
        self.last_error = ""
        self._listeners: list[StateListener] = [on_state] if on_state else []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._log_path = log_path or Path(os.devnull)
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._ready: asyncio.Future[ModelInfo] | None = None
        self._restarts: list[float] = []
        self._closing = False
        self._tokenizer: tuple[tuple[str, str, str | None], Tokenizer] | None = None
        self._reader: threading.Thread | None = None
        self.notices: list[str] = []  # one line each: what the host changed and why
        self._notice_listeners: list[NoticeListener] = []
        self._safe_records = safe_mode.SafeModeRecords()
        self._safe = False  # conservative settings for this load (a crash, or its record)
        self._first_decode = True  # no decode has finished since the child loaded
        self._resend: list[tuple] = []  # decodes to send again once the child is ready
        self._backoff_s = tuple(self.BACKOFF_S if backoff_s is None else backoff_s)
        self._backoffs = 0  # waits used in the current crash loop (a finished decode resets)
        self._retry: asyncio.TimerHandle | None = None
        self.retry_at: float | None = None  # time.monotonic() of the next retry, while waiting

    @property
    def backend(self) -> str:
        """The backend the child runs: fixed by the caller, or chosen from the current
        options (a model switch may change the engine)."""
        return self._backend or choose_engine(self.options).engine

    def add_state_listener(self, listener: StateListener) -> None:
        """Called on the event loop with (state, detail) whenever the engine's state changes."""
        self._listeners.append(listener)

    def add_notice_listener(self, listener: NoticeListener) -> None:
        """Called on the event loop with one line whenever the host changes a setting itself."""
        self._notice_listeners.append(listener)

    @property
    def launch_options(self) -> LoadOptions:
        """What the child loads: the options, made conservative after a first-decode crash
        of this model on this machine (now or recorded earlier)."""
        return safe_mode.conservative(self.options) if self._safe else self.options

    def _notice(self, text: str) -> None:
        self.notices.append(text)
        for listener in self._notice_listeners:
            listener(text)

    def local_tokenizer(self) -> Tokenizer:
        """The model's tokenizer in this process (vocab only, no weights), for building
        prompts synchronously; tokenizing through the engine process would need a round trip
        per piece."""
        fingerprint = self.info.fingerprint if self.info else None
        key = (self.backend, self.options.model_path, fingerprint)
        if self._tokenizer is None or self._tokenizer[0] != key:
            self._tokenizer = (key, load_tokenizer(self.backend, self.options, self.info))
        return self._tokenizer[1]

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    # -- lifecycle --

    async def start(self) -> ModelInfo:
        """Spawn the engine process and load the model; raises ModelLoadError with reasons."""
        self._loop = asyncio.get_running_loop()
        self._closing = False
        self._safe = False  # the options may have changed since: the records decide again
        self._ready = self._loop.create_future()
        self._spawn()
        info = await self._ready
        self._say_cut_context(info)
        return info

    def _spawn(self) -> None:
        if not self._safe and self.backend != "remote":
            record = self._safe_records.lookup(self.backend, self.options)
            if record is not None:
                self._safe = True
                self._notice(
                    f"Loading {Path(self.options.model_path).name} with conservative settings "
                    f"({safe_mode.CHANGES}): it crashed on this machine before "
                    f"({record.get('recorded_at', 'earlier')})."
                )
        self._first_decode = True
        ours, theirs = socket.socketpair()
        with theirs, self._log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "app.engine", str(theirs.fileno()), self.backend],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        parent = Connection(ours.detach())
        self._process, self._conn = process, parent
        self._reader = threading.Thread(
            target=self._read_loop, args=(parent, process), name="engine-client", daemon=True
        )
        self._reader.start()
        self._set_state(EngineState.LOADING, "")
        self._loop.create_task(self._load())

    async def _load(self) -> None:
        ready = self._ready
        try:
            info = await self._call("load", (self.launch_options,), priority=Priority.USER)
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
        resend, self._resend = self._resend, []
        for message in resend:
            self._send(message)
        if ready is not None and not ready.done():
            ready.set_result(info)

    def _say_cut_context(self, info: ModelInfo) -> None:
        """A context asked past what the model was trained on is cut to it by both local
        engines (each conversation's window): a notice says so once per start, with both
        numbers."""
        asked, trained = self.options.n_ctx, info.n_ctx_train
        if self.backend == "remote" or self.options.kv_unified or not 0 < trained < asked:
            return
        self._notice(
            f"{info.name} was trained on a context of {trained:,} tokens: each conversation "
            f"gets {info.n_ctx:,}, not the {asked:,} the settings ask for."
        )

    def safe_mode(self) -> str | None:
        """The safe-mode record this model's loads follow, in one sentence (None: none): the
        model crashed here under these very load settings, so it loads conservatively until
        they change or the record is cleared."""
        if self.backend == "remote":
            return None
        record = self._safe_records.lookup(self.backend, self.options, expire=False)
        return safe_mode.words(record) if record else None

    def clear_safe_mode(self) -> None:
        """Forget that this model crashed here: its next start loads it with its own settings
        (the running engine keeps its conservative ones until then)."""
        self._safe_records.clear(self.options.model_path)

    async def ready(self) -> ModelInfo:
        """Wait until the engine has a model loaded (after a start or a restart)."""
        if self._ready is None:
            raise EngineError("The engine has not been started.")
        return await asyncio.shield(self._ready)

    async def close(self) -> None:
        self._closing = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = self.retry_at = None
        if self._conn is not None:
            with contextlib.suppress(EngineCrashedError):
                self._send(("shutdown",))
        process, loop = self._process, asyncio.get_running_loop()
        if process is not None:
            try:
                await loop.run_in_executor(None, process.wait, SHUTDOWN_S)
            except subprocess.TimeoutExpired:
                process.kill()
        self._stop_process()
        if self._reader is not None:
            await loop.run_in_executor(None, self._reader.join, 5)
        # A call the child never answered (a background snapshot queued behind the shutdown)
        # fails now rather than waiting forever: the pool closes engines mid-run.
        self._fail_pending(EngineCrashedError("The engine was stopped."))
        self._set_state(EngineState.STOPPED, "")

    def _stop_process(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    # -- requests --

    async def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return await self._call("tokenize", (text,), {"special": special})

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return await self._call("detokenize", (list(tokens),))

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One L2-normalised vector per input's tokens (a GGUF model on llama.cpp)."""
        return await self._call("embed", ([list(t) for t in inputs],), priority=Priority.USER)

    async def image_run(self, data: bytes) -> list[int]:
        """The ids a prompt holds for an image file's bytes (engine/images.py), registered
        with the model's projector; EngineError in words for a model that reads no images or
        a file that is not a usable image."""
        return await self._call("image_run", (data,), priority=Priority.USER)

    async def snapshot(
        self, slot: str, *, priority: Priority = Priority.BACKGROUND, wait: bool = False
    ) -> int:
        """Save the slot's KV to the RAM and disk tiers (in the background by default);
        with `wait`, return once it is on disk."""
        await self.ready()
        return await self._call("snapshot", (slot,), {"wait": wait}, priority=priority)

    async def resident_tokens(self, slot: str = "default") -> list[int]:
        return await self._call("resident_tokens", (slot,))

    async def prefill(
        self,
        tokens: Sequence[int],
        *,
        slot: str = "default",
        priority: Priority = Priority.BACKGROUND,
        on_progress: ProgressCallback | None = None,
        prefill_chunk: int = 0,
    ) -> GenerationStats:
        """Prefill-only (the max_tokens 0 prewarm). Preempted or cancelled: `cancelled`.
        `on_progress` and `prefill_chunk` as for `generate` (a draft's files are watched)."""
        await self.ready()
        kwargs = {"slot": slot, "prefill_chunk": prefill_chunk}
        return await self._call(
            "prefill", (list(tokens),), kwargs, priority=priority, on_progress=on_progress
        )

    async def generate(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        max_tokens: int,
        *,
        slot: str = "default",
        priority: Priority = Priority.USER,
        on_progress: ProgressCallback | None = None,
        prefill_chunk: int = 0,
    ) -> Generation:
        """Start a reply; iterate the returned Generation for tokens. `on_progress` hears
        the prompt's prefill, chunk by chunk (`prefill_chunk` tokens, 0: n_batch), on the
        event loop."""
        await self.ready()
        req_id = next(self._ids)
        generation = Generation(self, req_id)
        message = (
            "call",
            req_id,
            int(priority),
            "generate",
            (list(tokens), sampling, max_tokens),
            {"slot": slot, "prefill_chunk": prefill_chunk},
        )
        self._pending[req_id] = _Pending(
            generation=generation, message=message, on_progress=on_progress
        )
        self._send(message)
        return generation

    async def _call(
        self,
        method: str,
        args: tuple = (),
        kwargs: dict | None = None,
        *,
        priority: int = 0,
        on_progress: ProgressCallback | None = None,
    ) -> Any:
        future = self._loop.create_future()
        req_id = next(self._ids)
        message = ("call", req_id, int(priority), method, args, kwargs or {})
        self._pending[req_id] = _Pending(future=future, message=message, on_progress=on_progress)
        self._send(message)
        try:
            return await future
        except asyncio.CancelledError:
            self._pending.pop(req_id, None)
            self._send_cancel(req_id)  # the engine drops it, or stops it between batches
            raise

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

    def _read_loop(self, conn: Connection, process: subprocess.Popen) -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if not self._to_loop(self._dispatch, message):
                return
        try:
            exitcode = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            exitcode = process.wait()
        lost = rpc_devices.lost_servers(self.options) if not self._closing else []
        self._to_loop(self._on_child_died, process, exitcode, lost)

    def _to_loop(self, callback: Callable[..., None], *args: object) -> bool:
        """Hand a callback to the event loop; False once the loop has closed (app exit)."""
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            return False
        return True

    def _dispatch(self, message: tuple) -> None:
        kind = message[0]
        if kind == "state":
            self._set_state(message[1], "")
            return
        req_id = message[1]
        pending = self._pending.get(req_id)
        if pending is None:
            return
        if kind == "event" and isinstance(message[2], PrefillProgress):
            if pending.generation is not None:
                pending.generation.progress = message[2]
            if pending.on_progress is not None:
                pending.on_progress(message[2])
            return
        if kind == "event":
            self._first_decode = False
            pending.generation.queue.put_nowait(message[2])
            return
        del self._pending[req_id]
        if kind == "done":
            if pending.message[3] in _DECODES:
                self._first_decode = False
                self._backoffs = 0  # a decode finished: whatever loop there was is over
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

    def _on_child_died(
        self, process: subprocess.Popen, exitcode: int | None, lost: Sequence[str] = ()
    ) -> None:
        if process is not self._process:
            return  # an old child we already replaced
        self._process = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._closing:
            return
        reason = _describe_exit(exitcode)
        if lost:
            self._server_lost(lost, reason)
            return
        if self._retry_safely(exitcode, reason):
            return
        crash = EngineCrashedError(f"The engine stopped unexpectedly ({reason}). Restarting it.")
        self._fail_pending(crash)
        if self.state == EngineState.FAILED:
            return
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < self.RESTART_WINDOW_S] + [now]
        if len(self._restarts) > self.MAX_RESTARTS and self._backoffs < len(self._backoff_s):
            self._back_off(len(self._restarts), reason)
            return
        if len(self._restarts) > self.MAX_RESTARTS:
            retries = f" and {self._backoffs} slower retries" if self._backoffs else ""
            message = (
                f"The engine crashed {len(self._restarts)} times in a minute{retries} "
                f"({reason}); Stoke stopped restarting it. Try a smaller context or another "
                "model, and see the engine log for details."
            )
            self._set_state(EngineState.FAILED, message)
            failed = EngineError(message)
            self._renew_ready()
            self._ready.set_exception(failed)
            self._ready.exception()  # mark retrieved: callers get it from ready()
            return
        self._set_state(EngineState.CRASHED, str(crash))
        self._renew_ready()
        self._spawn()

    def _fail_pending(self, error: Exception) -> None:
        """Hand every waiting request the error: streams get it queued, calls raised."""
        for pending in self._pending.values():
            if pending.generation is not None:
                pending.generation.queue.put_nowait(error)
            elif not pending.future.done():
                pending.future.set_exception(error)
        self._pending.clear()

    def _renew_ready(self) -> None:
        """A new 'ready' future for the next engine, unless one is still waiting."""
        if self._ready is None or self._ready.done():
            self._ready = self._loop.create_future()

    def _server_lost(self, lost: Sequence[str], reason: str) -> None:
        """An rpc-server went away: say which, then load without it, or wait for it."""
        what = (
            f"The rpc-server at {', '.join(lost)} stopped answering, so the engine stopped "
            f"({reason}): the server ended, or the network to it dropped. The reply so far is "
            "kept."
        )
        if self.options.rpc_on_drop == "wait":
            then = "Stoke waits for it to come back, then loads the model as planned."
        else:
            self.options = rpc_devices.without(self.options, lost)
            then = "Stoke is loading the model again without it; its layers run on this machine."
        crash = EngineCrashedError(f"{what} {then}")
        self._fail_pending(crash)
        self._notice(f"{what} {then}")
        self._set_state(EngineState.CRASHED, str(crash))
        self._renew_ready()
        if self.options.rpc_on_drop == "wait":
            self._retry = self._loop.call_later(SERVER_POLL_S, self._poll_servers)
        else:
            self._spawn()

    def _poll_servers(self) -> None:
        """Waiting for lost rpc-servers: start the engine once every one answers again."""
        self._retry = None
        if self._closing or self._process is not None:
            return
        asked = self._loop.run_in_executor(None, rpc_devices.lost_servers, self.options, 1.0)

        def answered(future: asyncio.Future) -> None:
            if self._closing or self._process is not None:
                return
            if future.result():
                self._retry = self._loop.call_later(SERVER_POLL_S, self._poll_servers)
            else:
                self._spawn()

        asked.add_done_callback(answered)

    def _back_off(self, crashes: int, reason: str) -> None:
        """A crash loop: wait the next back-off, then start again, conservatively."""
        delay = self._backoff_s[self._backoffs]
        self._backoffs += 1
        self._restarts.clear()
        safer = ""
        if self.backend != "remote" and not self._safe:
            self._safe = True
            safer = f" with conservative settings ({safe_mode.CHANGES})"
        message = (
            f"The engine crashed {crashes} times in a minute ({reason}); trying again in "
            f"{delay:g} s{safer}."
        )
        self._notice(message)
        self._set_state(EngineState.CRASHED, message)
        self._renew_ready()
        self.retry_at = time.monotonic() + delay
        self._retry = self._loop.call_later(delay, self._spawn_after_backoff)

    def _spawn_after_backoff(self) -> None:
        self._retry = self.retry_at = None
        if not self._closing and self._process is None:
            self._spawn()

    def _retry_safely(self, exitcode: int | None, reason: str) -> bool:
        """After a first-decode death by a signal: restart once with conservative settings,
        keep the decodes in flight to send again, fail the rest. False: not that case."""
        decoding = [p for p in self._pending.values() if p.untouched_decode()]
        if (
            exitcode is None
            or -exitcode not in _CRASH_SIGNALS  # SIGKILL is the OOM killer or a user
            or not self._first_decode
            or not decoding
            or self._safe
            or safe_mode.is_conservative(self.options)
            or self.state == EngineState.FAILED
        ):
            return False
        self._safe = True
        self._safe_records.record(self.backend, self.options, reason)
        crash = EngineCrashedError(f"The engine stopped unexpectedly ({reason}). Restarting it.")
        for req_id, pending in list(self._pending.items()):
            if pending in decoding:
                continue
            del self._pending[req_id]
            if pending.generation is not None:
                pending.generation.queue.put_nowait(crash)
            elif not pending.future.done():
                pending.future.set_exception(crash)
        self._resend = [p.message for p in decoding]
        notice = (
            f"The engine crashed in its first decode ({reason}); Stoke restarted it with "
            f"conservative settings ({safe_mode.CHANGES}) and will keep them for this model "
            "on this machine while its load settings stay as they are."
        )
        self._notice(notice)
        self._restarts.append(time.monotonic())
        self._set_state(EngineState.CRASHED, notice)
        self._renew_ready()
        self._spawn()
        return True

    def _set_state(self, state: EngineState, detail: str) -> None:
        self.state = state
        if detail:
            self.last_error = detail
        for listener in self._listeners:
            listener(state, detail)


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "no exit code"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"
