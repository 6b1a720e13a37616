"""Drives the app's own start-up on a qasync loop, like a user: the GUI tests' harness."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any

import qasync
from PySide6.QtCore import QCoreApplication, QEvent, Qt, QThreadPool
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.engine.protocol import LoadOptions
from app.models.default import default_model_path
from app.ui.app import open_window, shutdown
from app.ui.main_window import MainWindow
from app.ui.models.library_tab import library_pool

TIMEOUT_S = 120


class _Loop(qasync.QEventLoop):
    """qasync's loop, with asyncio's running loop set while its `run_until_complete` processes
    the Qt events posted meanwhile, after the loop has stopped: without it a background task
    stepped there (a turn's next token, started by one `act` and awaited by the next `turn`)
    dies with "no running event loop". The app runs one `run_until_complete` for its whole
    life; the harness runs many."""

    def run_until_complete(self, future: Any) -> Any:
        future = asyncio.ensure_future(future, loop=self)
        future.add_done_callback(lambda _: self.stop())
        self.run_forever()
        asyncio.events._set_running_loop(self)
        try:
            QCoreApplication.processEvents()
        finally:
            asyncio.events._set_running_loop(None)
        if not future.done():
            raise RuntimeError("The event loop stopped before the work ended.")
        return future.result()


class Harness:
    """Runs the app's own start-up on a qasync loop and drives it like a user."""

    def __init__(self, app: QApplication) -> None:
        self.loop = _Loop(app, already_running=False)
        asyncio.set_event_loop(self.loop)
        self.window: MainWindow | None = None
        self.session = None

    def run(self, work: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(work, TIMEOUT_S))

    def start(self, model: str | None = None, **options: Any) -> MainWindow:
        """The window on `model` (default: the default model)."""
        load = LoadOptions(model or str(default_model_path()), **{"n_ctx": 4096, **options})
        self.window, self.session = self.run(open_window(load, None, "light"))
        self.run(self.session.engine.ready())
        self.run(self.window.prewarm.idle())
        return self.window

    def stop(self) -> None:
        if self.window is not None:
            self.window.close()
            self.run(shutdown(self.window, self.session))
            # Let the scans and probes it started in the background answer it, on the loop,
            # before it goes: none may run on into the next test.
            QThreadPool.globalInstance().waitForDone()
            library_pool().waitForDone()
            self.run(asyncio.sleep(0))
            # Delete it now, timers and dialogs included: a closed window's timers would
            # still fire into the next test, against a closed store and another loop.
            self.window.deleteLater()
            QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
            self.window = None
            gc.collect()  # its garbage cycles die here, on the GUI thread (app/ui/collector.py)

    def wait_until(self, condition: Callable[[], bool], timeout: float = TIMEOUT_S) -> None:
        async def poll() -> None:
            while not condition():
                await asyncio.sleep(0.02)

        self.loop.run_until_complete(asyncio.wait_for(poll(), timeout))

    def turn(self) -> None:
        """Wait for the running turn to end."""
        task = self.window.turn
        if task is not None:
            self.run(asyncio.shield(task))

    def act(self, action: Callable[[], object]) -> None:
        """Do something in the window while the loop runs, as it always does in the app."""

        async def go() -> None:
            action()
            await asyncio.sleep(0)

        self.run(go())

    def type_and_send(self, text: str) -> None:
        editor = self.window.composer.editor

        def typing() -> None:
            editor.setFocus()
            QTest.keyClicks(editor, text)
            QTest.keyClick(editor, Qt.Key.Key_Return)

        self.act(typing)
