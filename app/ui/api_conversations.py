"""API conversations in the window: the reply sink of the API server beside it.

The server calls `served` as each chat reply finishes, on whatever thread it runs; the reply
crosses to the UI thread as a queued signal (the hand-over background.py uses), so the
server never waits on the store and the store is only ever used from the UI thread. There
the session keeps the turn (app/conversations/served.py: appended to the API conversation it
continues, or a new one), and `kept` tells the window which conversation changed. A store
that refuses the write (read-only, full) costs the window the turn, never the client its
reply: the refusal is logged in words.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Qt, Signal

from app.conversations import StoreError, ToolCall
from app.conversations.attachments import AttachmentError
from app.conversations.served import ServedMessage, ServedTurn
from app.engine.transcript import IMAGE_MARK
from app.server import served
from app.session import ChatSession

log = logging.getLogger("stoke.ui")


class _Relay(QObject):
    """Carries a reply to the UI thread. No Qt parent: a reply finishing while the window
    is torn down emits into a live object, and Qt drops the call to the deleted receiver."""

    arrived = Signal(object)


class ApiConversations(QObject):
    """The window's ReplySink: served replies kept as conversations of its store."""

    kept = Signal(str, bool)  # conversation id, whether it is new

    def __init__(self, session: ChatSession, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._session = session
        self._relay = _Relay()
        self._relay.arrived.connect(self._keep, Qt.ConnectionType.QueuedConnection)

    def served(self, reply: served.ServedReply) -> None:
        """ReplySink: called by the server, from any thread; returns at once."""
        self._relay.arrived.emit(reply)

    def _keep(self, reply: served.ServedReply) -> None:
        try:
            kept = self._session.keep_served(served_turn(reply))
        except (StoreError, AttachmentError) as exc:  # a full disk, a picture not kept
            log.warning(
                "The API server answered a request on %s, but the window could not keep the "
                "conversation: %s",
                reply.endpoint,
                exc,
            )
            return
        self.kept.emit(kept.conversation_id, kept.new)


def served_turn(reply: served.ServedReply) -> ServedTurn:
    """The server's record of a reply in the store's terms."""
    history = tuple(
        ServedMessage(
            m.role,
            _without_marks(m.text) if m.images else m.text,
            _calls(m.tool_calls),
            m.tool_call_id,
            m.tokens,
            reply.fingerprint if m.tokens is not None else None,
            m.images,
        )
        for m in reply.messages
    )
    answer = ServedMessage(
        "assistant",
        reply.text,
        _calls(reply.tool_calls),
        token_ids=reply.reply_tokens,
        tokens_fingerprint=reply.fingerprint if reply.reply_tokens is not None else None,
    )
    return ServedTurn(
        reply.system,
        history,
        answer,
        model=reply.model_path,  # conversations remember their model by its file
        client=reply.client,
        finish_reason=reply.finish_reason,
        stats=reply.stats,
    )


def _without_marks(text: str) -> str:
    """A served message's words without the marks where its pictures stood: the window keeps
    the pictures as attachments, which a message shows (and its prompt holds) before them."""
    return "\n".join(line for line in text.split("\n") if line != IMAGE_MARK).replace(
        IMAGE_MARK, ""
    )


def _calls(calls: tuple) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(call.id, call.name, call.arguments) for call in calls)
