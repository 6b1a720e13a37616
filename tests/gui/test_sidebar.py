"""The sidebar over a real conversation store, driven like a user would (keys and clicks)."""

from __future__ import annotations

import sqlite3
from datetime import date, datetime, time, timedelta

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor
from PySide6.QtTest import QTest
from PySide6.QtWidgets import (
    QApplication,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QWidget,
)
from pytestqt.qtbot import QtBot

from app.conversations import ConversationStore
from app.ui.sidebar import Sidebar, date_group, snippet_html

WAIT_MS = 5000


def make_sidebar(qtbot: QtBot, store: ConversationStore, **kwargs: int) -> Sidebar:
    sidebar = Sidebar(store, **kwargs)
    qtbot.addWidget(sidebar)
    sidebar.resize(280, 600)
    sidebar.show()
    qtbot.waitExposed(sidebar)
    return sidebar


def age(store: ConversationStore, cid: str, days: int) -> None:
    """Make a conversation last updated `days` ago at noon (the store only moves it forward)."""
    noon = datetime.combine(date.today() - timedelta(days=days), time(12, 0)).timestamp()
    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (noon, cid))
    conn.close()


def rows(sidebar: Sidebar) -> list[str]:
    return [sidebar.list.item(i).text() for i in range(sidebar.list.count())]


def row_of(sidebar: Sidebar, text: str) -> QListWidgetItem:
    items = (sidebar.list.item(i) for i in range(sidebar.list.count()))
    return next(item for item in items if item.text() == text)


def click(qtbot: QtBot, list_widget: QListWidget, item: QListWidgetItem) -> None:
    position = list_widget.visualItemRect(item).center()
    qtbot.mouseClick(list_widget.viewport(), Qt.MouseButton.LeftButton, pos=position)


def focus_row(qtbot: QtBot, sidebar: Sidebar, conversation_id: str) -> None:
    """The open conversation's row, with the keyboard focus on the list."""
    sidebar.select(conversation_id)
    sidebar.activateWindow()
    sidebar.list.setFocus()
    qtbot.waitUntil(sidebar.list.hasFocus, timeout=WAIT_MS)


def test_pinned_first_then_grouped_by_date(qtbot: QtBot, store: ConversationStore) -> None:
    ids = {}
    for title, days in [
        ("Ancient", 90),
        ("Last month", 20),
        ("This week", 4),
        ("Yesterday's", 1),
        ("Pinned old", 400),
    ]:
        ids[title] = store.create_conversation(title).id
        age(store, ids[title], days)
    store.create_conversation("Fresh")
    store.create_conversation()  # untitled, newest
    store.set_pinned(ids["Pinned old"], True)

    sidebar = make_sidebar(qtbot, store)

    assert rows(sidebar) == [
        "Pinned",
        "Pinned old",
        "Today",
        "New conversation",
        "Fresh",
        "Yesterday",
        "Yesterday's",
        "Previous 7 days",
        "This week",
        "Previous 30 days",
        "Last month",
        "Older",
        "Ancient",
    ]
    headers = [sidebar.list.item(i) for i in (0, 2, 5, 7, 9, 11)]
    assert all(not item.flags() & Qt.ItemFlag.ItemIsSelectable for item in headers)
    assert row_of(sidebar, "Fresh").flags() & Qt.ItemFlag.ItemIsSelectable


def test_date_groups_at_their_edges() -> None:
    today = date(2025, 3, 31)

    def at(days: int) -> float:
        return datetime.combine(today - timedelta(days=days), time(0, 0, 1)).timestamp()

    assert [date_group(at(d), today) for d in (0, 1, 2, 7, 8, 30, 31)] == [
        "Today",
        "Yesterday",
        "Previous 7 days",
        "Previous 7 days",
        "Previous 30 days",
        "Previous 30 days",
        "Older",
    ]


