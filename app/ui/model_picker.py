"""The model in the chat: a picker in the header with the library's models and their fit on
this machine, and the switching it asks for.

`ModelPicker` is the widget: one row per model (the library's, the bundled one, and the
loaded model when it lives elsewhere), named as everywhere else (app.models.names), each with
a coloured fit badge and the verdict in words (the catalog's size rule, app.models.catalog).
It says which model the user chose; it never loads anything itself.

`ModelSwitcher` owns the picker for the window: it scans the library and checks the hardware
off the UI thread, follows the engine (the picker shows what is loaded, and is disabled while
a model loads), switches models through the window's `switch_model` (which keeps the
conversation open and its KV snapshot for the way back), and remembers each conversation's
model (`conversations.model`): opening a conversation whose model differs from the loaded one
switches to it. Settings that change how the model loads (Hardware > Apply, Remote Server)
apply at once through the same reload, after the running reply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, QSize, Qt, QThreadPool, Signal
from PySide6.QtGui import QColor, QIcon, QPainter, QPaintEvent, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QStatusBar,
    QStyle,
    QStyleOptionComboBox,
    QStylePainter,
    QWidget,
)

from app.engine.host import EngineState
from app.hardware.detect import Hardware, detect
from app.models.catalog import size_verdict
from app.models.library import Library, ModelEntry
from app.models.names import model_name
from app.ui.background import Background
from app.ui.models.library_tab import library_pool
from app.ui.models.words import FIT_COLORS, FIT_TIPS, fit_level, library_error_words

if TYPE_CHECKING:
    from app.conversations import ConversationStore
    from app.session import ChatSession

PATH_ROLE = Qt.ItemDataRole.UserRole + 1
NAME_ROLE = Qt.ItemDataRole.UserRole + 2
BADGE_SIZE = 10


@dataclass(frozen=True)
class Choice:
    """One row of the picker."""

    path: str
    name: str
    verdict: str | None  # None: not known (yet, or the model is not in the library)


def choices(
    models: list[ModelEntry], hardware: Hardware | None, loaded: str | None
) -> list[Choice]:
    """The picker's rows: the models by name, and the loaded one even when it lives elsewhere."""
    rows = [
        Choice(
            str(m.path),
            m.name,
            size_verdict(m.size_bytes, bool(m.expert_count), hardware) if hardware else None,
        )
        for m in sorted(models, key=lambda m: m.name.lower())
    ]
    if loaded and all(row.path != loaded for row in rows):
        rows.insert(0, Choice(loaded, model_name(loaded), None))
    return rows


def badge(color: str) -> QIcon:
    """A filled dot in the verdict's colour."""
    pixmap = QPixmap(BADGE_SIZE, BADGE_SIZE)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setBrush(QColor(color))
    painter.setPen(Qt.PenStyle.NoPen)
    painter.drawEllipse(0, 0, BADGE_SIZE, BADGE_SIZE)
    painter.end()
    return QIcon(pixmap)


class ModelPicker(QComboBox):
    """The header's model chooser; `model_chosen(path)` when the user picks another one."""

    model_chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("model-picker")
        self.setAccessibleName("Model")
        self.setToolTip("The model this conversation chats with; pick another to switch")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(24)  # long names elide: the header never widens
        self.setIconSize(QSize(BADGE_SIZE, BADGE_SIZE))
        self._current: str | None = None
        self.activated.connect(self._activated)

    def set_choices(self, rows: list[Choice], current: str | None) -> None:
        self.blockSignals(True)
        self.clear()
        for row in rows:
            level = fit_level(row.verdict) if row.verdict else "unknown"
            text = f"{row.name}  ·  {row.verdict}" if row.verdict else row.name
            self.addItem(badge(FIT_COLORS[level]), text, row.path)
            self.setItemData(self.count() - 1, row.path, PATH_ROLE)
            self.setItemData(self.count() - 1, row.name, NAME_ROLE)
            tip = FIT_TIPS.get(row.verdict or "", "Fit on this machine: not known")
            self.setItemData(self.count() - 1, f"{row.path}\n{tip}", Qt.ItemDataRole.ToolTipRole)
        self.blockSignals(False)
        self.view().setMinimumWidth(self.view().sizeHintForColumn(0) + 2 * BADGE_SIZE)
        self.set_current(current)

    def paintEvent(self, _event: QPaintEvent) -> None:
        """The closed picker shows the name alone, elided in the middle (the quantization at
        its end stays readable); the open list shows each verdict in words."""
        painter = QStylePainter(self)
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, option)
        field = self.style().subControlRect(
            QStyle.ComplexControl.CC_ComboBox,
            option,
            QStyle.SubControl.SC_ComboBoxEditField,
            self,
        )
        name = str(self.currentData(NAME_ROLE) or "")
        room = field.width() - self.iconSize().width() - 8
        option.currentText = self.fontMetrics().elidedText(name, Qt.TextElideMode.ElideMiddle, room)
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, option)

    def set_current(self, path: str | None) -> None:
        """Show `path` as the loaded model (no signal)."""
        self._current = path
        index = self.findData(path, PATH_ROLE) if path else -1
        self.blockSignals(True)
        self.setCurrentIndex(index)
        self.blockSignals(False)

    def current_path(self) -> str | None:
        return self._current

    def paths(self) -> list[str]:
        return [self.itemData(i, PATH_ROLE) for i in range(self.count())]

    def verdict_of(self, path: str) -> str:
        """The row's text after the name: its verdict ("" when not known)."""
        text = self.itemText(self.findData(path, PATH_ROLE))
        return text.split("  ·  ", 1)[1] if "  ·  " in text else ""

    def _activated(self, index: int) -> None:
        path = self.itemData(index, PATH_ROLE)
        if path and path != self._current:
            self.set_current(self._current)  # until the engine has loaded it
            self.model_chosen.emit(path)


