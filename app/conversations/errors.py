"""Store errors. Their messages are written for the user and can be shown as they are."""

from __future__ import annotations

from pathlib import Path


class StoreError(Exception):
    """Base of every error the conversation store raises on purpose."""


class UnknownConversationError(StoreError):
    def __init__(self, conversation_id: str, *, ambiguous: bool = False) -> None:
        self.conversation_id = conversation_id
        if ambiguous:
            what = f"The id '{conversation_id}' matches several conversations; type more of it."
        else:
            what = f"No conversation with id '{conversation_id}'."
        super().__init__(f"{what} Run `stoke chat --list` to see them.")


class UnknownMessageError(StoreError):
    def __init__(self, message_id: str, conversation_id: str | None = None) -> None:
        self.message_id = message_id
        where = f" in conversation '{conversation_id}'" if conversation_id else ""
        super().__init__(f"No message with id '{message_id}'{where}.")


class StoreLockedError(StoreError):
    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(
            f"The conversation database {path} is locked by another program. "
            "Close other Stoke windows and try again."
        )


class CorruptDatabaseError(StoreError):
    """Raised mid-session; `ConversationStore.open` instead moves the damaged file aside."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        super().__init__(
            f"The conversation database {path} is damaged ({reason}). "
            "Restart Stoke: it will set the damaged file aside and recover what it can."
        )


class StoreFullError(StoreError):
    """The disk under the database has no room; says how much to free and where."""

    def __init__(self, path: Path, needed_mb: int) -> None:
        self.path = path
        self.needed_mb = needed_mb
        super().__init__(
            f"The disk is full: free {needed_mb} MB on the disk that holds {path.parent} "
            "(where Stoke keeps your conversations), then try again."
        )


class ConversationBusyError(StoreError):
    """Another process's turn holds the conversation and this one stopped waiting for it."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        who = f"Another Stoke (process {pid})" if pid else "Another Stoke"
        super().__init__(
            f"{who} is replying in this conversation, so your message was not sent. "
            "Send it again when that reply has ended."
        )


class NewerSchemaError(StoreError):
    def __init__(self, path: Path, found: int, known: int) -> None:
        self.path = path
        self.found = found
        self.known = known
        super().__init__(
            f"The conversation database {path} was made by a newer Stoke (schema version "
            f"{found}; this Stoke knows up to {known}). Update Stoke to open it."
        )


class ImportFormatError(StoreError):
    """The file is not a conversation this Stoke can import; the message says why."""
