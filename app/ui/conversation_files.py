"""Conversations as files in the window: the export dialog with a suggested name and an
extension that is never lost, and the words that mark an imported or an API conversation."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

from app.conversations import Conversation

SUFFIXES = {"json": ".json", "md": ".md"}
_FILTERS = {"json": "JSON (*.json)", "md": "Markdown (*.md)"}
_UNSAFE = re.compile(r'[\x00-\x1f<>:"/\\|?*]+')  # not allowed in a name on some system
_NAME_MAX = 80
FALLBACK_NAME = "conversation"


def suggested_name(title: str | None, kind: str) -> str:
    """The conversation's title as a file name every system accepts, with its extension."""
    name = _UNSAFE.sub(" ", title or "")
    name = " ".join(name.split()).strip(" .")[:_NAME_MAX].rstrip(" .")
    return (name or FALLBACK_NAME) + SUFFIXES[kind]


def with_suffix(path: Path, kind: str) -> Path:
    """`path` with the export's extension added when the user left it out."""
    suffix = SUFFIXES[kind]
    return path if path.suffix.lower() == suffix else path.with_name(path.name + suffix)


def export_dialog(parent: QWidget, title: str | None, kind: str, folder: str = "") -> QFileDialog:
    """A save dialog that proposes the title as the name and appends the extension itself."""
    dialog = QFileDialog(parent, "Export conversation", folder, _FILTERS[kind])
    dialog.setObjectName(f"export-{kind}")
    dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
    dialog.setFileMode(QFileDialog.FileMode.AnyFile)
    dialog.setDefaultSuffix(SUFFIXES[kind].lstrip("."))
    dialog.selectFile(suggested_name(title, kind))
    return dialog


def imported_note(conversation: Conversation) -> str:
    """The words "Imported 2026-12-01 14:05" for a conversation read from a file, else ""."""
    if conversation.imported_at is None:
        return ""
    return f"Imported {datetime.fromtimestamp(conversation.imported_at):%Y-%m-%d %H:%M}"


def served_note(conversation: Conversation) -> str:
    """The words "Through the API, for CLIENT, since 2026-12-01 14:05" for a conversation the
    API server beside the window served, else ""."""
    if conversation.served_at is None:
        return ""
    client = f", for {conversation.served_to}" if conversation.served_to else ""
    since = datetime.fromtimestamp(conversation.served_at)
    return f"Through the API{client}, since {since:%Y-%m-%d %H:%M}"