class SwitcherWindow(Protocol):
    """The main window as the switcher uses it: its session and store, the open conversation,
    its turn (a switch runs as one, never beside a reply) and its status line."""

    session: ChatSession
    store: ConversationStore
    conversation_id: str | None
    turn: asyncio.Task | None

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task | None: ...

    def busy(self) -> bool: ...

    async def switch_model(self, path: str | None) -> None: ...

    def statusBar(self) -> QStatusBar: ...


class ModelSwitcher(QObject):
    """The window's picker, its background scans, and the conversation's remembered model."""

    def __init__(self, window: SwitcherWindow) -> None:
        super().__init__(window)
        self.window = window
        self.picker = ModelPicker(window)
        self.hardware: Hardware | None = None
        self.models: list[ModelEntry] = []
        self.scans = 0  # finished library scans, for whoever waits on one
        self.reloading: asyncio.Task | None = None
        self._background = Background(self, library_error_words)
        self.picker.model_chosen.connect(self.choose)
        window.session.engine.add_state_listener(self._engine_state)
        self._background.run(
            QThreadPool.globalInstance(), detect, self._hardware_found, lambda _words: None
        )
        self.refresh()

    @property
    def loaded(self) -> str:
        return self.window.session.engine.options.model_path

    def refresh(self) -> None:
        """Rescan the library in the background, then show it."""
        self._background.run(  # the Models page's one library thread: scans never race
            library_pool(), lambda: Library().listed(), self._scanned, self._failed
        )

    def _scanned(self, models: list[ModelEntry]) -> None:
        self.models = models
        self.scans += 1
        self._show()

    def _failed(self, words: str) -> None:
        self.scans += 1
        self._say(f"The model list could not be read: {words}")
        self._show()

    def _hardware_found(self, hardware: Hardware) -> None:
        self.hardware = hardware
        self._show()

    def _show(self) -> None:
        self.picker.set_choices(choices(self.models, self.hardware, self.loaded), self.loaded)

    def _engine_state(self, state: EngineState, _detail: str) -> None:
        self.picker.setEnabled(state not in (EngineState.LOADING, EngineState.STOPPED))
        if self.picker.findData(self.loaded, PATH_ROLE) < 0:
            self._show()
        else:
            self.picker.set_current(self.loaded)

    # -- switching --

    def choose(self, path: str) -> None:
        """The user picked `path`: load it, and remember it as this conversation's model."""
        if self.window.spawn(self.switch(path)) is None:
            self._say("Wait for the reply to finish, then switch models")

    async def switch(self, path: str) -> None:
        window = self.window
        window.statusBar().showMessage(f"Loading {model_name(path)}…")
        self.picker.setEnabled(False)
        await window.switch_model(path)
        if window.conversation_id is not None and window.session.engine.info is not None:
            window.store.set_model(window.conversation_id, path)
        window.statusBar().clearMessage()
        self._show()

    # -- settings that apply now --

    def plan_applied(self, path: str) -> None:
        """Settings > Hardware > Apply: the loaded model reloads with its new plan at once."""
        if path == self.loaded:
            self.reload("Hardware plan applied", path)
        else:
            self._say(f"Hardware plan saved: {model_name(path)} loads with it when you pick it")

    def reload(self, what: str, path: str | None) -> None:
        """Reload the engine in the background (`path`, or None: as Settings now say), the
        conversation kept open and its KV snapshot restored when the model is the same;
        after the running reply, if one is running."""
        self.reloading = asyncio.ensure_future(self._reload(what, path))

    async def _reload(self, what: str, path: str | None) -> None:
        window = self.window
        while window.busy():  # a reply (or another switch) first
            await asyncio.wait([window.turn])
        if window.spawn(self._reloaded(what, path)) is None:
            return
        await window.turn

    async def _reloaded(self, what: str, path: str | None) -> None:
        self._say(f"{what}: reloading the model…")
        self.picker.setEnabled(False)
        await self.window.switch_model(path)
        engine = self.window.session.engine
        done = "the model reloaded with it" if engine.info else "the model did not load"
        self._say(f"{what}: {done}")
        self._show()

    def opened(self, conversation_id: str) -> None:
        """A conversation was opened: remember the loaded model for a new one; for one with a
        model of its own, switch to it (or, while the engine is still starting, say so)."""
        store = self.window.store
        wanted = store.get_conversation(conversation_id).model
        if not wanted:
            if self.loaded:
                store.set_model(conversation_id, self.loaded)
            return
        if wanted == self.loaded:
            return
        name = model_name(wanted)
        if not Path(wanted).exists():
            self._say(f"This conversation was with {name}, no longer on disk: it goes on here")
        elif self.window.session.engine.state != EngineState.READY or self.window.busy():
            self._say(f"This conversation was with {name}: pick it above to switch back")
        else:
            self.window.spawn(self.switch(wanted))

    def _say(self, text: str) -> None:
        self.window.statusBar().showMessage(text, 8000)
