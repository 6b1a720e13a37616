"""A reply that is all reasoning (cut before `</think>`) under a reasoning template (Qwen3.5's,
as `stoke serve --chat-template` sets it): sent back with its reasoning as
`reasoning_content`, inline in the content, or dropped, the next turn reuses the whole previous
prompt and reply, as a reply with an answer does."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.serving import ServerThread

TEMPLATE = Path(__file__).parents[1] / "fixtures" / "chat_templates" / "Qwen-Qwen3.5-4B.jinja"


@pytest.fixture(scope="module")
def reasoning(shared_home: Callable[[str], Path]) -> Iterator[ServerThread]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(shared_home("reasoning-replay-home")))
        server = ServerThread()
        server.options = dataclasses.replace(server.options, chat_template=TEMPLATE.read_text())
        with server:
            yield server


@pytest.mark.parametrize("sent_back", ["reasoning_content", "inline", "dropped"])
def test_a_reasoning_only_reply_is_replayed(reasoning: ServerThread, sent_back: str) -> None:
    client = reasoning.client()
    history: list[dict] = [{"role": "user", "content": f"Think about the number 7 ({sent_back})."}]
    first = client.chat.completions.create(
        model=reasoning.model, messages=history, max_tokens=12, temperature=0
    )
    said = first.choices[0].message
    thought = said.model_extra.get("reasoning_content") or ""
    assert thought and not (said.content or "").strip()  # cut inside its reasoning
    if sent_back == "reasoning_content":
        history.append({"role": "assistant", "content": "", "reasoning_content": thought})
    elif sent_back == "inline":
        history.append({"role": "assistant", "content": f"<think>\n{thought}"})
    else:
        history.append({"role": "assistant", "content": ""})
    history.append({"role": "user", "content": "Go on."})
    second = client.chat.completions.create(
        model=reasoning.model, messages=history, max_tokens=4, temperature=0
    )
    held = first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= held - 1, second.usage
