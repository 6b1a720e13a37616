"""The Background relay: a task that outlives the dialog or window that started it (closed
while a model header was still being read) ends quietly, without calling into the deleted
owner; one that finishes in time reaches its callback on the UI thread."""

from __future__ import annotations

import threading

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QThread, QThreadPool
from pytestqt.qtbot import QtBot

from app.ui.background import Background


def test_a_task_reaches_its_callback_on_the_ui_thread(qtbot: QtBot) -> None:
    owner = QObject()
    relay, pool, seen = Background(owner), QThreadPool(), []
    relay.run(pool, lambda: QThread.currentThread(), seen.append, seen.append)
    qtbot.waitUntil(lambda: bool(seen))
    assert seen[0] is not QThread.currentThread()  # the work ran on the pool
    relay.run(pool, lambda: 1 / 0, lambda _: None, seen.append)
    qtbot.waitUntil(lambda: len(seen) == 2)
    assert seen[1] == "division by zero"


def test_a_task_outliving_its_owner_ends_quietly(qtbot: QtBot) -> None:
    owner = QObject()
    relay, pool = Background(owner), QThreadPool()
    release, called = threading.Event(), []
    for outcome in (lambda: "done", lambda: 1 / 0):

        def work(outcome=outcome) -> object:
            release.wait(30)
            return outcome()

        relay.run(pool, work, called.append, called.append)
    owner.deleteLater()  # the window closes while both tasks still run
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    release.set()
    assert pool.waitForDone(30_000)
    QCoreApplication.processEvents()
    assert called == []
