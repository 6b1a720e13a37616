"""The main window, offscreen, on the real engine and model: what a person does every day."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QLabel, QPushButton, QTextBrowser, QWidget

from app.engine.protocol import LoadOptions
from app.ui.app import open_window
from app.ui.main_window import MainWindow
from tests.gui.chat_seed import seed_long
from tests.gui.harness import Harness


def bubbles(window: MainWindow) -> list[tuple[str, str]]:
    """(message id, visible text) of the messages on screen, top to bottom."""
    shown = []
    for widget in window.chat.findChildren(QWidget, "message"):
        if widget.isVisible():
            text = " ".join(b.toPlainText() for b in widget.findChildren(QTextBrowser))
            shown.append((widget.property("messageId"), text, widget.y()))
    return [(mid, text) for mid, text, _ in sorted(shown, key=lambda item: item[2])]


def button(window: MainWindow, message_id: str, name: str) -> QPushButton:
    for widget in window.chat.findChildren(QWidget, "message"):
        if widget.property("messageId") == message_id:
            found = widget.findChild(QWidget, name)
            if found is not None:
                return found
    raise LookupError(f"{name} of {message_id}")


def test_send_streams_reply_then_stop_and_continue(harness: Harness):
    window = harness.start()
    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 200})
    harness.type_and_send("What is the capital of France?")
    harness.turn()
    path = window.store.current_path(conversation)
    assert [m.role for m in path] == ["user", "assistant"] and path[1].status == "complete"
    shown = bubbles(window)
    assert shown[0][1] == "What is the capital of France?"
    assert path[1].content.strip()[:20] in shown[1][1]
    assert "reused" in window.status.text() and "prompt tokens" in window.status.text()
    assert window.composer.text() == ""

    streamed: list[str] = []
    window.chat.append_reply = lambda mid, piece, orig=window.chat.append_reply: (
        streamed.append(piece),
        orig(mid, piece),
    )
    harness.type_and_send("Count from 1 to 100, separated by commas.")
    harness.wait_until(lambda: len(streamed) >= 5)  # the reply streams in
    assert window.composer.stop_button.isVisible()
    harness.act(lambda: QTest.keyClick(window, Qt.Key.Key_Escape))  # Esc stops
    harness.turn()
    reply = window.store.current_path(conversation)[-1]
    assert reply.status == "interrupted" and reply.content
    continue_button = button(window, reply.id, "continueButton")
    assert continue_button.isVisible()
    # A continued reply finishes its budget (200 above, for Esc to land mid-reply): a few
    # more tokens prove it goes on where it stopped, without counting on to 100.
    budget = reply.stats["generated_tokens"] + 12
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": budget})
    harness.act(continue_button.click)
    harness.turn()
    continued = window.store.get_message(reply.id)
    assert continued.content.startswith(reply.content) and len(continued.content) > len(
        reply.content
    )


def test_edit_makes_a_branch_and_the_navigator_switches(harness: Harness):
    window = harness.start()
    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 16})
    harness.type_and_send("Name a color.")
    harness.turn()
    first_user = window.store.current_path(conversation)[0]
    harness.act(lambda: window.chat.edit_requested.emit(first_user.id, "Name an animal."))
    harness.turn()
    path = window.store.current_path(conversation)
    assert path[0].content == "Name an animal."
    siblings, index = window.store.siblings(path[0].id)
    assert len(siblings) == 2 and index == 1
    navigator = button(window, path[0].id, "branchPrevious")
    assert "2/2" in " ".join(
        w.text() for w in navigator.parent().findChildren(QWidget) if hasattr(w, "text")
    )
    harness.act(navigator.click)  # back to the first branch
    harness.wait_until(lambda: window.store.current_path(conversation)[0].id == first_user.id)
    assert bubbles(window)[0][1] == "Name a color."

    reply = window.store.current_path(conversation)[1]
    harness.act(button(window, reply.id, "regenerateButton").click)
    harness.turn()
    replies, _ = window.store.siblings(window.store.current_path(conversation)[1].id)
    assert replies[0].id == reply.id and len(replies) == 2


def test_search_delete_undo_and_restart_restores(harness: Harness):
    window = harness.start()
    first = window.conversation_id
    title_words = {"Tell", "about", "zebra"}
    window.store.set_sampling(first, {"temperature": 0, "max_tokens": 24})
    harness.type_and_send("Tell me about the zebra.")
    harness.turn()
    reply = window.store.current_path(first)[1].content
    word = next(w for w in reply.split() if len(w) > 5 and w.isalpha() and w not in title_words)

    harness.act(window.new_conversation)
    second = window.conversation_id
    assert second != first
    harness.act(lambda: QTest.keyClicks(window.composer.editor, "A draft I have not sent"))
    harness.act(lambda: window.composer.draft_settled.emit(window.composer.text()))

    title = window.store.get_conversation(first).title
    sidebar = window.sidebar
    harness.act(lambda: sidebar.search.setText(word))  # a word from the old reply
    harness.wait_until(
        lambda: [sidebar.list.item(i).text() for i in range(sidebar.list.count())] == [title],
        timeout=10,
    )
    harness.act(lambda: QTest.keyClick(sidebar.search, Qt.Key.Key_Return))  # open the hit
    harness.wait_until(lambda: window.conversation_id == first)
    harness.act(window.sidebar.search.clear)

    harness.act(lambda: window.open_conversation(first))
    harness.act(window.sidebar._delete)
    harness.wait_until(lambda: window.conversation_id != first)
    assert first not in [c.id for c in window.store.list_conversations()]
    assert window.sidebar.undo_bar.isVisible()
    harness.act(window.sidebar.undo_button.click)
    assert first in [c.id for c in window.store.list_conversations()]

    harness.act(lambda: window.open_conversation(second))
    harness.stop()  # quit the app
    window = harness.start()  # and start it again
    assert window.conversation_id == second
    assert window.composer.text() == "A draft I have not sent"
    listed = [c.id for c in window.store.list_conversations()]
    assert first in listed and second in listed


def test_errors_show_in_the_banner_with_their_fix(harness: Harness, tmp_path: Path):
    window = harness.start(n_ctx=256)
    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 8})
    harness.type_and_send("Describe the sea at dawn. " * 60)  # over the 256-token context
    harness.turn()
    assert window.banner.isVisible()
    assert "Your message alone is" in window.banner.text.text()
    assert "Drop oldest turns" not in window.banner.action_labels()  # it cannot help here
    harness.act(window.new_conversation)
    assert window.conversation_id != conversation
    kept = window.store.current_path(conversation)
    assert [m.role for m in kept] == ["user"]  # the typed message was not lost

    exported = tmp_path / "chat.json"
    harness.act(lambda: window.open_conversation(conversation))
    harness.act(lambda: window.export_to(exported, "json"))
    harness.act(lambda: window.import_from(exported))
    assert window.conversation_id != conversation
    assert window.store.current_path(window.conversation_id)[0].content == kept[0].content
    (tmp_path / "bad.json").write_text("{not json", "utf-8")
    harness.act(lambda: window.import_from(tmp_path / "bad.json"))
    assert "bad.json is not a JSON file" in window.banner.text.text()


def test_a_model_that_fails_to_load_is_explained(harness: Harness, tmp_path: Path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    harness.window, harness.session = harness.run(
        open_window(LoadOptions(str(broken)), None, "light")
    )
    window = harness.window
    assert window.banner.isVisible()
    assert "Could not load the model broken.gguf" in window.banner.text.text()
    assert window.state_label.text() == "Model failed to load"


def test_a_first_decode_crash_is_survived_and_said_in_the_banner(harness: Harness, monkeypatch):
    """Issue 13: the engine dies by SIGSEGV in its first decode (the worker's test hook, as
    llama.cpp's AMX matmul does); the turn still completes and the banner says what changed."""
    monkeypatch.setenv("STOKE_TEST_CRASH_FIRST_DECODE", "1")
    window = harness.start()
    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 12})
    harness.type_and_send("Name three colours.")
    harness.wait_until(lambda: window.session.engine.notices)
    harness.turn()
    path = window.store.current_path(conversation)
    assert [m.role for m in path] == ["user", "assistant"] and path[1].status == "complete"
    assert window.banner.isVisible()
    shown = window.banner.findChild(QLabel).text()
    assert "conservative settings" in shown and shown == window.session.engine.notices[0]


