"""The engine-state chip is as wide as its text at 960 px, not a pill stretched to the
longest state, and its slot keeps the row still when the state changes."""

from __future__ import annotations

from PySide6.QtCore import QSize

from app.ui.header import STATE_PADDING_PX
from app.ui.main_window import STATE_LABELS
from tests.gui.harness import Harness

SMALL = QSize(960, 600)


def test_the_state_chip_is_as_wide_as_its_text(harness: Harness) -> None:
    window = harness.start()
    window.resize(SMALL)
    harness.wait_until(lambda: window.size() == SMALL)
    chip = window.header.state_label
    harness.wait_until(lambda: chip.text() == "Ready")
    harness.wait_until(lambda: chip.width() == chip.sizeHint().width())
    ready = chip.fontMetrics().horizontalAdvance("Ready")
    longest = max(chip.fontMetrics().horizontalAdvance(t) for t, _ in STATE_LABELS.values())
    assert ready + 8 <= chip.width() <= ready + STATE_PADDING_PX + 4
    assert chip.width() < longest  # not sized for "Crashed — restarting"
    slot = chip.parentWidget()
    before = (slot.width(), window.header.warm_label.x())
    chip.setText("Crashed — restarting")
    harness.wait_until(lambda: chip.width() == chip.sizeHint().width() > longest)
    assert (slot.width(), window.header.warm_label.x()) == before
