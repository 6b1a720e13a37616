"""The main window: sidebar, chat, composer, header with engine state, status line, menus.

Turns run as asyncio tasks on Qt's own loop (qasync), so the window never blocks: tokens
arrive as callbacks and are appended to the streaming bubble. Every error a user can reach
ends in the banner, in words, with the action that fixes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSettings, Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QMainWindow,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.conversations import Message, StoreError
from app.conversations.export import export_json, export_markdown, import_json
from app.engine.host import EngineCrashedError, EngineState
from app.engine.prewarm import Prewarmer
from app.engine.protocol import (
    ContextOverflowError,
    EngineError,
    FinishReason,
    TokenEvent,
)
from app.launch import resolve_load_options
from app.models.downloads import Downloads
from app.models.library import Library
from app.models.names import model_name
from app.server.control import LocalServer
from app.session import ChatSession, MessageTooLongError, TurnResult
from app.settings import Settings
from app.tool_loop import ToolTurn
from app.ui import banner_words, conversation_files, overflow, theme
from app.ui.about import AboutDialog, running_of
from app.ui.api_conversations import ApiConversations
from app.ui.api_server_dialog import ApiServerDialog
from app.ui.banner import Banner
from app.ui.chat_tools import ENDED_WORDS, ChatTools, in_tool_turn, rounds_line, unfinished
from app.ui.chat_view import ChatView
from app.ui.collector import MainThreadCollector
from app.ui.composer import Composer
from app.ui.draft_files import DraftFiles
from app.ui.elided import ElidedLabel
from app.ui.hardware import HardwareWizard
from app.ui.header import Header
from app.ui.keyboard import EmptyDraftPassesNavigation, refocus
from app.ui.menus import build_menus
from app.ui.message_view import MessageView
from app.ui.message_widget import drafts_words
from app.ui.model_picker import ModelSwitcher
from app.ui.models import ModelsDialog
from app.ui.notify import ReplyNotifier
from app.ui.panels import Panels, scrolling
from app.ui.remote_settings import RemoteSettingsDialog
from app.ui.safe_mode_line import SafeModeLine
from app.ui.settings_panel import ConversationSettings
from app.ui.sidebar import Sidebar
from app.ui.speculation_dialog import SpeculationDialog
from app.ui.tools_dialog import ToolsDialog
from app.ui.zoom import Zoom

log = logging.getLogger("stoke.ui")

STATE_LABELS = {
    EngineState.STOPPED: ("Stopped", theme.STATUS["idle"]),
    EngineState.LOADING: ("Loading model…", theme.STATUS["warn"]),
    EngineState.READY: ("Ready", theme.STATUS["ok"]),
    EngineState.PREFILLING: ("Prefilling…", theme.STATUS["busy"]),
    EngineState.GENERATING: ("Generating…", theme.STATUS["generating"]),
    EngineState.CRASHED: ("Crashed — restarting", theme.STATUS["error"]),
    EngineState.FAILED: ("Model failed to load", theme.STATUS["error"]),
}


def stats_line(stats: dict | None) -> str:
    """The status line of a turn: speed, the share of speculative drafts kept (when it
    drafted), and how much of the prompt came from the cache."""
    if not stats:
        return ""
    # Nothing prefilled (a continued reply, a warm prompt) has no speed worth a "0 tok/s".
    prefill = f"prefill {stats['prefill_tok_s']:,.0f} tok/s · " if stats["prefill_tok_s"] else ""
    drafts = f"{words} · " if (words := drafts_words(stats)) else ""
    return (
        f"TTFT {stats['ttft_s']:.2f} s · {prefill}"
        f"decode {stats['decode_tok_s']:,.0f} tok/s · {drafts}reused {stats['reused_tokens']:,} "
        f"of {stats['prompt_tokens']:,} prompt tokens"
    )


class MainWindow(QMainWindow):
    """The application a person uses every day."""

    engine_state_changed = Signal(object)  # an EngineState, for dialogs that follow it

    def __init__(self, session: ChatSession, settings: QSettings) -> None:
        super().__init__()
        self.collector = MainThreadCollector(self)  # Qt objects in garbage die on this thread
        self.session = session
        self.store = session.store
        self.api_conversations = ApiConversations(session, self)  # what the API server serves
        self.api_server = LocalServer(session.engine, self.api_conversations)  # Settings > API
        self.prewarm = Prewarmer(session)
        self.tools = ChatTools(session, self)  # MCP servers' tools in the chat (Settings > Tools)
        self._tool_turn_running = False
        session.on_progress = lambda reply_id, p: self.chat.show_progress(reply_id, p.done, p.total)
        self.settings = settings
        self.conversation_id: str | None = None
        self.turn: asyncio.Task | None = None
        self._streaming_id: str | None = None
        self._theme = str(settings.value("theme", "system"))
        self.setWindowTitle("Stoke")
        self.setWindowIcon(theme.app_icon())
        self.setAccessibleName("Stoke")
        self.resize(1180, 780)

        self.sidebar = Sidebar(self.store, self)
        self.api_conversations.kept.connect(self._api_conversation_kept)
        self.chat = ChatView(self)
        self.composer = Composer(self)
        self.banner = Banner(self)
        self.header = Header(self)
        self.model_label = self.header.model_label
        self.state_label = self.header.state_label
        self.warm_label = self.header.warm_label
        self.title_label = self.header.title_label
        right = QWidget(self)
        column = QVBoxLayout(right)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.header)
        column.addWidget(self.banner)
        column.addWidget(self.chat, 1)
        self.draft_files = DraftFiles(self)  # attachments, drops, the context meter
        column.addWidget(self.draft_files.bar)
        column.addWidget(self.composer)
        self.splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([270, 910])
        self.setCentralWidget(self.splitter)

        self.conversation_settings = ConversationSettings(self.store, self)
        self.safe_mode_line = SafeModeLine(session.engine, self)  # the model's, above them
        self.safe_mode_line.cleared.connect(
            lambda: self.model_switcher.reload("Safe mode cleared", self.model_switcher.loaded)
        )
        dock_body = QWidget(self)
        dock_column = QVBoxLayout(dock_body)
        dock_column.setContentsMargins(0, 0, 0, 0)
        dock_column.setSpacing(0)
        dock_column.addWidget(self.safe_mode_line)
        dock_column.addWidget(scrolling(self.conversation_settings), 1)
        self.settings_dock = QDockWidget("Conversation settings", self)
        self.settings_dock.setObjectName("settings-dock")
        self.settings_dock.setWidget(dock_body)
        self.settings_dock.setAccessibleName("Conversation settings")
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.settings_dock)
        self.settings_dock.hide()
        self.panels = Panels(self.splitter, self.sidebar, self.settings_dock, settings)
        EmptyDraftPassesNavigation(self.composer.editor)
        canvas = self.chat.findChild(QWidget, "chatCanvas")
        self.zoom = Zoom(settings, [canvas, self.composer.editor])  # View > Zoom In / Out
        self.notifier = ReplyNotifier(self)  # a reply done while the window is behind others
        self.status = ElidedLabel("", self)
        self.status.setAccessibleName("Last turn statistics")
        self.status.setContentsMargins(12, 0, 0, 0)
        self.statusBar().addWidget(self.status, 1)

        self.downloads = Downloads()
        threading.Thread(target=self.downloads.resume_pending, daemon=True).start()
        self.models_dialog: ModelsDialog | None = None
        build_menus(self)
        self._connect()
        self.model_switcher = ModelSwitcher(self)  # the header's model picker
        self.header.set_model_widget(self.model_switcher.picker)
        self.apply_theme(self._theme)
        self.header.reserve_state_width(text for text, _ in STATE_LABELS.values())
        session.engine.add_state_listener(self._engine_state)
        session.engine.add_notice_listener(self._engine_notice)  # e.g. a safe-mode restart
        self._engine_state(session.engine.state, "")
        for notice in session.engine.notices:  # said before the window existed
            self._engine_notice(notice)

    # -- layout --

    def _connect(self) -> None:
        self.sidebar.conversation_selected.connect(self.open_conversation)
        self.sidebar.message_selected.connect(self.show_found)
        self.sidebar.new_requested.connect(self.new_conversation)
        self.sidebar.conversation_deleted.connect(self._deleted)
        self.sidebar.conversation_renamed.connect(lambda _cid: self._refresh_title())
        self.composer.send_requested.connect(lambda text: self.spawn(self.send_message(text)))
        self.composer.stop_requested.connect(self.stop)
        self.composer.draft_changed.connect(self._draft_changed)
        self.composer.draft_settled.connect(self._save_draft)
        self.chat.edit_requested.connect(lambda mid, text: self.spawn(self.edit(mid, text)))
        self.chat.regenerate_requested.connect(lambda mid: self.spawn(self.regenerate(mid)))
        self.chat.continue_requested.connect(self.continue_reply)
        self.tools.call_changed.connect(self._call_changed)
        self.tools.round_done.connect(lambda _round: self._round_done())
        self.chat.branch_requested.connect(self.switch_branch)
        self.chat.copied.connect(lambda _text: self.statusBar().showMessage("Copied", 1500))
        self.conversation_settings.changed.connect(lambda _cid: self._refresh_title())
        QGuiApplication.styleHints().colorSchemeChanged.connect(
            lambda _scheme: self.apply_theme(self._theme)
        )

    # -- conversations --

    def open_conversation(self, conversation_id: str) -> None:
        if conversation_id == self.conversation_id:
            return
        if self.conversation_id is not None:
            self._save_draft(self.composer.settled_text())
            self.prewarm.switch_away(self.conversation_id)
        self.conversation_id = conversation_id
        self.banner.leave_conversation(conversation_id)  # its banners stay with it
        self.settings.setValue("conversation", conversation_id)
        self.sidebar.select(conversation_id)
        self.conversation_settings.load(conversation_id)
        self.composer.set_draft(self.store.get_draft(conversation_id))
        self.draft_files.switch(conversation_id)
        self.reload()
        self._warm_when_done(self.prewarm.open(conversation_id), conversation_id)
        self.composer.focus()
        self.model_switcher.opened(conversation_id)  # its own model, if it has one

    def show_found(self, message_id: str) -> None:
        """Scroll to a message a search found in the open conversation and mark it, on the
        branch that holds it (switched to when another one is shown)."""
        conversation_id = self.conversation_id
        if conversation_id is None:
            return
        if message_id not in {m.id for m in self.store.current_path(conversation_id)}:
            leaf = self.store.leaf_of(message_id)
            if not self._guard(lambda: self.store.set_current_leaf(conversation_id, leaf.id)):
                return
            self.reload()
        self.chat.show_message(message_id)

    def new_conversation(self) -> None:
        """Open an empty conversation: the untouched one there is, else a new one."""
        conversation = self.store.most_recent_empty() or self.store.create_conversation()
        self.sidebar.refresh()
        self.open_conversation(conversation.id)

    def _deleted(self, conversation_id: str) -> None:
        if conversation_id != self.conversation_id:
            return
        self.conversation_id = None
        remaining = self.store.list_conversations(limit=1)
        if remaining:
            self.open_conversation(remaining[0].id)
        else:
            self.new_conversation()

    def reload(self) -> None:
        """Show the current branch of the open conversation."""
        if self.conversation_id is None:
            self.chat.set_messages([])
            return
        path = self.store.current_path(self.conversation_id)
        self.chat.set_messages(self._views(path))
        replies = [m for m in path if m.role == "assistant" and m.stats]
        rounds = self.tools.rounds
        if replies and rounds and rounds[-1].reply_id == replies[-1].id:
            self._show_rounds()  # the tool turn just run: each of its rounds
        else:
            self.status.setText(stats_line(replies[-1].stats) if replies else "")
        self._refresh_title()

    def _views(self, path: list[Message]) -> list[MessageView]:
        """`path` as the chat shows it; a tool turn left unfinished offers Continue at its
        end (not while the turn runs, and only while the conversation has tools on)."""
        views = [self._view(m) for m in path]
        if (
            not self._tool_turn_running
            and unfinished(path)
            and self.tools.servers_for(path[-1].conversation_id) is not None
        ):
            views[-1] = dataclasses.replace(views[-1], resumable=True)
        return views

    def _view(self, message: Message) -> MessageView:
        siblings, _ = self.store.siblings(message.id)
        return MessageView(
            id=message.id,
            role=message.role,
            content=message.content,
            status=message.status,
            finish_reason=message.finish_reason,
            stats=message.stats,
            sibling_ids=tuple(s.id for s in siblings),
            attachments=tuple(message.attachments or ()),
            tool_calls=message.tool_calls,
            tool_name=message.tool_name,
        )

    def _refresh_title(self) -> None:
        if self.conversation_id is None:
            return
        conversation = self.store.get_conversation(self.conversation_id)
        imported = conversation_files.imported_note(conversation)
        served = conversation_files.served_note(conversation)
        title = conversation.title or "New conversation"
        marks = (" · imported" if imported else "") + (" · API" if served else "")
        self.title_label.setText(title + marks)
        self.title_label.setToolTip("\n".join(words for words in (imported, served) if words))

    def switch_branch(self, message_id: str) -> None:
        """Show the branch through `message_id` (at its latest leaf) and warm it."""
        if self.conversation_id is None or self.busy():
            return
        leaf = self.store.leaf_of(message_id)
        self.store.set_current_leaf(self.conversation_id, leaf.id)
        self.reload()
        self._warm_when_done(self.prewarm.open(self.conversation_id), self.conversation_id)

    def _warm_when_done(self, task: asyncio.Task, conversation_id: str) -> None:
        """Say "warm" in the header once the open conversation's KV is ready."""
        self.warm_label.setText("")

        def done(finished: asyncio.Task) -> None:
            stats = self.prewarm.last.get(conversation_id)
            if (
                not finished.cancelled()
                and conversation_id == self.conversation_id
                and stats is not None
                and stats.finish_reason == FinishReason.PREFILLED
            ):
                # no token count here: the context meter is the one place that shows it (two
                # counts taken at different moments read as two different answers)
                restored = " · restored from disk" if stats.restored_tokens else ""
                self.warm_label.setText(f"warm{restored}")

        task.add_done_callback(done)

    # -- drafts --

    def _draft_changed(self, text: str) -> None:
        if self.conversation_id is None:
            return
        task = self.prewarm.draft_changed(self.conversation_id, text, self.draft_files.records())
        task.add_done_callback(lambda done, draft=text: self.draft_warmed(done, draft))

    def draft_warmed(self, task: asyncio.Task, draft: str) -> None:
        stats = self.prewarm.last.get(self.conversation_id or "")
        warm = (
            not task.cancelled()
            and stats is not None
            and stats.finish_reason == FinishReason.PREFILLED
            and self.composer.text() == draft
        )
        self.composer.set_warm(warm)

    def _save_draft(self, text: str) -> None:
        if self.conversation_id is not None:
            self._guard(lambda: self.store.set_draft(self.conversation_id, text))

    # -- turns --

    def _api_conversation_kept(self, conversation_id: str, new: bool) -> None:
        """The API server's reply was kept: list it, and show it in the open conversation
        unless a turn of the window's is being written there."""
        self.sidebar.refresh()
        if conversation_id == self.conversation_id and not self.busy():
            self.reload()

    def busy(self) -> bool:
        """Whether a turn (or a model switch) is running."""
        return self.turn is not None and not self.turn.done()

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task | None:
        """Run `work` as the window's turn; None (and `work` closed) while one is running."""
        if self.busy():
            work.close()
            return None
        self.turn = asyncio.ensure_future(work)
        return self.turn

    async def send_message(self, text: str, *, drop_oldest: bool = False) -> TurnResult | None:
        if self.conversation_id is None:
            self.new_conversation()
        conversation_id = self.conversation_id
        files = self.draft_files.take()
        self.composer.set_draft("")
        self.composer.focus()  # also after a click on Send: the next message is typed here
        self._save_draft("")
        if self.tools.servers_for(conversation_id) is not None:
            return await self.run_turn(
                lambda **kw: self._tool_turn(
                    self.tools.send(conversation_id, text, attachments=files, **kw)
                )
            )
        return await self.run_turn(
            lambda **kw: self.session.send(conversation_id, text, attachments=files, **kw),
            drop_oldest=drop_oldest,
        )

    async def run_turn(
        self, start: Callable[..., Awaitable[TurnResult]], *args: Any, drop_oldest: bool = False
    ) -> TurnResult | None:
        """Run one turn with the window following it; errors end in the banner."""
        conversation_id = self.conversation_id
        if conversation_id is None:
            return None
        self.prewarm.cancel(conversation_id)
        self.banner.hide()
        self.composer.set_generating(True)
        kwargs: dict[str, Any] = {"on_token": self._token, "on_start": self._started}
        if drop_oldest:
            kwargs["drop_oldest"] = True
        result = None
        say = functools.partial(self.banner.show_message, conversation=conversation_id)
        try:
            result = await start(*args, **kwargs)
            if result is None:  # a tool turn stopped before the model was asked
                return None
            self.status.setText(stats_line(result.stats.as_dict() if result.stats else None))
            title = self.store.get_conversation(conversation_id).title or "Stoke"
            self.notifier.reply_finished(title, result.text)
            if result.dropped_turns:
                say(
                    f"Left out the {result.dropped_turns} oldest messages to fit the context.",
                    kind="info",
                )
        except MessageTooLongError as exc:
            say(str(exc), overflow.too_long_actions(self, exc))
        except ContextOverflowError as exc:
            say(
                str(exc),
                [
                    ("Drop oldest turns", lambda: self.spawn(self._retry_dropping())),
                    ("New conversation", self.new_conversation),
                ],
            )
        except EngineCrashedError as exc:
            say(
                f"{exc} Your reply was kept and marked interrupted; you can continue it.",
                cause="crash-turn",
            )
        except (EngineError, StoreError) as exc:
            say(str(exc))
        except OSError as exc:
            say(f"Stoke could not write to disk: {exc.strerror}.")
        finally:
            self._streaming_id = None
            self.composer.set_generating(False)
            if self.conversation_id == conversation_id:
                self.reload()
            self.sidebar.refresh()
            self.prewarm.after_reply(conversation_id)
            refocus(self, self.composer.editor)
            self.draft_files.refresh()
        return result

    async def _tool_turn(self, work: Awaitable[ToolTurn]) -> TurnResult | None:
        """A turn through the tool loop, as run_turn takes it: its last reply (None when it
        stopped before the model was asked), and why it stopped early in the banner."""
        conversation_id = self.conversation_id
        self._tool_turn_running = True
        try:
            turn = await work
        finally:
            self._tool_turn_running = False
        if turn.stopped is not None:
            self.banner.show_message(turn.stopped, kind="info", conversation=conversation_id)
        return turn.replies[-1] if turn.replies else None

    def continue_reply(self, message_id: str) -> None:
        """A reply's Continue: a turn with tool calls goes on through the tool loop (the calls
        and results kept), any other reply is continued where it stopped. The composer takes
        the focus back from the clicked Continue, which the finished reply hides."""
        self.composer.focus()
        conversation_id = self.conversation_id
        if (
            conversation_id is not None
            and self.tools.servers_for(conversation_id) is not None
            and in_tool_turn(self.store.path_to(message_id))
        ):
            self.spawn(
                self.run_turn(
                    lambda **kw: self._tool_turn(self.tools.resume(conversation_id, **kw))
                )
            )
        else:
            self.spawn(self.run_turn(self.session.continue_reply, message_id))

    def _call_changed(self, call_id: str, words: str) -> None:
        """A tool call's row says its state; once it ended, its result is shown under it."""
        if words in ENDED_WORDS and self.tools.conversation_id == self.conversation_id:
            self._show_stored()
        self.chat.set_call_state(call_id, words)

    def _round_done(self) -> None:
        """A round's reply is stored with its calls: their rows are shown, and its stats
        (while its conversation is the one open)."""
        if self.tools.conversation_id == self.conversation_id:
            self._show_stored()
            self._show_rounds()

    def _show_stored(self) -> None:
        """The open conversation's branch as stored (a tool turn's calls and results)."""
        if self.conversation_id is not None:
            self.chat.set_messages(self._views(self.store.current_path(self.conversation_id)))

    def _show_rounds(self) -> None:
        """The status line during and after a tool turn: each round's prefilled and reused
        tokens (the label's tooltip has all of it where it is cut)."""
        self.status.setText(rounds_line(self.tools.rounds))

    async def _retry_dropping(self) -> TurnResult | None:
        """Answer the message that did not fit, leaving out the oldest turns."""
        leaf = self.store.current_path(self.conversation_id)[-1]
        return await self.run_turn(
            lambda **kw: self.session.send(
                self.conversation_id, leaf.content, attachments=leaf.attachments, **kw
            ),
            drop_oldest=True,
        )

    def _started(self, user: Message, reply: Message) -> None:
        if user.conversation_id != self.conversation_id:
            return
        path = self.store.path_to(user.id)
        self.chat.set_messages(self._views(path))
        self._streaming_id = reply.id
        self.chat.begin_reply(self._view(reply))
        self.chat.scroll_to_end()  # the new message in view, also when scrolled up
        refocus(self, self.composer.editor)

    def _token(self, event: TokenEvent) -> None:
        if self._streaming_id is not None:
            self.chat.append_reply(self._streaming_id, event.text)

    def stop(self) -> None:
        self.session.cancel()

    def regenerate_last(self) -> None:
        if self.conversation_id is None:
            return
        path = self.store.current_path(self.conversation_id)
        replies = [m for m in path if m.role == "assistant"]
        if replies:
            self.spawn(self.regenerate(replies[-1].id))

    async def regenerate(self, reply_id: str) -> TurnResult | None:
        """A new reply beside `reply_id`: through the tool loop in a conversation with
        tools (the model may call them again), else a plain reply."""
        conversation_id = self.conversation_id
        if conversation_id is not None and self.tools.servers_for(conversation_id) is not None:
            return await self.run_turn(
                lambda **kw: self._tool_turn(self.tools.regenerate(conversation_id, reply_id, **kw))
            )
        return await self.run_turn(self.session.regenerate, reply_id)

    async def edit(self, user_message_id: str, text: str) -> TurnResult | None:
        """The person's message edited and sent again, through the tool loop where the
        conversation has tools."""
        conversation_id = self.conversation_id
        if conversation_id is not None and self.tools.servers_for(conversation_id) is not None:
            return await self.run_turn(
                lambda **kw: self._tool_turn(
                    self.tools.edit(conversation_id, user_message_id, text, **kw)
                )
            )
        return await self.run_turn(self.session.edit, user_message_id, text)

    # -- engine, theme, settings --

    def _engine_state(self, state: EngineState, detail: str) -> None:
        text, color = STATE_LABELS.get(state, (str(state), theme.STATUS["idle"]))
        self.state_label.setText(text)
        self.state_label.setStyleSheet(f"background: {color}; color: white;")
        info = self.session.engine.info
        if state == EngineState.READY and info is not None:
            supported = self.session.template().supports_reasoning_switch
            self.conversation_settings.set_reasoning_supported(supported)
        path = self.session.engine.options.model_path
        self.model_label.setText(model_name(path) if path else info.name if info else "")
        if state == EngineState.FAILED and detail:
            self.banner.show_message(
                f"{detail}\nChoose another model in Settings, or start Stoke with --model PATH."
            )
        elif state == EngineState.CRASHED and detail and detail not in self.session.engine.notices:
            self.banner.show_message(detail, cause="restart")
        elif state == EngineState.READY:
            banner_words.restarted(self.banner)  # "Restarting it." is done now
        self.engine_state_changed.emit(state)

    def _engine_notice(self, text: str) -> None:
        """A setting the engine host changed itself, in one line: worth reading, no error."""
        self.banner.show_message(text, kind="info")

    @property
    def theme_name(self) -> str:
        return self._theme

    def apply_theme(self, name: str) -> None:
        self._theme = name
        self.findChild(QAction, f"theme-{name}").setChecked(True)  # View > Theme marks it
        self.settings.setValue("theme", name)
        dark = theme.apply(QApplication.instance(), name)
        self.chat.set_dark(dark)
        self.banner.set_dark(dark)

    def open_models(self) -> ModelsDialog:
        """File > Models: the library, downloads and the catalog."""
        if self.models_dialog is None:
            self.models_dialog = ModelsDialog(Library(), self.downloads, parent=self)
            self.models_dialog.load_requested.connect(self.model_switcher.choose)
            self.models_dialog.library_refreshed.connect(self.model_switcher.refresh)
            self.models_dialog.plan_requested.connect(self.open_hardware_wizard)
        self.models_dialog.set_loaded_path(self.session.engine.options.model_path)
        self.models_dialog.show()
        self.models_dialog.raise_()
        return self.models_dialog

    async def switch_model(self, path: str | None) -> None:
        """Restart the engine on another model (None: as Settings now say), with its saved
        load settings; the open conversation's KV is snapshotted first, for the way back."""
        self.session.cancel()
        self.prewarm.cancel()  # prefills on the old model are wasted work now
        if self.conversation_id is not None:
            self.prewarm.after_reply(self.conversation_id)
        await self.prewarm.idle()
        engine = self.session.engine
        await engine.close()
        settings = Settings.load()
        # as Stoke starts it: nothing of the previous model's placement or context carries over
        engine.options = resolve_load_options(path, settings)
        if path is not None:
            settings.model_path = path
            settings.save()
        if self.models_dialog is not None:
            self.models_dialog.set_loaded_path(engine.options.model_path)
        with contextlib.suppress(EngineError):  # the header and the banner say why
            await engine.start()
        if self.conversation_id is not None:
            self._warm_when_done(self.prewarm.open(self.conversation_id), self.conversation_id)

    def open_hardware_wizard(self, model_path: str | None = None) -> HardwareWizard:
        """Settings > Hardware: the devices, and the plan the model loads with."""
        path = model_path or self.session.engine.options.model_path
        wizard = HardwareWizard(path, parent=self)
        wizard.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        wizard.applied.connect(lambda _options: self.model_switcher.plan_applied(path))
        wizard.open()
        return wizard

    def open_remote_settings(self) -> RemoteSettingsDialog:
        """Settings > Remote Server: chat through an OpenAI-compatible server."""
        dialog = RemoteSettingsDialog(self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self.model_switcher.reload("Remote server saved", None))
        dialog.open()
        return dialog

    def open_speculation_settings(self) -> SpeculationDialog:
        """Settings > Speculative Decoding: the method and the draft model; saving reloads
        the loaded model with them."""
        path = self.model_switcher.loaded
        dialog = SpeculationDialog(path, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(
            lambda: self.model_switcher.reload("Speculative decoding saved", path)
        )
        dialog.open()
        return dialog

    def open_about(self) -> AboutDialog:
        """Help > About: versions, folders, and the diagnostics to copy."""
        dialog = AboutDialog(self, lambda: running_of(self.session.engine))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def open_api_server_settings(self) -> ApiServerDialog:
        """Settings > API Server: the OpenAI-compatible API on the window's engine."""
        dialog = ApiServerDialog(self.api_server, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def open_tools_settings(self) -> ToolsDialog:
        """Settings > Tools: the MCP servers, their states, and the rounds a turn may take."""
        dialog = ToolsDialog(self.tools, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def toggle_settings(self) -> None:
        self.panels.toggle_settings()

    # -- import / export --

    def export_dialog(self, kind: str) -> None:
        if self.conversation_id is None:
            return
        title = self.store.get_conversation(self.conversation_id).title
        dialog = conversation_files.export_dialog(self, title, kind)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.fileSelected.connect(lambda path: self.export_to(Path(path), kind))
        dialog.open()

    def export_to(self, path: Path, kind: str) -> None:
        path = conversation_files.with_suffix(path, kind)

        def write() -> None:
            if kind == "md":
                text = export_markdown(self.store, self.conversation_id)
            else:
                text = json.dumps(export_json(self.store, self.conversation_id), indent=2)
            path.write_text(text, "utf-8")

        if self._guard(write):
            self.statusBar().showMessage(f"Exported to {path}", 3000)

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import conversation", "", "JSON (*.json)")
        if path:
            self.import_from(Path(path))

    def import_from(self, path: Path) -> None:
        def read() -> None:
            try:
                data = json.loads(path.read_text("utf-8"))
            except ValueError as exc:  # not JSON, or not text at all
                raise StoreError(
                    f"{path.name} is not a JSON file, so not a Stoke conversation export."
                ) from exc
            conversation = import_json(self.store, data)
            self.sidebar.refresh()
            self.open_conversation(conversation.id)
            title = conversation.title or "the conversation"
            self.banner.show_message(
                f"Imported {title} from {path.name}.", kind="success", conversation=conversation.id
            )

        self._guard(read, cause="import")

    def _guard(self, work: Callable[[], object], cause: str = "") -> bool:
        """Run a storage action; a failure becomes a sentence in the banner."""
        try:
            work()
        except StoreError as exc:
            self.banner.show_message(str(exc), cause=cause)
            return False
        except OSError as exc:
            self.banner.show_message(f"Stoke could not use the disk: {exc.strerror}.", cause=cause)
            return False
        return True

    # -- window state --

    def restore_state(self) -> None:
        geometry = self.settings.value("geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        splitter = self.settings.value("splitter")
        if isinstance(splitter, QByteArray):
            self.splitter.restoreState(splitter)
        self.panels.restore()
        self.sidebar.refresh()
        last = str(self.settings.value("conversation", "") or "")
        try:
            conversation = self.store.get_conversation(last) if last else None
        except StoreError:
            conversation = None
        conversation = conversation or self.store.most_recent()
        if conversation is None:
            self.new_conversation()
        else:
            self.open_conversation(conversation.id)

    def closeEvent(self, event: QCloseEvent) -> None:
        self._save_draft(self.composer.settled_text())
        self.conversation_settings.flush()  # an edit still waiting out its pause
        self.settings.setValue("geometry", self.saveGeometry())
        self.settings.setValue("splitter", self.splitter.saveState())
        self.panels.save()
        self.settings.sync()
        super().closeEvent(event)
