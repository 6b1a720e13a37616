"""Small marks of the window's state (issue 36 item 8): View > Theme marks the theme in use."""

from __future__ import annotations

from PySide6.QtGui import QAction

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
