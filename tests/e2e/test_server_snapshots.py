"""`kill -9` of `stoke serve` keeps the API conversations' KV: each reply is snapshotted in the
background (as the window does), so after a restart the next turn of the conversation is
restored, not prefilled again. A real `stoke serve` process, killed with its engine, on the
tests' tiny model (SmolLM2's tokenizer and template): the KV's way back is the point, not the
replies' words."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from tests.e2e.serving import document

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
KEY = "sk-snapshot-test"
PATIENCE_S = 120.0


def _serve(home: Path, model: str) -> tuple[subprocess.Popen, str, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--model", model, "--port", "0", "--ctx", "2048"],
        cwd=REPO,
        env={**os.environ, "STOKE_HOME": str(home), "STOKE_API_KEY": KEY},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group: the kill takes the engine too
    )
    line = process.stdout.readline()
    found = re.search(r"Serving (\S+) at (http://127\.0\.0\.1:\d+/v1)", line)
    assert found, line
    return process, found[1], found[2]


def _kill_9(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def _snapshot_files(home: Path) -> list[Path]:
    return [p for p in home.rglob("*.kv") if p.parent.name.startswith("llama.cpp-")]


def test_kill_9_of_stoke_serve_keeps_the_conversations_kv(
    stoke_home: Path, tiny_model: str
) -> None:
    """Two conversations, then kill -9; after the restart they come back in the other
    order (so the new process's first slot is not the first conversation's) and both are
    restored."""
    chats = {
        topic: [{"role": "user", "content": document(topic, 20) + "\nWhich town is first?"}]
        for topic in ("harbour", "glacier")
    }
    first_prompt: dict[str, int] = {}
    process, model, url = _serve(stoke_home, tiny_model)
    try:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        for messages in chats.values():
            reply = client.chat.completions.create(
                model=model, messages=messages, max_tokens=8, temperature=0
            )
            first_prompt[messages[0]["content"]] = reply.usage.prompt_tokens
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": "And the second?"},
            ]
        deadline = time.monotonic() + PATIENCE_S
        while len(_snapshot_files(stoke_home)) < len(chats) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        _kill_9(process)
    assert len(_snapshot_files(stoke_home)) == len(chats), "no snapshots were written"

    process, model, url = _serve(stoke_home, tiny_model)
    try:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        cached = {}
        for messages in reversed(chats.values()):
            reply = client.chat.completions.create(
                model=model, messages=messages, max_tokens=4, temperature=0
            )
            cached[messages[0]["content"]] = reply.usage.prompt_tokens_details.cached_tokens
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(60)
    for first, tokens in first_prompt.items():
        assert cached[first] >= tokens, (cached[first], tokens)
