"""Speculative decoding's counts reach every place a user or client reads stats, on the real
engine and the tests' tiny model (speculation "auto": prompt lookup drafts from the repeats
its greedy replies fall into; what the counts are is test_speculative.py's): the terminal
chat's stats line and the one-shot `--json` (each equal to the stats stored with that reply),
and the API's OpenAI usage (`completion_tokens_details`), streamed or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from app.conversations import ConversationStore
from tests.e2e.serving import ServerThread
from tests.e2e.test_speculative import EDIT

pytestmark = pytest.mark.e2e


def _chat(model: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "app", "chat", "--model", model]
    command += ["--temperature", "0", "--max-tokens", "120"]
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=300, env=os.environ.copy()
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done


def _last_reply_stats(conversation_id: str) -> dict:
    with ConversationStore.open() as store:
        reply = store.current_path(conversation_id)[-1]
        assert reply.role == "assistant"
        return reply.stats


def test_the_terminal_line_and_the_json_carry_the_replys_drafts(
    stoke_home: Path, tiny_model: str
) -> None:
    terminal = _chat(tiny_model, "--new", "--message", EDIT)
    with ConversationStore.open() as store:
        (conversation,) = store.list_conversations()
    stats = _last_reply_stats(conversation.id)
    assert stats["drafted_tokens"] > 0  # the reply repeats its own tokens
    kept = stats["accepted_tokens"] / stats["drafted_tokens"]
    assert f"{stats['decode_tok_s']:.1f} tok/s · drafts {kept:.0%} accepted" in terminal.stderr

    one_shot = _chat(tiny_model, "--conversation", conversation.id, "--message", EDIT, "--json")
    output = json.loads(one_shot.stdout.strip().splitlines()[-1])
    stored = _last_reply_stats(conversation.id)
    assert output["stats"]["drafted_tokens"] == stored["drafted_tokens"] > 0
    assert output["stats"]["accepted_tokens"] == stored["accepted_tokens"] >= 0


def test_the_api_reports_the_drafts_in_timings_not_as_prediction_tokens(
    stoke_home: Path, tiny_model: str
) -> None:
    """OpenAI's prediction counts answer a request's `prediction` (not taken here): 0; Stoke's
    own drafts are in llama-server's `timings` (draft_n, draft_n_accepted)."""
    server = ServerThread()
    server.options = replace(server.options, model_path=tiny_model)
    with server:
        client = server.client()
        messages = [{"role": "user", "content": EDIT}]
        reply = client.chat.completions.create(
            model=server.model, messages=messages, max_tokens=120, temperature=0
        )
        details = reply.usage.completion_tokens_details
        assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (0, 0)
        timings = reply.model_extra["timings"]
        assert timings["draft_n"] > 0 and 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
        assert timings["predicted_n"] == reply.usage.completion_tokens
        assert timings["cache_n"] + timings["prompt_n"] == reply.usage.prompt_tokens
        chunks = list(
            client.chat.completions.create(
                model=server.model,
                messages=messages,  # the same greedy reply, so the same repeats to draft from
                max_tokens=120,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].usage.completion_tokens_details.rejected_prediction_tokens == 0
        assert chunks[-1].model_extra["timings"]["draft_n"] > 0