def test_empty_state(qtbot: QtBot, store: ConversationStore) -> None:
    sidebar = make_sidebar(qtbot, store)

    assert sidebar.empty_label.isVisible()
    assert sidebar.empty_label.text().startswith("No conversations yet")
    assert not sidebar.list.isVisible()


def test_clicking_a_row_selects_it_and_select_stays_silent(
    qtbot: QtBot, store: ConversationStore
) -> None:
    first = store.create_conversation("First").id
    second = store.create_conversation("Second").id
    sidebar = make_sidebar(qtbot, store)
    emitted: list[str] = []
    sidebar.conversation_selected.connect(emitted.append)

    sidebar.select(first)
    assert (sidebar.current_id(), emitted) == (first, [])

    with qtbot.waitSignal(sidebar.conversation_selected, timeout=WAIT_MS) as blocker:
        click(qtbot, sidebar.list, row_of(sidebar, "Second"))
    assert blocker.args == [second]
    assert sidebar.current_id() == second


def test_context_menu_acts_on_the_clicked_row_without_opening_it(
    qtbot: QtBot, store: ConversationStore
) -> None:
    open_id = store.create_conversation("Open").id
    clicked_id = store.create_conversation("Clicked").id
    sidebar = make_sidebar(qtbot, store)
    sidebar.select(open_id)
    emitted: list[str] = []
    sidebar.conversation_selected.connect(emitted.append)
    shown: list[list[str]] = []

    def pin_from_menu() -> None:
        menu = QApplication.activePopupWidget()
        assert isinstance(menu, QMenu)
        shown.append([action.text() for action in menu.actions() if action.text()])
        next(action for action in menu.actions() if action.text() == "Pin").trigger()
        menu.close()

    viewport = sidebar.list.viewport()
    position = viewport.mapTo(
        sidebar, sidebar.list.visualItemRect(row_of(sidebar, "Clicked")).center()
    )
    QTimer.singleShot(0, pin_from_menu)
    # Through the window, as the platform delivers it, so Qt also sends the context menu event.
    QTest.mousePress(
        sidebar.windowHandle(), Qt.MouseButton.RightButton, Qt.KeyboardModifier.NoModifier, position
    )
    QTest.mouseRelease(
        sidebar.windowHandle(), Qt.MouseButton.RightButton, Qt.KeyboardModifier.NoModifier, position
    )

    qtbot.waitUntil(lambda: bool(shown), timeout=WAIT_MS)
    assert shown == [["Rename", "Pin", "Delete"]]
    assert store.get_conversation(clicked_id).pinned
    assert not store.get_conversation(open_id).pinned
    assert emitted == []
    assert sidebar.current_id() == open_id


def test_new_chat_button(qtbot: QtBot, store: ConversationStore) -> None:
    sidebar = make_sidebar(qtbot, store)

    with qtbot.waitSignal(sidebar.new_requested, timeout=WAIT_MS):
        qtbot.mouseClick(sidebar.new_button, Qt.MouseButton.LeftButton)


def test_search_finds_an_old_message_and_opens_its_conversation(
    qtbot: QtBot, store: ConversationStore
) -> None:
    old = store.create_conversation("Airships")
    question = store.add_message(old.id, None, "user", "Tell me about the Hindenburg zeppelin.")
    store.add_message(old.id, question.id, "assistant", "It burned in 1937.")
    age(store, old.id, 200)
    for n in range(5):
        store.create_conversation(f"Other {n}")
    sidebar = make_sidebar(qtbot, store)
    sidebar.focus_search()

    qtbot.keyClicks(sidebar.search, "zeppel")
    qtbot.waitUntil(lambda: rows(sidebar) == ["Airships"], timeout=WAIT_MS)

    hit = row_of(sidebar, "Airships")
    assert "Hindenburg" in hit.toolTip()
    assert "«zeppelin»" not in hit.toolTip()
    with qtbot.waitSignal(sidebar.conversation_selected, timeout=WAIT_MS) as blocker:
        click(qtbot, sidebar.list, hit)
    assert blocker.args == [old.id]

    sidebar.search.clear()
    assert "Other 0" in rows(sidebar)
    assert sidebar.list.currentItem().text() == "Airships"


