"""Every control says what it is (screen readers) and what it does (tooltips)."""

from __future__ import annotations

from typing import TypeVar

from PySide6.QtWidgets import QWidget

W = TypeVar("W", bound=QWidget)


def described(widget: W, name: str, tip: str) -> W:
    """Give `widget` an accessible name and a tooltip; returns it for chaining."""
    widget.setAccessibleName(name)
    widget.setToolTip(tip)
    return widget
