"""Scrolling a long conversation: older pages load all the way to the start, Ctrl+Home and
Ctrl+End go to the ends, a send while scrolled up shows the new message (on the tests'
tiny model, tests/tiny_model.py: its reply's words are not the point, and SmolLM2's prefill of
the long conversation took most of that test's 23 s; Ctrl+Home/End measured no faster on it),
and a search hit opens scrolled to its message."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QStyle, QStyleOptionSlider, QWidget
from pytestqt.qtbot import QtBot

from app.ui.chat_view import PAGE_SIZE, ChatView
from app.ui.message_view import MessageView
from tests.gui.chat_seed import LONG, in_view, scroll_bar, seed_long
from tests.gui.harness import Harness

WAIT_MS = 20_000


def long_view(qtbot: QtBot) -> ChatView:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    qtbot.waitExposed(view)
    view.set_messages(
        [
            MessageView(f"m{i}", "user" if i % 2 == 0 else "assistant", f"Message number {i}")
            for i in range(LONG)
        ]
    )
    bar = scroll_bar(view)
    qtbot.waitUntil(lambda: 0 < bar.maximum() == bar.value(), timeout=WAIT_MS)  # laid out
    assert in_view(view, f"m{LONG - 1}") and view.loaded_from() == LONG - PAGE_SIZE
    return view


def test_scrolling_up_again_and_again_loads_every_batch(qtbot: QtBot) -> None:
    view = long_view(qtbot)
    bar = scroll_bar(view)
    loaded = [view.loaded_from()]
    while view.loaded_from() > 0:
        bar.triggerAction(bar.SliderAction.SliderToMinimum)  # as Home on the bar, or a wheel
        qtbot.waitUntil(lambda: view.loaded_from() < loaded[-1], timeout=WAIT_MS)
        qtbot.waitUntil(lambda: bar.value() > 0, timeout=WAIT_MS)  # the reader keeps the place
        loaded.append(view.loaded_from())
    assert loaded == [LONG - PAGE_SIZE, LONG - 2 * PAGE_SIZE, LONG - 3 * PAGE_SIZE, 0]
    bar.triggerAction(bar.SliderAction.SliderToMinimum)
    qtbot.waitUntil(lambda: in_view(view, "m0"), timeout=WAIT_MS)


def test_dragging_the_handle_to_the_top_reaches_the_first_message(qtbot: QtBot) -> None:
    view = long_view(qtbot)
    bar = scroll_bar(view)
    option = QStyleOptionSlider()
    bar.initStyleOption(option)
    handle = bar.style().subControlRect(
        QStyle.ComplexControl.CC_ScrollBar, option, QStyle.SubControl.SC_ScrollBarSlider, bar
    )
    QTest.mousePress(bar, Qt.MouseButton.LeftButton, pos=handle.center())
    assert bar.isSliderDown()
    for y in range(handle.center().y(), -40, -20):
        QTest.mouseMove(bar, QPoint(handle.center().x(), y))
    qtbot.waitUntil(lambda: view.loaded_from() == 0, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: in_view(view, "m0"), timeout=WAIT_MS)
    QTest.mouseRelease(bar, Qt.MouseButton.LeftButton, pos=QPoint(handle.center().x(), 0))
    assert bar.value() == 0


def test_ctrl_home_and_ctrl_end_go_to_the_ends(harness: Harness) -> None:
    window = harness.start()
    conversation = seed_long(window.store)
    harness.act(lambda: window.open_conversation(conversation))
    path = window.store.current_path(conversation)
    harness.wait_until(lambda: in_view(window.chat, path[-1].id))
    window.activateWindow()
    harness.act(window.composer.focus)  # an empty draft: the keys are the window's
    harness.act(
        lambda: QTest.keyClick(
            window.composer.editor, Qt.Key.Key_Home, Qt.KeyboardModifier.ControlModifier
        )
    )
    harness.wait_until(lambda: window.chat.loaded_from() == 0 and in_view(window.chat, path[0].id))
    assert not in_view(window.chat, path[-1].id)
    harness.act(
        lambda: QTest.keyClick(
            window.composer.editor, Qt.Key.Key_End, Qt.KeyboardModifier.ControlModifier
        )
    )
    harness.wait_until(lambda: in_view(window.chat, path[-1].id))
    assert not in_view(window.chat, path[0].id)


def test_sending_while_scrolled_up_shows_the_new_message(harness: Harness, tiny_model: str) -> None:
    window = harness.start(tiny_model)
    conversation = seed_long(window.store, PAGE_SIZE + 10)
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 8})
    harness.act(lambda: window.open_conversation(conversation))
    bar = scroll_bar(window.chat)
    harness.wait_until(lambda: bar.maximum() > 0)
    harness.act(lambda: bar.triggerAction(bar.SliderAction.SliderToMinimum))
    harness.wait_until(lambda: window.chat.loaded_from() == 0)
    harness.act(lambda: bar.triggerAction(bar.SliderAction.SliderToMinimum))
    first = window.store.current_path(conversation)[0].id
    harness.wait_until(lambda: in_view(window.chat, first))
    harness.type_and_send("One more question.")
    harness.turn()
    path = window.store.current_path(conversation)
    assert path[-2].content == "One more question."
    harness.wait_until(
        lambda: in_view(window.chat, path[-2].id) and in_view(window.chat, path[-1].id)
    )
    assert not in_view(window.chat, first)


def test_opening_a_search_hit_scrolls_to_its_message_and_marks_it(harness: Harness) -> None:
    window = harness.start()
    store = window.store
    conversation = store.create_conversation("Long chat").id
    parent = None
    for i in range(LONG):
        words = "The zeppelin lands at noon." if i == 6 else f"Message number {i}"
        role = "user" if i % 2 == 0 else "assistant"
        parent = store.add_message(conversation, parent, role, words).id
    found = store.current_path(conversation)[6].id
    sidebar = window.sidebar
    harness.act(lambda: sidebar.search.setText("zeppelin"))
    harness.wait_until(lambda: sidebar.list.count() == 1)

    harness.act(lambda: sidebar.list.setCurrentRow(0))  # a click, or Enter in the field
    assert window.conversation_id == conversation
    harness.wait_until(lambda: in_view(window.chat, found))
    marked = [w for w in window.chat.findChildren(QWidget, "message") if w.property("found")]
    assert [w.property("messageId") for w in marked] == [found]


def test_a_search_hit_on_another_branch_opens_that_branch(harness: Harness) -> None:
    window = harness.start()
    store = window.store
    conversation = store.create_conversation("Airships").id
    question = store.add_message(conversation, None, "user", "When does it land?")
    found = store.add_message(conversation, question.id, "assistant", "The zeppelin lands.").id
    store.add_message(conversation, question.id, "assistant", "At noon.")  # a regeneration
    harness.act(lambda: window.sidebar.search.setText("zeppelin"))
    harness.wait_until(lambda: window.sidebar.list.count() == 1)

    harness.act(lambda: window.sidebar.list.setCurrentRow(0))
    assert found in [m.id for m in store.current_path(conversation)]
    harness.wait_until(lambda: in_view(window.chat, found))