def test_search_without_matches_says_so(qtbot: QtBot, store: ConversationStore) -> None:
    store.create_conversation("Something")
    sidebar = make_sidebar(qtbot, store)

    sidebar.search.setText("nothing-like-it")
    qtbot.waitUntil(sidebar.empty_label.isVisible, timeout=WAIT_MS)

    assert sidebar.empty_label.text() == "No matches for “nothing-like-it”"


def test_enter_in_search_opens_the_first_hit(qtbot: QtBot, store: ConversationStore) -> None:
    found = store.create_conversation("Quarterly report").id
    sidebar = make_sidebar(qtbot, store)
    sidebar.search.setText("quarterly")

    with qtbot.waitSignal(sidebar.conversation_selected, timeout=WAIT_MS) as blocker:
        qtbot.keyClick(sidebar.search, Qt.Key.Key_Return)
    assert blocker.args == [found]


def test_snippet_html_bolds_marked_words_and_escapes_the_rest() -> None:
    html = snippet_html("a <b> «word» & «more»", QColor("#123456"))

    assert html.count('<span style="font-weight:600; color:#123456">') == 2
    assert "&lt;b&gt;" in html
    assert "&amp;" in html
    assert "«" not in html


def test_f2_renames_in_place(qtbot: QtBot, store: ConversationStore) -> None:
    conversation_id = store.create_conversation("Old name").id
    sidebar = make_sidebar(qtbot, store)
    focus_row(qtbot, sidebar, conversation_id)

    qtbot.keyClick(sidebar.list, Qt.Key.Key_F2)
    editor = sidebar.list.viewport().findChild(QLineEdit)
    assert editor is not None
    assert editor.text() == "Old name"
    editor.selectAll()
    qtbot.keyClicks(editor, "  Better name ")
    qtbot.keyClick(editor, Qt.Key.Key_Return)

    qtbot.waitUntil(lambda: "Better name" in rows(sidebar), timeout=WAIT_MS)
    assert store.get_conversation(conversation_id).title == "Better name"


def test_renaming_to_nothing_keeps_the_title(qtbot: QtBot, store: ConversationStore) -> None:
    conversation_id = store.create_conversation("Keep me").id
    sidebar = make_sidebar(qtbot, store)
    focus_row(qtbot, sidebar, conversation_id)

    sidebar.list.editItem(sidebar.list.currentItem())
    editor = sidebar.list.viewport().findChild(QLineEdit)
    editor.clear()
    qtbot.keyClick(editor, Qt.Key.Key_Return)

    assert store.get_conversation(conversation_id).title == "Keep me"


def test_refresh_waits_for_the_title_editor(qtbot: QtBot, store: ConversationStore) -> None:
    conversation_id = store.create_conversation("Being renamed").id
    sidebar = make_sidebar(qtbot, store)
    focus_row(qtbot, sidebar, conversation_id)
    qtbot.keyClick(sidebar.list, Qt.Key.Key_F2)
    editor = sidebar.list.viewport().findChild(QLineEdit)
    store.create_conversation("Arrived meanwhile")

    sidebar.refresh()  # as the window does when a reply finishes

    assert editor.isVisible()
    assert "Arrived meanwhile" not in rows(sidebar)
    qtbot.keyClick(editor, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: "Arrived meanwhile" in rows(sidebar), timeout=WAIT_MS)
    assert store.get_conversation(conversation_id).title == "Being renamed"


