"""Light and dark themes; "system" follows the platform's color scheme as it changes."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

THEMES = ("system", "light", "dark")

_DARK = {
    QPalette.ColorRole.Window: "#1f2124",
    QPalette.ColorRole.WindowText: "#e6e6e6",
    QPalette.ColorRole.Base: "#17181b",
    QPalette.ColorRole.AlternateBase: "#26282c",
    QPalette.ColorRole.Text: "#e6e6e6",
    QPalette.ColorRole.Button: "#2b2d31",
    QPalette.ColorRole.ButtonText: "#e6e6e6",
    QPalette.ColorRole.Highlight: "#3d7be0",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.ToolTipBase: "#2b2d31",
    QPalette.ColorRole.ToolTipText: "#e6e6e6",
    QPalette.ColorRole.PlaceholderText: "#8a8f98",
    QPalette.ColorRole.Link: "#7aa7ff",
    QPalette.ColorRole.Mid: "#3a3d42",
}
_LIGHT = {
    QPalette.ColorRole.Window: "#f6f7f9",
    QPalette.ColorRole.WindowText: "#1d1f23",
    QPalette.ColorRole.Base: "#ffffff",
    QPalette.ColorRole.AlternateBase: "#eef0f3",
    QPalette.ColorRole.Text: "#1d1f23",
    QPalette.ColorRole.Button: "#eceef1",
    QPalette.ColorRole.ButtonText: "#1d1f23",
    QPalette.ColorRole.Highlight: "#2f6fde",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.ToolTipBase: "#ffffff",
    QPalette.ColorRole.ToolTipText: "#1d1f23",
    QPalette.ColorRole.PlaceholderText: "#80868f",
    QPalette.ColorRole.Link: "#2f6fde",
    QPalette.ColorRole.Mid: "#d5d8dd",
}

STYLE = """
QWidget#header { border-bottom: 1px solid palette(mid); }
QLabel#model-name { font-weight: 600; font-size: 14px; }
QLabel#engine-state { border-radius: 9px; padding: 2px 10px; font-size: 12px; }
QFrame#banner { border-radius: 8px; padding: 4px; }
QWidget#composer { border-top: 1px solid palette(mid); }
QPlainTextEdit#composer-editor { border: 1px solid palette(mid); border-radius: 10px;
    padding: 8px; font-size: 14px; }
QLabel#warm-indicator { color: #2e9d5b; font-size: 11px; }
QPushButton { padding: 6px 14px; border-radius: 8px; border: 1px solid palette(mid);
    background: palette(button); }
QPushButton:hover { border-color: palette(highlight); }
QPushButton:disabled { color: palette(placeholder-text); }
QStatusBar { font-size: 12px; }
"""


def system_is_dark() -> bool:
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def is_dark(theme: str) -> bool:
    return theme == "dark" or (theme == "system" and system_is_dark())


def apply(app: QApplication, theme: str) -> bool:
    """Set the palette and style sheet; returns whether the result is dark."""
    dark = is_dark(theme)
    app.setStyle("Fusion")
    palette = QPalette()
    colors = _DARK if dark else _LIGHT
    for role, color in colors.items():
        palette.setColor(role, QColor(color))
    muted = QColor(colors[QPalette.ColorRole.PlaceholderText])
    for role in (
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
    ):
        palette.setColor(QPalette.ColorGroup.Disabled, role, muted)
    app.setPalette(palette)
    app.setStyleSheet(STYLE)
    return dark