def test_new_chat_reuses_the_untouched_conversation(harness: Harness):
    """New chat twice, or from a conversation beside an untouched one, opens that one: empty
    conversations do not pile up in the sidebar."""
    window = harness.start()
    empty = window.conversation_id
    window.store.add_message(empty, None, "user", "Hello there.")
    harness.act(window.new_conversation)
    fresh = window.conversation_id
    assert fresh != empty
    count = window.sidebar.list.count()
    harness.act(window.new_conversation)
    assert window.conversation_id == fresh
    harness.act(lambda: window.open_conversation(empty))
    harness.act(window.new_conversation)
    assert window.conversation_id == fresh
    assert window.sidebar.list.count() == count


def test_closing_saves_the_typed_draft_and_stops_its_pending_save(harness: Harness):
    """The draft typed just before the window closes is saved by the close itself, and the
    pause's timer that would have saved it later is stopped: it would fire while the app
    shuts down, into the closed store."""
    window = harness.start()
    conversation = window.conversation_id
    harness.act(lambda: QTest.keyClicks(window.composer.editor, "Half a thought"))
    assert window.composer._settle.isActive()
    window.close()  # as the harness stops it, outside the loop (closing it ends the loop)
    assert not window.composer._settle.isActive()
    assert window.store.get_draft(conversation) == "Half a thought"


def test_quitting_does_not_wait_for_a_conversations_warm_up(harness: Harness):
    """Opening a long conversation starts prefilling its history in the background; quitting
    right after stops that prefill instead of waiting for it to end."""
    window = harness.start()
    conversation = seed_long(window.store)
    harness.act(lambda: window.open_conversation(conversation))
    prewarm = window.prewarm
    assert prewarm._tasks  # the warm-up is under way
    harness.stop()
    assert conversation not in prewarm.last and not prewarm._tasks
