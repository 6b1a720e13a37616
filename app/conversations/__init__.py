"""The conversation store: conversations, message trees, token-exact replies, search.

May import: paths and units only. Storage knows nothing of engines, models or the UI: a reply
is token ids and text, whoever sampled it; an attachment is a file's name and text.
"""

from app.conversations.errors import (
    ConversationBusyError,
    CorruptDatabaseError,
    NewerSchemaError,
    StoreError,
    StoreFullError,
    StoreLockedError,
    UnknownConversationError,
    UnknownMessageError,
)
from app.conversations.models import Conversation, Message, Role, SearchHit, Status, ToolCall
from app.conversations.store import ConversationStore

__all__ = [
    "Conversation",
    "ConversationBusyError",
    "ConversationStore",
    "CorruptDatabaseError",
    "Message",
    "NewerSchemaError",
    "Role",
    "SearchHit",
    "Status",
    "StoreError",
    "StoreFullError",
    "StoreLockedError",
    "ToolCall",
    "UnknownConversationError",
    "UnknownMessageError",
]