def test_pin_and_unpin(qtbot: QtBot, store: ConversationStore) -> None:
    store.create_conversation("Top")
    conversation_id = store.create_conversation("Bottom").id
    age(store, conversation_id, 3)
    sidebar = make_sidebar(qtbot, store)
    focus_row(qtbot, sidebar, conversation_id)
    pin = next(a for a in sidebar.list.actions() if a.text() in ("Pin", "Unpin"))
    assert pin.text() == "Pin"

    qtbot.keyClick(
        sidebar.list,
        Qt.Key.Key_P,
        Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier,
    )

    assert store.get_conversation(conversation_id).pinned
    assert rows(sidebar)[:2] == ["Pinned", "Bottom"]
    assert sidebar.list.currentItem().text() == "Bottom"
    assert pin.text() == "Unpin"

    pin.trigger()  # as from the context menu

    assert not store.get_conversation(conversation_id).pinned
    assert rows(sidebar) == ["Today", "Top", "Previous 7 days", "Bottom"]


def test_delete_offers_undo_and_undo_restores(qtbot: QtBot, store: ConversationStore) -> None:
    keep = store.create_conversation("Keep").id
    doomed = store.create_conversation("Doomed").id
    sidebar = make_sidebar(qtbot, store)
    focus_row(qtbot, sidebar, doomed)

    with qtbot.waitSignal(sidebar.conversation_deleted, timeout=WAIT_MS) as deleted:
        qtbot.keyClick(sidebar.list, Qt.Key.Key_Delete)

    assert deleted.args == [doomed]
    assert store.get_conversation(doomed).deleted_at is not None
    assert "Doomed" not in rows(sidebar)
    assert sidebar.current_id() is None
    assert sidebar.undo_bar.isVisible()
    assert store.get_conversation(keep).deleted_at is None

    with qtbot.waitSignal(sidebar.conversation_selected, timeout=WAIT_MS) as reopened:
        qtbot.mouseClick(sidebar.undo_button, Qt.MouseButton.LeftButton)

    assert reopened.args == [doomed]
    assert store.get_conversation(doomed).deleted_at is None
    assert "Doomed" in rows(sidebar)
    assert sidebar.current_id() == doomed
    assert not sidebar.undo_bar.isVisible()


def test_undo_bar_goes_away_and_the_delete_stands(qtbot: QtBot, store: ConversationStore) -> None:
    doomed = store.create_conversation("Doomed").id
    sidebar = make_sidebar(qtbot, store, undo_timeout_ms=50)
    focus_row(qtbot, sidebar, doomed)
    delete = next(a for a in sidebar.list.actions() if a.text() == "Delete")

    delete.trigger()
    assert sidebar.undo_bar.isVisible()
    qtbot.waitUntil(lambda: not sidebar.undo_bar.isVisible(), timeout=WAIT_MS)

    assert store.get_conversation(doomed).deleted_at is not None
    assert sidebar.empty_label.isVisible()


def test_actions_need_a_conversation_row(qtbot: QtBot, store: ConversationStore) -> None:
    store.create_conversation("Alone")
    sidebar = make_sidebar(qtbot, store)

    assert sidebar.current_id() is None
    assert not any(action.isEnabled() for action in sidebar.list.actions())


def test_focus_search(qtbot: QtBot, store: ConversationStore) -> None:
    sidebar = make_sidebar(qtbot, store)
    sidebar.activateWindow()
    sidebar.search.setText("typed before")

    sidebar.focus_search()

    qtbot.waitUntil(sidebar.search.hasFocus, timeout=WAIT_MS)
    assert sidebar.search.selectedText() == "typed before"


def test_every_control_is_named_and_explained(qtbot: QtBot, store: ConversationStore) -> None:
    sidebar = make_sidebar(qtbot, store)
    controls: list[QWidget] = [
        *sidebar.findChildren(QPushButton),
        *sidebar.findChildren(QLineEdit),
        *sidebar.findChildren(QListWidget),
    ]

    assert len(controls) == 4
    for control in controls:
        assert control.accessibleName(), control
        assert control.toolTip() or control.accessibleDescription(), control
