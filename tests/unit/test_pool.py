"""The engine pool's decisions (app/pool/engines.py) on engines that only record their loads:
the least recently used idle model is unloaded to make room, a leased one never (a load waits
for its release), the pinned one never, a TTL unloads an idle model unless a lease came
since, and a model that cannot fit is refused in words. The real engines' side (the KV
snapshotted on the way out, restored on return) is tests/e2e/test_server_models_on_demand.py's."""

from __future__ import annotations

import asyncio

import pytest

from app.engine.protocol import LoadOptions
from app.engine.worker import EngineState
from app.pool.engines import DoesNotFit, EnginePool, Pooled


class FakeEngine:
    """An engine host's lifecycle without a process."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.options = LoadOptions(f"/models/{name}.gguf")
        self.name, self.log = name, log
        self.state, self.info = EngineState.STOPPED, None

    async def start(self) -> object:
        self.log.append(f"load {self.name}")
        self.state, self.info = EngineState.READY, object()
        return self.info

    async def ready(self) -> object:
        return self.info

    async def close(self) -> None:
        self.log.append(f"unload {self.name}")
        self.state = EngineState.STOPPED


def _pool(log: list[str], budget: int | None, **kw: object) -> EnginePool:
    models = [Pooled(FakeEngine(n, log), need=10, fixed_name=n) for n in ("a", "b", "c")]
    return EnginePool(models, default="a", budget=budget, **kw)


async def _use(pool: EnginePool, name: str) -> None:
    pool.release(await pool.lease(pool.find(name)))


def test_the_least_recently_used_idle_model_makes_room() -> None:
    async def scenario() -> list[str]:
        log: list[str] = []
        pool = _pool(log, budget=25)
        assert pool.find("b.gguf") is pool.find("b") and pool.find(None) is pool.find("a")
        assert pool.find("nothing") is None
        for name in ("a", "b", "c", "a"):
            await _use(pool, name)
        assert {m.name: m.state for m in pool.models} == {
            "a": "loaded",
            "b": "unloaded",
            "c": "loaded",
        }
        return log

    assert asyncio.run(scenario()) == [
        "load a",
        "load b",
        "unload a",  # the least recently used of a and b
        "load c",
        "unload b",
        "load a",
    ]


def test_a_leased_model_is_never_unloaded_the_load_waits_for_its_release() -> None:
    async def scenario() -> None:
        log: list[str] = []
        pool = _pool(log, budget=15)
        held = await pool.lease(pool.find("a"))
        waiting = asyncio.ensure_future(_use(pool, "b"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting.done() and log == ["load a"]
        pool.release(held)
        await asyncio.wait_for(waiting, 5)
        assert log == ["load a", "unload a", "load b"]

    asyncio.run(scenario())


def test_the_pinned_model_stays_and_what_cannot_fit_beside_it_is_refused_in_words() -> None:
    async def scenario() -> None:
        log: list[str] = []
        pool = _pool(log, budget=15, pin="a")
        await pool.start()
        with pytest.raises(DoesNotFit) as refused:
            await _use(pool, "b")
        assert "'b' needs about" in str(refused.value)
        assert "pinned model 'a'" in str(refused.value) and "--budget" in str(refused.value)
        assert log == ["load a"] and pool.find("b").leases == 0

    asyncio.run(scenario())


def test_ttl_unloads_an_idle_model_unless_a_lease_came_since_never_the_pinned() -> None:
    async def scenario() -> None:
        log: list[str] = []
        pool = _pool(log, budget=None, ttl_s=0.05, pin="a")
        await pool.start()
        await _use(pool, "b")
        held = await pool.lease(pool.find("c"))
        for _ in range(500):
            if pool.find("b").state == "unloaded":
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # past c's TTL, had it been released
        states = {m.name: m.state for m in pool.models}
        assert states == {"a": "loaded", "b": "unloaded", "c": "loaded"}
        pool.release(held)
        await pool.close()

    asyncio.run(scenario())
