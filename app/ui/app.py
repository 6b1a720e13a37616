"""Starts the desktop app: Qt application, qasync loop, engine host, chat session, window."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtWidgets import QApplication, QWidget

from app import paths
from app.conversations import ConversationStore, StoreError
from app.engine.host import EngineClient, EngineState
from app.engine.protocol import EngineError, LoadOptions
from app.session import ChatSession
from app.settings import Settings
from app.ui import theme
from app.ui.main_window import MainWindow
from app.ui.welcome import Welcome


def display_available() -> bool:
    """Whether a window can be shown (else the terminal chat is the app)."""
    if sys.platform == "darwin" or os.environ.get("QT_QPA_PLATFORM"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def window_settings() -> QSettings:
    """Window state lives with the rest of Stoke's config (STOKE_HOME-aware)."""
    return QSettings(str(paths.config_dir() / "window.ini"), QSettings.Format.IniFormat)


async def open_window(
    options: LoadOptions, conversation: str | None, theme: str | None, *, welcome: bool = False
) -> tuple[MainWindow, ChatSession]:
    """The window over the store and a starting engine: what the app, the screenshot mode,
    the UI benchmark and the window tests all run. With `welcome`, the first start's welcome
    opens with the window, while the model loads."""
    store = ConversationStore.open()
    client = EngineClient(options, log_path=paths.cache_dir() / "engine.log")
    session = ChatSession(store, client)
    window = MainWindow(session, window_settings())
    if theme:
        window.apply_theme(theme)
    if store.notices:
        window.banner.show_message(" ".join(store.notices))
    window.restore_state()
    if conversation:
        window.open_conversation(store.get_conversation(conversation).id)
    window.show()
    if welcome:
        first_run(window)
    with contextlib.suppress(EngineError):  # the window shows why, and stays usable
        await client.start()
    serve = Settings.load()
    if serve.serve_on_start:  # Settings > API Server was left on
        try:
            await window.api_server.start(serve.serve_port)
        except EngineError as exc:
            window.banner.show_message(str(exc))
    return window, session


async def shutdown(window: MainWindow, session: ChatSession) -> None:
    """Stop the reply and the background prefills (quitting never waits for a conversation's
    warm-up), let snapshots end, and close engine, downloads and store."""
    session.cancel()
    window.prewarm.cancel()
    await window.api_server.stop()
    await window.tools.close()  # every MCP server's process ends with the app
    await window.prewarm.idle()
    # Running downloads stay marked running: the next start resumes them.
    await asyncio.get_running_loop().run_in_executor(None, window.downloads.shutdown)
    await session.engine.close()
    session.store.close()
    window.collector.close()


def first_run(window: MainWindow) -> QWidget | None:
    """On the first start, the welcome in plain words over the window (None after that); its
    "Hardware details…" opens the Hardware dialog."""
    if window.settings.value("hardware_seen", "false") == "true":
        return None
    window.settings.setValue("hardware_seen", "true")
    engine = window.session.engine
    welcome = Welcome(engine.options.model_path, engine.state == EngineState.READY, window)
    window.engine_state_changed.connect(welcome.engine_state)
    welcome.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    welcome.hardware_requested.connect(window.open_hardware_wizard)
    welcome.open()
    return welcome


def run_gui(options: LoadOptions, *, conversation: str | None = None) -> int:
    """The app's main loop until the window closes."""
    import qasync

    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("Stoke")
    app.setWindowIcon(theme.app_icon())
    app.setOrganizationName("Stoke")
    app.setQuitOnLastWindowClosed(False)  # the loop still has to shut the engine down
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    closed = asyncio.Event()
    app.lastWindowClosed.connect(closed.set)

    async def main() -> None:
        window, session = await open_window(options, conversation, None, welcome=True)
        await closed.wait()
        await shutdown(window, session)

    with loop:
        try:
            loop.run_until_complete(main())
        except StoreError as exc:
            print(f"stoke: {exc}", file=sys.stderr)
            return 1
    return 0


def screenshot(
    options: LoadOptions, path: Path, *, conversation: str | None, theme: str | None
) -> int:
    """Render the main window offscreen to a PNG and exit."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import qasync

    app = QApplication.instance() or QApplication(sys.argv)
    app.setQuitOnLastWindowClosed(False)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)

    async def main() -> None:
        window, session = await open_window(options, conversation, theme)
        window.resize(1180, 760)
        await window.prewarm.idle()
        done = asyncio.Event()
        QTimer.singleShot(300, done.set)  # let layouts and the markdown settle
        await done.wait()
        window.grab().save(str(path))
        window.close()
        await shutdown(window, session)

    with loop:
        loop.run_until_complete(main())
    print(path)
    return 0
