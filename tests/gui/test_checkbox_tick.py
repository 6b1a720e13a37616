"""A ticked checkbox in the API Server dialog shows a tick, not just another colour (issue 36
item 6): its style sheet fills the indicator, which drops the style's own check mark; the
style sheet alone, and the real window's dialog in the light theme where it was seen."""

from __future__ import annotations

from PySide6.QtCore import QPoint
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QCheckBox, QStyle, QStyleOptionButton, QWidget

from app.ui.api_server_dialog import stylesheet
from tests.gui.harness import Harness


def _indicator(box: QCheckBox) -> QImage:
    """The indicator's pixels, its rounded frame left out."""
    option = QStyleOptionButton()
    box.initStyleOption(option)
    rect = box.style().subElementRect(QStyle.SubElement.SE_CheckBoxIndicator, option, box)
    return box.grab(rect.adjusted(3, 3, -3, -3)).toImage()


def _colours(image: QImage) -> set[str]:
    return {
        QColor(image.pixel(QPoint(x, y))).name()
        for x in range(image.width())
        for y in range(image.height())
    }


def test_a_checked_box_shows_a_tick(qtbot) -> None:
    holder = QWidget()
    holder.setStyleSheet(stylesheet())
    box = QCheckBox("Serve the API", holder)
    box.adjustSize()
    qtbot.addWidget(holder)
    holder.show()
    qtbot.waitExposed(holder)
    assert len(_colours(_indicator(box))) == 1  # off: an even fill
    box.setChecked(True)
    checked = _colours(_indicator(box))
    assert len(checked) >= 3, checked  # the fill, the tick and its antialiased edge


def test_the_api_server_dialogs_ticked_box_shows_a_tick_in_the_window(
    harness: Harness, tiny_model: str
) -> None:
    """The same in the real window's Settings > API Server dialog, in the light theme where
    it was seen: on and off differed by colour alone."""
    window = harness.start(tiny_model)
    dialog = window.open_api_server_settings()
    box = dialog.show_key  # ticking it shows the key, nothing else
    harness.wait_until(box.isVisible)
    assert not box.isChecked() and len(_colours(_indicator(box))) == 1
    harness.act(lambda: box.setChecked(True))
    checked = _colours(_indicator(box))
    assert len(checked) >= 3, checked
    harness.act(dialog.close)
