"""A real `ApiServer` on a real loopback socket, in a thread with its own event loop and its
own engine process (on the default model unless told another, such as the tests' tiny chat
model for mechanism tests); tests talk to it with the official openai client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import openai

from app.engine.host import EngineClient
from app.engine.protocol import LoadOptions
from app.models.default import default_model_path
from app.pool.engines import EnginePool
from app.server.app import ApiServer
from app.server.requests import ServerConfig

API_KEY = "sk-test-key"
TOPICS = ("harbour", "glacier", "orchard", "lighthouse", "violin", "comet", "market", "forest")


def document(topic: str, facts: int = 40) -> str:
    """A few hundred tokens of distinct text, so each conversation has its own prefix."""
    lines = [
        f"Notes on the {topic} of town {i}: it has {i * 3 + 1} {topic}s." for i in range(facts)
    ]
    return f"[{topic}] Read these notes.\n" + "\n".join(lines)


class ServerThread:
    def __init__(
        self,
        *,
        model: str | None = None,  # None: the default model
        n_ctx: int = 4096,
        n_seq_max: int = 4,
        backend: str | None = None,
        pool: Callable[[], EnginePool] | None = None,  # models on demand, instead of one engine
        **config: Any,
    ) -> None:
        model = model or str(default_model_path())
        self.options = LoadOptions(model, n_ctx=n_ctx, n_seq_max=n_seq_max)
        self.backend = backend  # None: the platform's engine
        self.make_pool = pool
        self.pool: EnginePool | None = None
        self.config = ServerConfig(api_key=API_KEY, port=0, **config)
        self.loop = asyncio.new_event_loop()
        self.engine: EngineClient | None = None
        self.server: ApiServer | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self.call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    async def _start(self) -> None:
        if self.make_pool is not None:
            self.pool = self.make_pool()
            await self.pool.start()
            self.engine = self.pool.default.engine
            self.server = ApiServer(self.pool, self.config)
        else:
            self.engine = EngineClient(self.options, backend=self.backend)
            await self.engine.start()
            self.server = ApiServer(self.engine, self.config)
        await self.server.start()

    async def _stop(self) -> None:
        await self.server.stop()
        if self.pool is not None:
            await self.pool.close()
        else:
            await self.engine.close()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 120) -> Any:
        future: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def model(self) -> str:
        return self.server.model_id

    def client(self, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=API_KEY, max_retries=0, **kwargs)
