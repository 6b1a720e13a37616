"""The engine process: one backend, a work queue ordered by priority, replies over a pipe.

Started by the engine host as `python -m app.engine FD BACKEND`. A reader thread takes
requests and cancels off the connection while the main thread runs one job at a time, so a
cancel or a more urgent request lands between two tokens of the running one.

`STOKE_TEST_CRASH_FIRST_DECODE=1` (tests only) makes the process die by SIGSEGV at the first
decode after a load unless the load was conservative, as llama.cpp's AMX matmul does on the
machines it fails on, so the host's safe-mode restart can be tested on any CPU.
"""

from __future__ import annotations

import functools
import heapq
import os
import signal
import threading
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from multiprocessing.connection import Connection
from typing import Any

from app.engine.images import no_vision
from app.engine.llamacpp.openmp import spin_briefly
from app.engine.protocol import (
    CancelToken,
    Engine,
    EngineError,
    FinishReason,
    GenerationStats,
    LoadOptions,
    ModelInfo,
)
from app.engine.safe_mode import is_conservative
from app.engine.transcript import Tokenizer


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


_IMMEDIATE = frozenset({"tokenize", "detokenize"})  # answered at once, beside running work
ENGINES = ("llama.cpp", "mlx", "remote")  # the backends, by the names EngineClient takes


def load_tokenizer(backend: str, options: LoadOptions, info: ModelInfo | None) -> Tokenizer:
    """The backend's tokenizer for a model, loaded without the weights; `info` (the loaded
    model, if any) says which one a remote server's prompts use."""
    if backend == "llama.cpp":
        from app.engine.llamacpp.backend import load_vocab

        return load_vocab(options.model_path)
    if backend == "remote":
        from app.engine.remote import tokenizer_for

        return tokenizer_for(options, info)
    if backend == "mlx":
        from app.engine.mlx.models import load_tokenizer as load_mlx_tokenizer

        return load_mlx_tokenizer(options.model_path)
    raise EngineError(f"Unknown engine {backend!r}. Available: {', '.join(ENGINES)}.")


def make_engine(backend: str) -> Engine:
    """The backend object for a name; imported in the child only."""
    if backend == "llama.cpp":
        from app.engine.llamacpp.backend import LlamaCppEngine

        return LlamaCppEngine()
    if backend == "remote":
        from app.engine.remote import RemoteEngine

        return RemoteEngine()
    if backend == "mlx":
        from app.engine.mlx.backend import MlxEngine

        return MlxEngine()
    raise EngineError(f"Unknown engine {backend!r}. Available: {', '.join(ENGINES)}.")


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
        self.crash_first_decode = False  # the test hook above, armed by each load

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
                self.crash_first_decode = os.environ.get(
                    "STOKE_TEST_CRASH_FIRST_DECODE"
                ) == "1" and not is_conservative(args[0])
            elif method in ("generate", "prefill") and self.crash_first_decode:
                os.kill(os.getpid(), signal.SIGSEGV)
            elif method == "generate":
                self.send("state", EngineState.GENERATING)
                result = None
                progress = functools.partial(self.send, "event", req_id)  # prefill chunks
                events = self.engine.generate(*args, cancel=cancel, progress=progress, **kwargs)
                for event in events:
                    if isinstance(event, GenerationStats):
                        result = event
                    else:
                        self.send("event", req_id, event)
            elif method == "prefill":
                self.send("state", EngineState.PREFILLING)
                progress = functools.partial(self.send, "event", req_id)  # as a reply's
                result = self.engine.prefill(*args, cancel=cancel, progress=progress, **kwargs)
            elif method == "embed" and not hasattr(self.engine, "embed"):
                raise EngineError(
                    "This model's engine does not make embeddings: a GGUF model on llama.cpp "
                    "does (MLX models and remote servers do not, here)."
                )
            elif method == "image_run" and not hasattr(self.engine, "image_run"):
                raise EngineError(no_vision(self.engine.info))
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


def main(fd: int, backend: str) -> None:
    """Serve requests on the inherited connection `fd` until it closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C belongs to the app, not the engine
    spin_briefly()  # before llama.cpp (and its OpenMP) loads: llamacpp/openmp.py says why
    child = _Child(Connection(fd), backend)
    threading.Thread(target=child.read_loop, name="engine-reader", daemon=True).start()
    try:
        child.work_loop()
    finally:
        if child.engine is not None:
            child.engine.unload()  # snapshots resident conversations before the process ends
