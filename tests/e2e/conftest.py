"""End-to-end fixtures: the real engine host on the real default model, a real SQLite file."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from app.conversations import ConversationStore
from app.engine.host import EngineClient
from app.engine.protocol import LoadOptions
from app.models.default import default_model_path
from app.session import ChatSession

GREEDY = {"temperature": 0.0, "max_tokens": 24}


@pytest.fixture
def model_path() -> str:
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
    store: ConversationStore, model: str, *, n_ctx: int = 4096
) -> AsyncIterator[ChatSession]:
    client = EngineClient(LoadOptions(model, n_ctx=n_ctx))
    await client.start()
    return ChatSession(store, client)
