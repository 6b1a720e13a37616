"""End-to-end fixtures: the real engine host on the real default model, a real SQLite file."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.conversations import ConversationStore
from app.engine.host import EngineClient
from app.engine.llamacpp.openmp import spin_briefly
from app.engine.protocol import LoadOptions
from app.models.default import default_model_path
from app.session import ChatSession
from tests.conftest import seeded
from tests.e2e.serving import ServerThread

# Tests that load llama.cpp in this process get the engine process's barrier waits, set
# before any of them loads it (llamacpp/openmp.py): with libgomp's default spin, a tiny
# model's decode took 157 ms a token on the loaded 2-core box, against 7 ms.
spin_briefly()

GREEDY = {"temperature": 0.0, "max_tokens": 24}
StokeHere = Callable[..., tuple[int, str, str]]  # the `stoke_here` fixture's runner

needs_mlx = pytest.mark.skipif(
    importlib.util.find_spec("mlx") is None,
    reason="MLX is not installed (`pip install 'mlx[cpu]'` on Linux, `mlx` on a Mac)",
)
# The engines the end-to-end promises are checked on; a test takes `engine` to run on each.
both_engines = pytest.mark.parametrize(
    "engine", ["llama.cpp", pytest.param("mlx", marks=needs_mlx)]
)


@pytest.fixture
def engine() -> str:
    """The backend a test drives; tests marked `both_engines` get each in turn."""
    return "llama.cpp"


@pytest.fixture
def model_path(engine: str, request: pytest.FixtureRequest) -> str:
    """The default model on llama.cpp; on MLX, whose CPU build runs SmolLM2 at a few tokens a
    second with its weights expanded to float32, the tiny model: the `both_engines` tests prove
    mechanisms, which it proves as well (SmolLM2 on MLX stays in test_mlx_folder.py and
    test_engine_agreement.py)."""
    if engine == "mlx":
        return request.getfixturevalue("tiny_model")
    return str(default_model_path())


@pytest.fixture
def store(stoke_home: Path) -> ConversationStore:
    with ConversationStore.open() as store:
        yield store


@pytest.fixture
def run() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """Run a coroutine on a fresh event loop (tests stay plain functions)."""
    return asyncio.run


async def start_session(
    store: ConversationStore, model: str, *, n_ctx: int = 4096, engine: str = "llama.cpp"
) -> AsyncIterator[ChatSession]:
    client = EngineClient(LoadOptions(model, n_ctx=n_ctx), backend=engine)
    await client.start()
    return ChatSession(store, client)


@pytest.fixture(scope="session")
def shared_home(
    tmp_path_factory: pytest.TempPathFactory, cpu_buffer_verdict: Path
) -> Callable[[str], Path]:
    """Makes a new STOKE_HOME for what a module shares (a server, its engine, a process),
    holding this machine's CPU buffer verdict as each test's own home does: in a home without
    it the engine probes the CPU again, children that cost about ten seconds of CPU."""

    def make(name: str) -> Path:
        return seeded(tmp_path_factory.mktemp(name), cpu_buffer_verdict)

    return make


@pytest.fixture(scope="module")
def served(
    shared_home: Callable[[str], Path], request: pytest.FixtureRequest
) -> Iterator[ServerThread]:
    """A `stoke serve` on loopback with the default options and its own STOKE_HOME, shared by
    a module's tests: on the tiny model where the module sets `SERVE_TINY = True` (a module
    that needs other options defines its own `served`)."""
    tiny = getattr(request.module, "SERVE_TINY", False)
    model = request.getfixturevalue("tiny_model") if tiny else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(shared_home("serve-home")))
        with ServerThread(model=model) as server:
            yield server


@pytest.fixture
def stoke_here(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> StokeHere:
    """`stoke ARGV` through its own entry point in this process, for what answers or fails
    before any model loads (a new interpreter's imports cost seconds of CPU): (exit code,
    stdout, stderr). Keyword arguments set environment variables for the call."""
    from app.__main__ import main

    def run(*argv: str, **env: str) -> tuple[int, str, str]:
        with monkeypatch.context() as mp:
            for name, value in env.items():
                mp.setenv(name, value)
            umask = os.umask(0o077)  # what main() sets for Stoke's process; put back below
            try:
                code = main(list(argv))
            finally:
                os.umask(umask)
        return code, *capsys.readouterr()

    return run
