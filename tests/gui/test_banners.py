"""Banners follow their cause: cleared when it is resolved, kept with their conversation,
success shown as success (issue 16)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from pytestqt.qtbot import QtBot

from app import resources
from app.engine.host import EngineState
from app.ui.banner import Banner
from app.ui.theme import BANNER
from tests.gui.harness import Harness


def test_a_banner_is_cleared_by_its_own_cause_only(qtbot: QtBot) -> None:
    banner = Banner()
    qtbot.addWidget(banner)
    banner.show_message("import.json is not a JSON file.", cause="import")
    banner.clear("restart")
    assert not banner.isHidden()
    banner.clear("import")
    assert banner.isHidden()
    banner.show_message("Left out the 148 oldest messages.", kind="info", conversation="a")
    banner.leave_conversation("a")
    assert not banner.isHidden()
    banner.leave_conversation("b")
    assert banner.isHidden()
    banner.show_message("Saved.", kind="success")
    assert BANNER["success"]["light"][0] in banner.styleSheet()
    banner.set_dark(True)  # the theme changes while it shows: it follows
    assert BANNER["success"]["dark"][0] in banner.styleSheet()
    assert BANNER["success"]["light"][0] not in banner.styleSheet()


def test_import_error_then_success_and_banners_stay_with_their_conversation(
    harness: Harness, tmp_path: Path
):
    window = harness.start()
    first = window.conversation_id
    (tmp_path / "bad.json").write_text("{not json", "utf-8")
    harness.act(lambda: window.import_from(tmp_path / "bad.json"))
    assert "bad.json is not a JSON file" in window.banner.text.text()
    assert "Expecting" not in window.banner.text.text()  # json's own words stay out
    window.store.add_message(first, None, "user", "Hello there.")
    harness.act(lambda: window.export_to(tmp_path / "good.json", "json"))
    harness.act(lambda: window.import_from(tmp_path / "good.json"))
    assert window.banner.isVisible() and window.banner.kind == "success"
    assert window.banner.text.text().startswith("Imported ")
    assert "not a JSON file" not in window.banner.text.text()

    imported = window.conversation_id
    harness.act(window.new_conversation)
    assert not window.banner.isVisible()  # the import's success was about the imported one
    harness.act(lambda: window.open_conversation(imported))
    harness.act(
        lambda: window.banner.show_message(
            "Left out the 148 oldest messages to fit the context.",
            kind="info",
            conversation=imported,
        )
    )
    harness.act(lambda: window.open_conversation(first))
    assert not window.banner.isVisible()  # it was about the other conversation


def test_restarting_is_cleared_once_the_engine_is_back(harness: Harness):
    window = harness.start()
    engine = window.session.engine
    seen: list[tuple[EngineState, str]] = []  # the banner as each state left it
    engine.add_state_listener(
        lambda state, _detail: seen.append(
            (state, window.banner.text.text() if window.banner.isVisible() else "")
        )
    )
    os.kill(engine.pid, signal.SIGKILL)
    harness.wait_until(lambda: seen and seen[-1][0] == EngineState.READY)
    crashed = [text for state, text in seen if state == EngineState.CRASHED]
    assert crashed and "Restarting it." in crashed[0]
    assert not window.banner.isVisible()

    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 400})
    streamed: list[str] = []
    window.chat.append_reply = lambda mid, piece, orig=window.chat.append_reply: (
        streamed.append(piece),
        orig(mid, piece),
    )
    harness.type_and_send("Count from 1 to 200, separated by commas.")
    harness.wait_until(lambda: len(streamed) >= 3)
    seen.clear()
    os.kill(engine.pid, signal.SIGKILL)
    harness.turn()
    harness.wait_until(lambda: seen and seen[-1][0] == EngineState.READY)
    shown = window.banner.text.text()
    assert window.banner.isVisible() and "you can continue it" in shown
    assert "Restarting it." not in shown and "Stoke restarted it." in shown

    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 4})
    harness.type_and_send("Thanks.")
    harness.turn()
    assert window.store.current_path(conversation)[-1].status == "complete"
    assert not window.banner.isVisible()


def test_the_models_dialog_reopens_without_an_old_message(harness: Harness):
    window = harness.start()
    dialog = window.open_models()
    dialog.banner.show_message("Imported SmolLM2 into the library.", kind="success")
    harness.act(dialog.reject)
    dialog = window.open_models()
    assert dialog.banner.isHidden()
    harness.act(dialog.reject)


def test_success_kinds_are_in_the_palette() -> None:
    palette = json.loads(resources.read_text("palette.json"))
    assert set(palette["banner"]) >= {"error", "info", "success"}
