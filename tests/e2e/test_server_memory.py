"""Under load the engine's memory and the snapshot folder stay flat: several conversations
taking turns for STOKE_LOAD_REQUESTS requests (150 here; the acceptance run uses 1,000) keep
the engine's resident memory within 10% of its value after the first 100, and the snapshot
files to one per conversation's latest state, within the disk budget."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.engine.protocol import LoadOptions
from tests.e2e.serving import ServerThread

SERVE_TINY = True  # conftest's `served` runs the tiny chat model
CONVERSATIONS = 6


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _home_of(pid: int) -> Path:
    """The STOKE_HOME the engine process runs in (the module's server home, not this test's)."""
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(p.decode().split("=", 1) for p in pairs if b"=" in p)
    return Path(env["STOKE_HOME"])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_engine_memory_and_snapshots_stay_flat(served: ServerThread) -> None:
    requests = int(os.environ.get("STOKE_LOAD_REQUESTS", "150"))
    client, pid = served.client(), served.server.engine.pid
    conversations = [
        [{"role": "user", "content": f"Conversation {i}: tell me about the number {i}."}]
        for i in range(CONVERSATIONS)
    ]
    after_100 = None
    for n in range(1, requests + 1):
        history = conversations[n % CONVERSATIONS]
        reply = client.chat.completions.create(
            model=served.model, messages=history, max_tokens=8, temperature=0
        )
        history += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"And then? ({n})"},
        ]
        if len(history) > 41:  # a long conversation starts over from its first question
            del history[1:]
        if n == 100:
            after_100 = _rss_mib(pid)
    assert after_100 is not None, "STOKE_LOAD_REQUESTS must be at least 100"
    end = _rss_mib(pid)
    assert end <= 1.1 * after_100, (after_100, end)
    snapshots = list(_home_of(pid).rglob("*.kv"))
    assert 0 < len(snapshots) <= 2 * CONVERSATIONS, len(snapshots)
    assert sum(p.stat().st_size for p in snapshots) <= LoadOptions("x").kv_disk_budget
