"""Issue 36 item 8's small ones, in the real window: View > Theme marks the theme in use; Esc
clears the sidebar's search and a new chat is not hidden by it; focus returns to the composer
after Continue; a code block's Copy says "Copied"; a reply that kept no drafts says so plainly."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QTextBrowser, QWidget

from app.conversations.export import export_json
from app.ui.sidebar import _ID
from tests.gui.harness import Harness


def test_view_theme_marks_the_theme_in_use(harness: Harness) -> None:
    window = harness.start()

    def marked() -> list[str]:
        items = [window.findChild(QAction, f"theme-{name}") for name in ("system", "light", "dark")]
        return [item.objectName() for item in items if item.isChecked()]

    assert marked() == [f"theme-{window.theme_name}"]
    harness.act(window.findChild(QAction, "theme-dark").trigger)
    assert window.theme_name == "dark" and marked() == ["theme-dark"]
    harness.act(window.findChild(QAction, "theme-light").trigger)
    assert marked() == ["theme-light"]


def test_esc_clears_the_sidebar_search_and_a_new_chat_is_not_hidden_by_it(
    harness: Harness,
) -> None:
    window = harness.start()
    window.store.create_conversation(title="Airships")
    sidebar = window.sidebar

    def search(words: str) -> None:
        window.activateWindow()
        harness.act(lambda: (sidebar.search.setFocus(), QTest.keyClicks(sidebar.search, words)))
        harness.wait_until(
            lambda: (
                [sidebar.list.item(i).text() for i in range(sidebar.list.count())] == ["Airships"]
            )
        )

    search("airsh")
    harness.act(lambda: QTest.keyClick(sidebar.search, Qt.Key.Key_Escape))
    assert sidebar.search.text() == ""
    harness.wait_until(lambda: sidebar.list.count() > 1)  # the whole list again

    search("airsh")
    harness.act(window.new_conversation)
    shown = [sidebar.list.item(i).data(_ID) for i in range(sidebar.list.count())]
    assert window.conversation_id in shown


def test_an_imported_chat_is_not_hidden_by_the_sidebar_search(
    harness: Harness, tmp_path: Path
) -> None:
    window = harness.start()
    store, sidebar = window.store, window.sidebar
    pasta = store.create_conversation(title="Pasta")
    store.add_message(pasta.id, None, "user", "How long to boil pasta?")
    export = tmp_path / "pasta.json"
    export.write_text(json.dumps(export_json(store, pasta.id)), "utf-8")
    store.create_conversation(title="Airships")
    harness.act(sidebar.refresh)
    harness.act(lambda: sidebar.search.setText("airsh"))
    harness.wait_until(lambda: sidebar.list.count() == 1)

    harness.act(lambda: window.import_from(export))
    shown = [sidebar.list.item(i).data(_ID) for i in range(sidebar.list.count())]
    assert window.conversation_id != pasta.id and window.conversation_id in shown
    assert sidebar.search.text() == ""


def test_focus_returns_to_the_composer_after_continue(harness: Harness) -> None:
    window = harness.start()
    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 8})
    question = window.store.add_message(conversation, None, "user", "Name a colour.")
    cut = window.store.add_message(
        conversation, question.id, "assistant", "Blue, like", finish_reason="length"
    )
    harness.act(window.reload)
    window.activateWindow()
    harness.act(window.composer.focus)
    harness.wait_until(window.composer.editor.hasFocus)
    reply = next(w for w in window.chat.findChildren(QWidget, "message") if w.message.id == cut.id)
    harness.act(lambda: QTest.mouseClick(reply.continue_button, Qt.MouseButton.LeftButton))
    harness.turn()
    harness.act(QApplication.processEvents)
    assert len(window.store.current_path(conversation)[-1].content) > len("Blue, like")
    assert window.composer.editor.hasFocus(), QApplication.focusWidget()


def test_a_code_blocks_copy_says_copied_in_the_window_and_no_drafts_kept_reads_plainly(
    harness: Harness, tiny_model: str
) -> None:
    """Two of item 8's, on a conversation the real window opens: a code block's Copy says
    "Copied" where it was clicked (it gave no feedback), and a reply whose drafts were all
    rejected says "no drafts kept" in the status line (not "drafts 0% accepted")."""
    window = harness.start(tiny_model)
    store = window.store
    conversation = store.create_conversation("Sorting")
    question = store.add_message(conversation.id, None, "user", "How do I sort a list?")
    code = "print(sorted([3, 1, 2]))"
    stats = {"ttft_s": 0.1, "prefill_tok_s": 100.0, "decode_tok_s": 20.0, "reused_tokens": 0}
    stats |= {"prompt_tokens": 30, "drafted_tokens": 12, "accepted_tokens": 0}
    reply = f"Use `sorted()`:\n\n```python\n{code}\n```\n"
    store.add_message(conversation.id, question.id, "assistant", reply, stats=stats)
    harness.act(lambda: window.open_conversation(conversation.id))
    assert "no drafts kept" in window.status.text() and "0%" not in window.status.text()

    [text] = [
        w.findChild(QTextBrowser, "messageText")
        for w in window.chat.findChildren(QWidget, "message")
        if not w.is_user
    ]
    assert "Copied" not in text.toPlainText()
    harness.act(lambda: text.anchorClicked.emit(QUrl("copy:0")))
    assert QGuiApplication.clipboard().text() == code
    assert "Copied" in text.toPlainText()
