"""The engine pool: one engine host per library model, loaded on demand within a budget.

A caller leases a model for the length of a request (`lease`, then `release`): the lease
loads it if it is not loaded, after unloading the least recently used unleased, unpinned
models until the planner's estimate of its need fits the budget (waiting for a leased one to
be released when only leased ones stand in the way). An engine unloads by closing its host,
whose worker snapshots every resident conversation's KV first (engine/slots.py's `unload`),
and a later load of that model restores a conversation that comes back from that snapshot by
its tokens: a restore, not a prefill. With a TTL, a model unleased for that long is unloaded;
the pinned model never is, by either. A model that cannot fit beside the pinned one, or at
all, is refused with `DoesNotFit`, in words.

Every decision runs on one event loop; loads and evictions take a lock, one at a time, while
a lease of a loaded model takes none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.engine.choice import choose_engine
from app.engine.host import EngineClient
from app.engine.protocol import EngineError, LoadOptions
from app.engine.worker import EngineState
from app.models.library import ModelEntry
from app.models.names import model_name
from app.pool.need import memory_need
from app.units import gib

log = logging.getLogger("stoke.pool")

MakeEngine = Callable[[LoadOptions], EngineClient]
# Bytes the loaded models may take: a number, a function asked once when first needed (the
# machine's memory, which takes a child process to read), or None for no limit.
Budget = int | Callable[[], int] | None


class DoesNotFit(EngineError):
    """A model the budget cannot hold now or ever; the message says why, in words."""


@dataclass
class Pooled:
    """One model of the pool: its engine host (loaded or not) and its bookkeeping."""

    engine: EngineClient
    need: int  # bytes when loaded, the planner's estimate
    entry: ModelEntry | None = None  # the library's record, where it came from the library
    fixed_name: str | None = None  # None: named after the engine's model (the window's switches)
    owned: bool = True  # False: someone else's engine (the window's), never loaded or unloaded here
    resident: bool = False  # loaded or loading
    leases: int = 0
    last_used: float = field(default_factory=time.monotonic)
    loading: asyncio.Future | None = None
    expiry: asyncio.TimerHandle | None = None

    @property
    def name(self) -> str:
        """The id clients name: the library's name, or the model file's."""
        if self.fixed_name is not None:
            return self.fixed_name
        path = self.engine.options.model_path
        if path:
            return model_name(path)
        return self.engine.info.name if self.engine.info else "stoke"

    @property
    def state(self) -> str:
        """`loaded`, `loading` or `unloaded`, as /v1/models says it."""
        if not self.resident and self.owned:
            return "unloaded"
        if self.engine.state == EngineState.LOADING:
            return "loading"
        return "loaded" if self.engine.info is not None else "unloaded"

    @property
    def backend(self) -> str:
        return choose_engine(self.engine.options).engine


class EnginePool:
    """The models a server (and the window) can answer with, and which of them are loaded."""

    def __init__(
        self,
        models: Sequence[Pooled],
        *,
        default: str,
        budget: Budget = None,
        ttl_s: float | None = None,  # None: idle models stay
        pin: str | None = None,
    ) -> None:
        self._models = {m.name: m for m in models}
        self.default_name = default
        self._budget = budget
        self.ttl_s = ttl_s
        self.pin = pin
        self._lock = asyncio.Lock()
        self._released = asyncio.Event()
        for name in (default, pin):
            if name is not None and name not in self._models:
                raise KeyError(name)

    @classmethod
    def of_engine(cls, engine: EngineClient) -> EnginePool:
        """A pool of one engine someone else starts, switches and closes (the window's)."""
        model = Pooled(engine, need=0, owned=False, resident=True)
        pool = cls([model], default=model.name)
        pool.default_name = ""  # followed: the engine's model may be switched under it
        return pool

    @classmethod
    def of_library(
        cls,
        entries: Sequence[ModelEntry],
        default: LoadOptions,
        options_for: Callable[[ModelEntry], LoadOptions],
        make_engine: MakeEngine,
        *,
        budget: Budget = None,
        ttl_s: float | None = None,
        pin: str | None = None,
    ) -> EnginePool:
        """The library's models, each loading with `options_for(entry)`, and the default model
        with `default` (a library model, or a file outside it). `pin` names a model to keep."""
        models: list[Pooled] = []
        default_path = Path(default.model_path).expanduser().resolve()
        default_name = None
        for entry in entries:
            is_default = entry.path.resolve() == default_path
            options = default if is_default else options_for(entry)
            models.append(Pooled(make_engine(options), memory_need(options, entry.files), entry))
            models[-1].fixed_name = entry.name
            default_name = entry.name if is_default else default_name
        if default_name is None:
            default_name = model_name(default.model_path)
            models.append(
                Pooled(make_engine(default), memory_need(default), fixed_name=default_name)
            )
        # the default first: clients that take the first model /v1/models lists get it
        models.sort(key=lambda m: m.name != default_name)
        if pin is not None:
            pin = _named(models, pin)
        return cls(models, default=default_name, budget=budget, ttl_s=ttl_s, pin=pin)

    # -- what there is -------------------------------------------------------------------

    @property
    def budget(self) -> int | None:
        """The budget in bytes; None while unlimited or not yet asked of the machine."""
        return None if callable(self._budget) else self._budget

    async def _resolve_budget(self) -> int | None:
        if callable(self._budget):  # off the loop: reading the machine takes a child process
            self._budget = await asyncio.to_thread(self._budget)
        return self._budget

    @property
    def models(self) -> list[Pooled]:
        return list(self._models.values())

    @property
    def default(self) -> Pooled:
        if not self.default_name:  # a pool of one engine, whatever it runs now
            return next(iter(self._models.values()))
        return self._models[self.default_name]

    def find(self, name: str | None) -> Pooled | None:
        """The model a request names, by its name, its file's name or its library id (None or
        empty: the default); None when there is none."""
        if not name:
            return self.default
        for model in self._models.values():
            if name in (model.name, _path(model).name) or (model.entry and model.entry.id == name):
                return model
        return None

    def pinned(self, model: Pooled) -> bool:
        return model.name == self.pin or not model.owned

    # -- leases --------------------------------------------------------------------------

    async def lease(self, model: Pooled) -> Pooled:
        """Load `model` if it is not loaded (making room first) and hold it loaded until
        `release`. Raises DoesNotFit in words, or the engine's load error."""
        model.leases += 1
        if model.expiry is not None:
            model.expiry.cancel()
            model.expiry = None
        try:
            await self._load(model)
        except BaseException:
            self.release(model)
            raise
        model.last_used = time.monotonic()
        return model

    def release(self, model: Pooled) -> None:
        model.leases -= 1
        model.last_used = time.monotonic()
        self._released.set()
        if model.leases == 0:
            self._expire_later(model)

    async def start(self) -> None:
        """Load the default model (and the pinned one), as `stoke serve` does before serving."""
        for name in dict.fromkeys(n for n in (self.default_name, self.pin) if n):
            model = self._models[name]
            await self.lease(model)
            self.release(model)

    async def close(self) -> None:
        """Unload every model this pool loaded (each snapshotting its conversations)."""
        for model in self._models.values():
            if model.expiry is not None:
                model.expiry.cancel()
            if model.owned and model.resident:
                await self._unload(model, "the server stops")

    # -- loading and unloading -----------------------------------------------------------

    async def _load(self, model: Pooled) -> None:
        if not model.resident:
            async with self._lock:
                if not model.resident:
                    await self._make_room(model)
                    model.resident = True
                    model.loading = asyncio.ensure_future(model.engine.start())
        if model.loading is None:
            await model.engine.ready()
            return
        try:
            await asyncio.shield(model.loading)
        except EngineError:
            model.resident = False
            raise

    async def _make_room(self, model: Pooled) -> None:
        """Unload least recently used models until `model` fits the budget; wait for leased
        ones to be released when they are all that stands in the way."""
        if model is self.default and not any(m.resident for m in self._models.values()):
            return  # the default model alone: what a server without a library loads anyway
        budget = await self._resolve_budget()
        if budget is None:
            return
        kept = sum(m.need for m in self._models.values() if m is not model and self.pinned(m))
        if model.need + kept > budget:
            raise DoesNotFit(self._words(model, kept))
        while True:
            others = [m for m in self._models.values() if m.resident and m is not model]
            if model.need + sum(m.need for m in others) <= budget:
                return
            idle = [m for m in others if not self.pinned(m) and m.leases == 0]
            if idle:
                victim = min(idle, key=lambda m: m.last_used)
                await self._unload(victim, f"to make room for {model.name}")
                continue
            self._released.clear()
            await self._released.wait()

    def _words(self, model: Pooled, kept: int) -> str:
        """Why `model` cannot be loaded here, with the numbers."""
        text = (
            f"The model {model.name!r} needs about {gib(model.need, up=True)} loaded, and this "
            f"server may use {gib(self.budget)} for models"
        )
        if kept:
            text += f", of which the pinned model {self.pin!r} keeps {gib(kept, up=True)}"
        return (
            text + ". Give `stoke serve` a larger --budget, a smaller context (--ctx), or "
            "a smaller quantization of the model."
        )

    async def _unload(self, model: Pooled, why: str) -> None:
        """Close the model's engine: its worker snapshots the resident conversations first."""
        log.info("unloading %s (%s)", model.name, why)
        model.resident = False
        loading, model.loading = model.loading, None
        if loading is not None and not loading.done():
            loading.cancel()
        await model.engine.close()

    def _expire_later(self, model: Pooled) -> None:
        if self.ttl_s is None or self.pinned(model) or not model.resident:
            return
        loop = asyncio.get_running_loop()
        timer: list[asyncio.TimerHandle] = []
        timer.append(
            loop.call_later(self.ttl_s, lambda: loop.create_task(self._expire(model, timer[0])))
        )
        model.expiry = timer[0]

    async def _expire(self, model: Pooled, timer: asyncio.TimerHandle) -> None:
        """The TTL ran out since the model's last release; a lease since then cancelled this
        timer or replaced it, so only the latest one unloads."""
        async with self._lock:
            if model.expiry is not timer or not model.resident or model.leases:
                return
            model.expiry = None
            with contextlib.suppress(EngineError):
                await self._unload(model, f"idle for {self.ttl_s:g} s")


def _named(models: Sequence[Pooled], ref: str) -> str:
    """The pool's name for `ref` (a name or a path); ValueError in words when none matches."""
    path = Path(ref).expanduser()
    for model in models:
        if model.name == ref or (path.exists() and path.resolve() == _path(model).resolve()):
            return model.name
    names = ", ".join(m.name for m in models)
    raise ValueError(f"--pin: no model {ref!r} here; the models are {names}.")


def _path(model: Pooled) -> Path:
    return Path(model.engine.options.model_path).expanduser()
