"""Light and dark themes; "system" follows the platform's color scheme as it changes.

The colours and the style sheets live in resources/ (palette.json, *.qss, read through
app.resources): this module reads them once and is how every other UI file gets a status
colour, a style sheet or the app icon."""

from __future__ import annotations

import functools
import json
import string
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPalette, QPixmap
from PySide6.QtWidgets import QApplication

from app import resources

THEMES = ("system", "light", "dark")
ICON_SIZES = (16, 32, 48, 64, 128, 256, 512)  # icons/stoke-N.png, rendered from stoke.svg

_COLORS: dict[str, Any] = json.loads(resources.read_text("palette.json"))
STATUS: dict[str, str] = _COLORS["status"]  # ok, warn, error, idle, busy, generating
CHART: dict[str, str] = _COLORS["chart"]  # the memory plan's weights, kv and compute
BANNER: dict[str, dict[str, list[str]]] = _COLORS["banner"]  # kind -> theme -> [bg, fg]
CHAT: dict[str, dict[str, str]] = _COLORS["chat"]  # theme -> base, text, warning
MARKDOWN: dict[str, dict[str, str]] = _COLORS["markdown"]  # theme -> code, quote, link colours


@functools.cache
def _template(name: str) -> string.Template:
    return string.Template(resources.read_text(name))


def stylesheet(name: str, **values: str) -> str:
    """A style sheet of resources/, its $names filled from STATUS and `values`."""
    return _template(name).substitute(STATUS, **values)


def system_is_dark() -> bool:
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def is_dark(theme: str) -> bool:
    return theme == "dark" or (theme == "system" and system_is_dark())


def apply(app: QApplication, theme: str) -> bool:
    """Set the palette and style sheet; returns whether the result is dark."""
    dark = is_dark(theme)
    app.setStyle("Fusion")
    palette = QPalette()
    colors = _COLORS["dark" if dark else "light"]
    for role, color in colors.items():
        palette.setColor(getattr(QPalette.ColorRole, role), QColor(color))
    muted = QColor(colors["PlaceholderText"])
    for role in (
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
    ):
        palette.setColor(QPalette.ColorGroup.Disabled, role, muted)
    app.setPalette(palette)
    app.setStyleSheet(stylesheet("app.qss"))
    return dark


def app_icon() -> QIcon:
    """Stoke's ember at each size the platforms ask for, so none is scaled from another."""
    icon = QIcon()
    for size in ICON_SIZES:
        pixmap = QPixmap()
        pixmap.loadFromData(resources.read_bytes(f"icons/stoke-{size}.png"), "PNG")
        icon.addPixmap(pixmap)
    return icon
