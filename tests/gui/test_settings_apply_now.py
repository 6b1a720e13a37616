"""Settings that change how the model loads apply at once: Hardware > Apply reloads the
engine with the new plan, Remote Server > Save switches to the server, each in the
background with the conversation kept open (and, for the same model, its KV restored from
the snapshot, read from the engine's counters)."""

from __future__ import annotations

import asyncio

import pytest

from app.engine.protocol import FinishReason
from app.models import load_settings
from app.models.default import default_model_path
from app.remote_config import KEY_ENV
from tests.e2e.serving import API_KEY, ServerThread
from tests.e2e.test_downloads import keychain  # noqa: F401 (fixture)
from tests.gui.harness import Harness


def _reloaded(harness: Harness) -> None:
    """Wait out the reload that saving the settings started."""
    task = harness.window.model_switcher.reloading
    assert task is not None
    harness.run(asyncio.shield(task))


def _talk(harness: Harness, text: str) -> str:
    window = harness.window
    window.store.set_sampling(window.conversation_id, {"temperature": 0, "max_tokens": 8})
    harness.type_and_send(text)
    harness.turn()
    last = window.store.current_path(window.conversation_id)[-1]
    assert last.role == "assistant" and last.status == "complete"
    return last.id


def test_hardware_apply_reloads_now_and_keeps_the_conversations_kv(harness: Harness) -> None:
    # flash attention as the plan has it: llama.cpp lays the V cache out otherwise, and a
    # snapshot cannot cross that (the reload then prefills instead)
    window = harness.start(n_ctx=2048, flash_attn=True)
    conversation = window.conversation_id
    reply = _talk(harness, "Say hello.")
    wizard = window.open_hardware_wizard()
    harness.wait_until(wizard.idle)
    harness.act(lambda: wizard.set_context(4096))
    harness.wait_until(lambda: wizard.idle() and wizard.plan is not None)
    assert wizard.context() == 4096
    harness.act(wizard.apply)
    _reloaded(harness)
    saved = load_settings.load(str(default_model_path()))
    assert saved["n_ctx"] == 4096
    assert window.session.engine.options.n_ctx == 4096
    assert window.session.engine.info.n_ctx == 4096  # the engine that runs now loaded it
    assert window.session.engine.options.flash_attn
    assert window.conversation_id == conversation
    assert window.store.current_path(conversation)[-1].id == reply  # nothing lost
    harness.run(window.prewarm.idle())
    stats = window.prewarm.last[conversation]
    assert stats.finish_reason == FinishReason.PREFILLED
    assert stats.restored_tokens > 0 and stats.prefilled_tokens < stats.prompt_tokens
    assert "reloaded" in window.statusBar().currentMessage()
    _talk(harness, "Again.")


def test_remote_server_save_switches_the_engine_now(
    harness: Harness,
    keychain: object,  # noqa: F811 (a keychain in memory, not this machine's)
    monkeypatch: pytest.MonkeyPatch,
    tiny_model: str,
) -> None:
    # The server and the window on the tests' tiny model (tests/tiny_model.py, SmolLM2's
    # tokenizer): what is proven is the switch there and back, not the words.
    monkeypatch.delenv(KEY_ENV, raising=False)
    with ServerThread(model=tiny_model) as server:
        window = harness.start(tiny_model)
        conversation = window.conversation_id
        dialog = window.open_remote_settings()
        dialog.use_remote.setChecked(True)
        dialog.url.setText(server.url.removesuffix("/v1"))
        dialog.mode.setCurrentText("tokens")
        dialog.tokenizer.setText(tiny_model)
        dialog.key.setText(API_KEY)
        harness.act(dialog.save)
        _reloaded(harness)
        assert window.session.engine.options.remote is not None
        assert window.conversation_id == conversation
        before = server.server.stats.completed
        _talk(harness, "Hello over there.")
        assert server.server.stats.completed > before  # the server answered it
        dialog = window.open_remote_settings()  # and back to this machine, also at once
        dialog.use_remote.setChecked(False)
        harness.act(dialog.save)
        _reloaded(harness)
        assert window.session.engine.options.remote is None
        _talk(harness, "Back home.")
