"""Python's cyclic garbage collection, run on the GUI thread only while the window lives.

CPython collects cycles in whichever thread allocates when a generation's count passes its
threshold: the engine host's reader thread, a pool thread, an executor. A cycle that holds a Qt
object (a closed dialog and its slots, a message widget and a closure over it) then runs the
C++ destructor off the GUI thread, against Qt's rule that an object dies in its own thread,
and Qt's event loop dies by SIGSEGV later, somewhere else each time (the window tests did,
after the engine tests had run in the same process). So while the window lives automatic
collection is off, and a timer on the GUI thread collects the oldest generation over its
threshold, as the automatic collector would have.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

INTERVAL_MS = 250  # how long garbage cycles may wait; a collection of young ones takes ~1 ms


class MainThreadCollector(QObject):
    """Turns automatic collection off and collects on this (the GUI) thread's timer;
    `close()` collects once more and gives collection back to CPython."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._was_enabled = gc.isenabled()
        gc.disable()
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.collect_due)
        self._timer.start(INTERVAL_MS)

    def collect_due(self) -> int:
        """Collect the oldest generation whose count passed its threshold (0: none was due)."""
        counts, thresholds = gc.get_count(), gc.get_threshold()
        for generation in (2, 1, 0):
            if thresholds[generation] and counts[generation] > thresholds[generation]:
                return gc.collect(generation)
        return 0

    def close(self) -> None:
        self._timer.stop()
        gc.collect()
        if self._was_enabled:
            gc.enable()
