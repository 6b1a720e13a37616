"""The Qt binding must not corrupt Python's reference counts (PySide6 6.12.0 on Python 3.11
dropped one reference to None per void call, and the app aborted after enough of them)."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QLabel, QListWidgetItem


def test_void_calls_keep_none_alive(qapp) -> None:
    label, item = QLabel(), QListWidgetItem("x")
    before = sys.getrefcount(None)
    for _ in range(5000):
        label.setText("y")
        item.setToolTip("z")
    assert sys.getrefcount(None) > before - 100
