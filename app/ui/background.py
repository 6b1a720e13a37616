"""Blocking work off the UI thread, its answer back on it: the one relay the dialogs share.

Reading a 150 GB model's header, scanning a library, asking the hub for a listing or planning
a model take from milliseconds to minutes, so they run on a QThreadPool. The answer comes back
as a queued signal: Qt delivers it on the UI thread's event loop, which is the loop qasync
runs asyncio on in the app, and the loop pytest-qt spins in the tests, so a dialog needs no
asyncio loop of its own to be opened. A task whose owner was deleted meanwhile is dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QRunnable, Qt, QThreadPool, Signal


class _Relay(QObject):
    """The signals a pool thread emits. It has no Qt parent, so it lives as long as Python
    holds it: a task still running when its dialog or window is deleted emits into a live
    object (Qt drops the queued call to the deleted receiver) instead of a freed one."""

    finished = Signal(int, object)
    failed = Signal(int, object)


class _Task(QRunnable):
    """Runs one call on a pool thread and emits its result or its exception."""

    def __init__(self, relay: _Relay, token: int, work: Callable[[], object]) -> None:
        super().__init__()
        self._relay, self._token, self._work = relay, token, work

    def run(self) -> None:
        try:
            result = self._work()
        except Exception as exc:  # handed to the UI thread, which says it in words
            self._relay.failed.emit(self._token, exc)
            return
        self._relay.finished.emit(self._token, result)


class Background(QObject):
    """Runs callables on a pool and calls `on_done(result)` or `on_failed(words)` on the UI
    thread; `describe` turns an exception into the words (by default its message)."""

    def __init__(self, parent: QObject, describe: Callable[[Exception], str] | None = None) -> None:
        super().__init__(parent)
        self._describe = describe or (lambda exc: str(exc) or repr(exc))
        self._tokens = itertools.count(1)
        self._callbacks: dict[int, tuple[Callable[[Any], None], Callable[[str], None]]] = {}
        self._relay = _Relay()
        self._relay.finished.connect(self._finished, Qt.ConnectionType.QueuedConnection)
        self._relay.failed.connect(self._failed, Qt.ConnectionType.QueuedConnection)

    def run(
        self,
        pool: QThreadPool,
        work: Callable[[], object],
        on_done: Callable[[Any], None],
        on_failed: Callable[[str], None],
    ) -> None:
        """Start `work` on `pool`; exactly one of the callbacks runs later, on this thread."""
        token = next(self._tokens)
        self._callbacks[token] = (on_done, on_failed)
        pool.start(_Task(self._relay, token, work))

    def _finished(self, token: int, result: object) -> None:
        on_done, _ = self._callbacks.pop(token)
        on_done(result)

    def _failed(self, token: int, exc: Exception) -> None:
        _, on_failed = self._callbacks.pop(token)
        on_failed(self._describe(exc))
