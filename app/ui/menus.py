"""The window's menu bar: File, Edit, Chat, View, Settings, each item with its shortcut.

Every action is also added to the window itself, so its shortcut works with the menu bar
hidden (as on some desktops). The actions call the window's methods (`MenuWindow`, so this
module needs no import of the window); the menus own nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMenu, QMenuBar

from app.ui import theme
from app.ui.keyboard import GO_TO_END, GO_TO_START

if TYPE_CHECKING:
    from app.ui.chat_view import ChatView
    from app.ui.panels import Panels
    from app.ui.sidebar import Sidebar
    from app.ui.zoom import Zoom

Keys = QKeySequence | QKeySequence.StandardKey | Sequence[QKeySequence] | None


class MenuWindow(Protocol):
    """The main window as its menus drive it: its parts and the commands its items run."""

    chat: ChatView
    panels: Panels
    sidebar: Sidebar
    zoom: Zoom

    def menuBar(self) -> QMenuBar: ...

    def addAction(self, action: QAction) -> None: ...

    def close(self) -> bool: ...

    def new_conversation(self) -> None: ...

    def import_dialog(self) -> None: ...

    def export_dialog(self, kind: str) -> None: ...

    def open_models(self) -> object: ...

    def stop(self) -> None: ...

    def regenerate_last(self) -> None: ...

    def toggle_settings(self) -> None: ...

    def open_hardware_wizard(self) -> object: ...

    def open_remote_settings(self) -> object: ...

    def open_speculation_settings(self) -> object: ...

    def open_api_server_settings(self) -> object: ...

    def open_tools_settings(self) -> object: ...

    def apply_theme(self, name: str) -> None: ...

    def open_about(self) -> object: ...


def add_action(
    window: MenuWindow, menu: QMenu, text: str, slot: Callable, keys: Keys = None, name: str = ""
) -> QAction:
    """An item of `menu` that runs `slot`; the first of several `keys` is the one shown."""
    act = QAction(text, window)
    if isinstance(keys, Sequence):
        act.setShortcuts(list(keys))
    elif keys is not None:
        act.setShortcut(keys)
    act.triggered.connect(slot)
    act.setObjectName(name or text)
    menu.addAction(act)
    window.addAction(act)  # shortcuts work even with the menu bar hidden
    return act


def build_menus(window: MenuWindow) -> None:
    """The menu bar of `window`."""
    bar = window.menuBar()

    def action(menu: QMenu, text: str, slot: Callable, keys: Keys = None, name: str = ""):
        return add_action(window, menu, text, slot, keys, name)

    file = bar.addMenu("&File")
    action(file, "New Chat", window.new_conversation, QKeySequence.StandardKey.New)
    action(file, "Import Conversation…", window.import_dialog)
    action(file, "Export as Markdown…", lambda: window.export_dialog("md"))
    action(file, "Export as JSON…", lambda: window.export_dialog("json"))
    file.addSeparator()
    action(file, "Models…", window.open_models, QKeySequence("Ctrl+Shift+M"))
    file.addSeparator()
    action(file, "Quit", window.close, QKeySequence.StandardKey.Quit)
    edit = bar.addMenu("&Edit")
    action(edit, "Find Conversations", lambda: _find(window), QKeySequence.StandardKey.Find)
    chat = bar.addMenu("&Chat")
    action(chat, "Stop", window.stop, QKeySequence(Qt.Key.Key_Escape))
    action(chat, "Regenerate Last Reply", window.regenerate_last, QKeySequence("Ctrl+R"))
    view = bar.addMenu("&View")
    preferences = QKeySequence.keyBindings(QKeySequence.StandardKey.Preferences)
    action(
        view,
        "Conversation Settings",
        window.toggle_settings,
        [QKeySequence("Ctrl+,"), *(k for k in preferences if k != QKeySequence("Ctrl+,"))],
    )
    action(view, "Sidebar", window.panels.toggle_sidebar, QKeySequence("Ctrl+B"), name="sidebar")
    view.addSeparator()
    action(view, "Go to Start", window.chat.scroll_to_start, GO_TO_START, name="go-to-start")
    action(view, "Go to End", window.chat.scroll_to_end, GO_TO_END, name="go-to-end")
    view.addSeparator()
    zoom = window.zoom
    action(view, "Zoom In", zoom.zoom_in, [QKeySequence.StandardKey.ZoomIn, QKeySequence("Ctrl+=")])
    action(view, "Zoom Out", zoom.zoom_out, QKeySequence.StandardKey.ZoomOut)
    action(view, "Actual Size", zoom.reset, QKeySequence("Ctrl+0"))
    view.addSeparator()
    settings_menu = bar.addMenu("&Settings")
    action(settings_menu, "Hardware…", window.open_hardware_wizard, name="hardware")
    action(settings_menu, "Remote Server…", window.open_remote_settings, name="remote")
    action(
        settings_menu,
        "Speculative Decoding…",
        window.open_speculation_settings,
        name="speculation",
    )
    action(settings_menu, "API Server…", window.open_api_server_settings, name="api-server")
    action(settings_menu, "Tools…", window.open_tools_settings, name="tools")
    themes = view.addMenu("Theme")
    chosen = QActionGroup(themes)  # one marked: the one in use (MainWindow.apply_theme)
    for name in theme.THEMES:
        pick = lambda _=False, n=name: window.apply_theme(n)  # noqa: E731 (bound per theme)
        item = action(themes, name.title(), pick, name=f"theme-{name}")
        item.setCheckable(True)
        chosen.addAction(item)
    help_menu = bar.addMenu("&Help")
    action(help_menu, "About Stoke", window.open_about, name="about")


def _find(window: MenuWindow) -> None:
    """Edit > Find: into the sidebar's search, opening a folded sidebar first."""
    window.panels.set_sidebar_open(True)
    window.sidebar.focus_search()
