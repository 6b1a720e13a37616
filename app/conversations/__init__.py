"""The conversation store: conversations, message trees, token-exact replies, search.

May import: paths and units only. Storage knows nothing of engines, models or the UI: a reply
is token ids and text, whoever sampled it; an attachment is a file's name and text.

store.py is the store; database.py opens and checks the file (an index that lost rows is
rebuilt; a damaged file is moved aside); repair.py keeps a damaged log and salvages a damaged
file into a fresh one, through SQL and, where SQL cannot read it, from its pages (pages.py
reads them, shapes.py tells which table a record is); forest.py makes the recovered rows
conversations that can be shown and continued.
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
