"""A turn on the real engine with its caches damaged: model-hashes.json of valid JSON with wrong
types, and this machine's CPU buffer verdict without its buffer types. Both used to stop every
turn with a traceback until deleted by hand; now the turn completes, the verdict is probed again
and both files are rebuilt (app/stored.py)."""

from __future__ import annotations

import json

from app import paths
from app.engine.llamacpp import cpu_buffers
from app.models.default import default_model_path
from tests.e2e.conftest import GREEDY, start_session


def test_a_turn_completes_with_its_caches_damaged(store, run) -> None:
    hashes = paths.cache_dir() / "model-hashes.json"
    hashes.write_text(json.dumps({"version": 1, "files": [], "owners": []}))
    verdicts = paths.cache_dir() / cpu_buffers.CACHE_FILE
    cached = json.loads(verdicts.read_text())
    for verdict in cached["verdicts"].values():
        del verdict["extra_types"]
    verdicts.write_text(json.dumps(cached))

    async def scenario():
        session = await start_session(store, str(default_model_path()))
        try:
            conversation = store.create_conversation(sampling={**GREEDY, "max_tokens": 4})
            return await session.send(conversation.id, "Name a color.")
        finally:
            await session.engine.close()

    result = run(scenario())
    assert result.status == "complete" and result.token_ids
    rebuilt = json.loads(verdicts.read_text())["verdicts"]
    assert rebuilt and all("extra_types" in v for v in rebuilt.values())
    # the damaged hashes were let go; the background hash may have written them afresh
    assert not hashes.exists() or isinstance(json.loads(hashes.read_text())["files"], dict)
