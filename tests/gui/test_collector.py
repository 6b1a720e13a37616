"""Garbage cycles that hold Qt objects are collected on the GUI thread, never on the thread
that happened to allocate (app/ui/collector.py)."""

from __future__ import annotations

import gc
import threading

from PySide6.QtCore import QObject
from pytestqt.qtbot import QtBot

from app.ui.collector import MainThreadCollector


class _Cycle:
    """A garbage cycle holding a QObject; records the thread that collects it."""

    def __init__(self, seen: list[int]) -> None:
        self.me = self
        self.qobject = QObject()
        self.seen = seen

    def __del__(self) -> None:
        self.seen.append(threading.get_ident())


def _garbage(seen: list[int]) -> None:
    """Cycles enough to pass generation 0's threshold: a collection is due."""
    for _ in range(2 * gc.get_threshold()[0]):
        _Cycle(seen)


def _allocate() -> None:
    """What would trigger the due collection here, in this thread, were it automatic."""
    kept = [[i] for i in range(gc.get_threshold()[0])]
    assert kept


def test_a_cycle_dropped_while_another_thread_allocates_dies_on_the_gui_thread(
    qtbot: QtBot,
) -> None:
    collector = MainThreadCollector()
    try:
        assert not gc.isenabled()
        seen: list[int] = []
        _garbage(seen)
        worker = threading.Thread(target=_allocate)
        worker.start()
        worker.join()
        assert seen == []  # the allocating thread did not collect it
        # Each free lowers generation 0's count, and an earlier test's objects freed while
        # this one waits (test_chat_view's 3,000 messages) kept it below the threshold, so
        # the wait allocates as the app's GUI thread would: a collection comes due again.
        kept: list[list[int]] = []

        def collected() -> bool:
            kept.extend([i] for i in range(gc.get_threshold()[0]))
            return bool(seen)

        qtbot.waitUntil(collected, timeout=10_000)  # the timer did, here
        assert set(seen) == {threading.get_ident()}
    finally:
        collector.close()
    assert gc.isenabled()


def test_closing_collects_what_is_left_and_keeps_a_disabled_collector_off() -> None:
    gc.disable()
    try:
        collector = MainThreadCollector()
        seen: list[int] = []
        _Cycle(seen)
        collector.close()
        assert seen == [threading.get_ident()] and not gc.isenabled()
    finally:
        gc.enable()
