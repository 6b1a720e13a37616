"""The conversation settings panel over a real store: what it shows, and what it saves."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSlider,
    QWidget,
)
from pytestqt.qtbot import QtBot

from app.conversations import ConversationStore
from app.ui.settings_panel import ConversationSettings

WAIT_MS = 5000


def test_load_shows_the_conversation(panel: ConversationSettings, store: ConversationStore) -> None:
    conversation = store.create_conversation(
        "Tuned",
        "Be terse.",
        {"temperature": 0.4, "top_p": 0.8, "min_p": 0.1, "max_tokens": 300, "seed": 1234},
    )
    assert not panel.isEnabled()

    panel.load(conversation.id)

    assert panel.isEnabled()
    assert panel.system_prompt.toPlainText() == "Be terse."
    assert panel.temperature.value() == pytest.approx(0.4)
    assert panel.temperature.slider.value() == 8  # steps of 0.05
    assert panel.top_p.value() == pytest.approx(0.8)
    assert panel.min_p.value() == pytest.approx(0.1)
    assert panel.max_tokens.value() == 300
    assert panel.seed.text() == "1234"
    assert not panel.reasoning.isChecked()


def test_defaults_show_for_settings_never_set(
    panel: ConversationSettings, store: ConversationStore
) -> None:
    panel.load(store.create_conversation().id)

    assert panel.system_prompt.toPlainText() == ""
    assert panel.temperature.value() == pytest.approx(0.7)
    assert panel.top_p.value() == pytest.approx(0.95)
    assert panel.min_p.value() == pytest.approx(0.05)
    assert panel.max_tokens.value() == 1024
    assert panel.seed.text() == ""
    assert panel.seed.placeholderText() == "Random"


def test_loading_saves_nothing(panel: ConversationSettings, store: ConversationStore) -> None:
    conversation = store.create_conversation(sampling={"temperature": 0.3})
    emitted: list[str] = []
    panel.changed.connect(emitted.append)

    panel.load(conversation.id)
    panel.flush()

    assert emitted == []
    assert store.get_conversation(conversation.id).sampling == {"temperature": 0.3}


def test_edits_are_merged_into_the_stored_sampling(
    qtbot: QtBot, panel: ConversationSettings, store: ConversationStore
) -> None:
    conversation = store.create_conversation(sampling={"top_k": 40, "custom": {"keep": True}})
    panel.load(conversation.id)

    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS) as saved:
        panel.temperature.spin.setValue(0.9)
        panel.top_p.slider.setValue(80)
        panel.min_p.spin.setValue(0.02)
        panel.max_tokens.setValue(2048)
        qtbot.keyClicks(panel.seed, "42")
    panel.flush()  # whatever a slow machine typed after the first save

    assert saved.args == [conversation.id]
    assert store.get_conversation(conversation.id).sampling == {
        "top_k": 40,
        "custom": {"keep": True},
        "temperature": 0.9,
        "top_p": 0.8,
        "min_p": 0.02,
        "max_tokens": 2048,
        "seed": 42,
    }


def test_untouched_settings_keep_their_stored_values(
    qtbot: QtBot, panel: ConversationSettings, store: ConversationStore
) -> None:
    """A value the controls cannot show (set from the command line) survives other edits."""
    conversation = store.create_conversation(sampling={"temperature": 3.5})
    panel.load(conversation.id)
    assert panel.temperature.value() == 2.0

    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        panel.top_p.spin.setValue(0.5)

    assert store.get_conversation(conversation.id).sampling == {"temperature": 3.5, "top_p": 0.5}


def test_blank_seed_removes_the_key(
    qtbot: QtBot, panel: ConversationSettings, store: ConversationStore
) -> None:
    conversation = store.create_conversation(sampling={"seed": 7, "temperature": 0.2})
    panel.load(conversation.id)

    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        panel.seed.clear()

    assert store.get_conversation(conversation.id).sampling == {"temperature": 0.2}


def test_seed_takes_digits_only(
    qtbot: QtBot, panel: ConversationSettings, store: ConversationStore
) -> None:
    panel.load(store.create_conversation().id)

    qtbot.keyClicks(panel.seed, "-1x23")

    assert panel.seed.text() == "123"


def test_system_prompt_is_saved_and_cleared(
    qtbot: QtBot, panel: ConversationSettings, store: ConversationStore
) -> None:
    conversation = store.create_conversation()
    panel.load(conversation.id)

    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        qtbot.keyClicks(panel.system_prompt, "Answer in French.")
    panel.flush()
    assert store.get_conversation(conversation.id).system_prompt == "Answer in French."

    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        panel.system_prompt.setPlainText("   \n")
    assert store.get_conversation(conversation.id).system_prompt is None
    assert store.get_conversation(conversation.id).sampling == {}


def test_reasoning_needs_a_model_that_supports_it(
    qtbot: QtBot, panel: ConversationSettings, store: ConversationStore
) -> None:
    conversation = store.create_conversation()
    panel.load(conversation.id)
    assert not panel.reasoning.isEnabled()
    assert panel.reasoning_hint.isVisible()

    panel.set_reasoning_supported(True)
    assert panel.reasoning.isEnabled()
    assert not panel.reasoning_hint.isVisible()
    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        qtbot.mouseClick(panel.reasoning, Qt.MouseButton.LeftButton)
    assert store.get_conversation(conversation.id).sampling == {"reasoning": True}

    panel.set_reasoning_supported(False)
    assert not panel.reasoning.isEnabled()
    assert panel.reasoning.isChecked()  # what the conversation asks for is still shown


def test_reset_restores_defaults_and_keeps_the_rest(
    qtbot: QtBot, panel: ConversationSettings, store: ConversationStore
) -> None:
    conversation = store.create_conversation(
        system_prompt="Stay on topic.",
        sampling={"temperature": 1.5, "seed": 9, "top_k": 20, "reasoning": True, "custom": 1},
    )
    panel.load(conversation.id)

    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)

    stored = store.get_conversation(conversation.id)
    assert stored.sampling == {"custom": 1}
    assert stored.system_prompt == "Stay on topic."
    assert panel.temperature.value() == pytest.approx(0.7)
    assert panel.seed.text() == ""
    assert not panel.reasoning.isChecked()


def test_switching_saves_pending_edits_to_the_old_conversation(
    panel: ConversationSettings, store: ConversationStore
) -> None:
    first = store.create_conversation()
    second = store.create_conversation(system_prompt="Second.", sampling={"temperature": 0.1})
    panel.load(first.id)
    emitted: list[str] = []
    panel.changed.connect(emitted.append)

    panel.temperature.spin.setValue(1.2)
    panel.system_prompt.setPlainText("First.")
    panel.load(second.id)

    assert emitted == [first.id]
    assert store.get_conversation(first.id).sampling == {"temperature": 1.2}
    assert store.get_conversation(first.id).system_prompt == "First."
    assert store.get_conversation(second.id).sampling == {"temperature": 0.1}
    assert panel.temperature.value() == pytest.approx(0.1)
    assert panel.system_prompt.toPlainText() == "Second."


def test_load_none_disables(panel: ConversationSettings, store: ConversationStore) -> None:
    panel.load(store.create_conversation(system_prompt="Hi").id)

    panel.load(None)

    assert not panel.isEnabled()
    assert panel.system_prompt.toPlainText() == ""


def test_every_control_is_named_and_explained(panel: ConversationSettings) -> None:
    controls: list[QWidget] = [
        *panel.findChildren(QPlainTextEdit),
        *panel.findChildren(QAbstractSpinBox),
        *panel.findChildren(QSlider),
        *panel.findChildren(QLineEdit),
        *panel.findChildren(QCheckBox),
        *panel.findChildren(QPushButton),
        *panel.findChildren(QComboBox),
    ]
    controls = [c for c in controls if not isinstance(c.parentWidget(), QAbstractSpinBox)]

    assert len(controls) == 15  # with the preset row (its box, Save…, Delete) and tools
    for control in controls:
        assert control.accessibleName(), control
        assert control.toolTip(), control
