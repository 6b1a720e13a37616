"""The wizard's "Other machines" card: llama.cpp rpc-servers the plan may split a model over.

The user writes them as `stoke plan --rpc` takes them (`HOST:PORT[=SIZE][@LINK]`, comma
separated, app/hardware/rpc.py). Check asks each server for its devices' memory and round
trip on a pool thread (a probe waits up to 20 s for a busy server) and lists each device or
why it was left out; a described device (`=SIZE`) is used as written. The devices found feed
the plan; Apply keeps the text in Settings, where `stoke doctor` checks the same servers.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, QThreadPool
from PySide6.QtWidgets import QHBoxLayout, QLineEdit, QPushButton, QWidget

from app.hardware.placement import DeviceBudget
from app.hardware.rpc import budgets, parse_specs
from app.ui.a11y import described
from app.ui.background import Background
from app.ui.hardware.parts import selectable_label, titled_card
from app.units import gib


class RemoteMachines(QObject):
    """The card's widgets and the remote devices they found (`devices`)."""

    def __init__(self, parent: QWidget, text: str, on_change: Callable[[], None]) -> None:
        super().__init__(parent)
        self.devices: list[DeviceBudget] = []
        self._on_change = on_change
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)
        self._tasks = Background(self)
        self.card, column = titled_card("Other machines (llama.cpp rpc-server)", parent)
        row = QHBoxLayout()
        self.edit = QLineEdit(text, self.card)
        self.edit.setPlaceholderText("mac.local:50052=96GiB@10GbE, 10.0.0.7:50052")
        described(
            self.edit,
            "rpc-servers",
            "HOST:PORT of each rpc-server, comma-separated; =SIZE describes one that is not "
            "running now, @10GbE gives its link",
        )
        self.edit.returnPressed.connect(self.check)
        self.check_button = QPushButton("Check", self.card)
        described(self.check_button, "Check", "Ask each rpc-server for its memory and round trip")
        self.check_button.clicked.connect(self.check)
        row.addWidget(self.edit, 1)
        row.addWidget(self.check_button)
        column.addLayout(row)
        self.status = selectable_label("", self.card, role="muted")
        self.status.setAccessibleName("What the rpc-servers answered")
        column.addWidget(self.status)

    def text(self) -> str:
        return self.edit.text().strip()

    def check(self) -> None:
        """Probe what the line names, off the UI thread; the plan follows the answer."""
        try:
            specs = parse_specs([self.text()])
        except ValueError as exc:
            self.status.setText(f"{exc}.")
            return
        if not specs:
            self._show(([], [], []))
            return
        self.check_button.setEnabled(False)
        self.status.setText("Asking the rpc-servers…")
        self._tasks.run(self._pool, lambda: budgets(specs), self._show, self._failed)

    def _show(self, answer: tuple[list[DeviceBudget], list[str], list]) -> None:
        devices, notes, _ = answer
        self.check_button.setEnabled(True)
        self.devices = devices
        lines = [
            f"{d.name}: {gib(d.budget)} for the plan"
            + (f", {d.link.rtt_s * 1000:.2f} ms round trip" if d.link and d.link.rtt_s else "")
            for d in devices
        ]
        self.status.setText("\n".join([*lines, *notes]) or "No other machines: this one only.")
        self._on_change()

    def _failed(self, words: str) -> None:
        self.check_button.setEnabled(True)
        self.status.setText(f"Stoke could not ask the rpc-servers: {words}")
