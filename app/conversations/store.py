"""The conversation store: conversations, their message trees and search, in one SQLite file.

Storage only: it knows nothing of engines or Qt. Every method commits before it returns, so
what the user typed or the model said is on disk as soon as the call is done.

Several processes may open one database at once (the window, `stoke chat`, scripts): each
store holds a lease (leases.py), a streaming reply and a turn in progress name the lease of
their writer, and only what a gone writer left is ever marked interrupted or taken over.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any, get_args

from app import paths
from app.conversations import database, leases, rows
from app.conversations.errors import (
    CorruptDatabaseError,
    UnknownConversationError,
    UnknownMessageError,
)
from app.conversations.models import Conversation, Message, Role, SearchHit, Status, ToolCall

ROLES: tuple[str, ...] = get_args(Role)
STATUSES: tuple[str, ...] = get_args(Status)
TITLE_LENGTH = 60

_ID_PREFIX = re.compile(r"[0-9a-f]{4,32}")


class ConversationStore:
    """One open conversation database. Use `ConversationStore.open`, ideally in a `with`.

    `recovered_from` names the backup when open found the database damaged and moved it
    aside; `notices` holds what the user should be told about that (what was recovered, a
    damaged log kept aside), as sentences to show as they are.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        recovered_from: Path | None,
        lease: leases.Lease | None,
        notices: list[str],
    ) -> None:
        self._conn = conn
        self.path = path
        self.recovered_from = recovered_from
        self.notices = notices
        self._lease = lease
        self._leases = leases.folder_of(path)

    @classmethod
    def open(cls, path: Path | None = None, *, busy_timeout: float = 3.0) -> ConversationStore:
        """Open (creating or migrating) the database; replies cut off by a writer that is gone
        become 'interrupted'. An index that lost rows is rebuilt; a damaged file is moved
        aside, never deleted, and what can still be read of it is copied into a fresh one."""
        path = Path(path) if path is not None else paths.database_path()
        database.make_folder(path)
        lease = leases.Lease.take(path)
        notices: list[str] = []
        recovered_from = None
        try:
            if not leases.others_alive(leases.folder_of(path), lease):  # nobody read the log yet
                wal_copy = database.keep_damaged_wal(path)
                if wal_copy is not None:
                    notices.append(
                        "Part of the conversation database's log was damaged, so the last "
                        f"changes may be missing; a copy of the log was kept at {wal_copy}."
                    )
            try:
                conn = database.connect(path, busy_timeout, notices)
            except CorruptDatabaseError:
                recovered_from = database.move_aside(path)
                conn = database.connect(path, busy_timeout)
                notices.append(database.salvaged(path, recovered_from, conn))
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        store = cls(conn, path, recovered_from, lease, notices)
        try:
            store.recover_interrupted()
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def open_read_only(cls, path: Path | None = None) -> ConversationStore:
        """Open for reading only (`stoke chat --list` on a read-only folder): no lease, no
        migration, no repair, nothing marked interrupted; any write fails in words. A folder
        nobody can write is read as immutable (SQLite then needs no lock or shared-memory
        file beside the database)."""
        path = Path(path) if path is not None else paths.database_path()
        conn = database.connect_read_only(path)
        return cls(conn, path, None, None, [])

    def close(self) -> None:
        """Give back this store's turns and lease: what it left streaming is now a gone
        writer's, for the next opener to mark interrupted."""
        try:
            if self._lease is not None:
                with suppress(sqlite3.Error):
                    self._conn.execute(
                        "UPDATE conversations SET writer = NULL WHERE writer = ?", (self._lease.id,)
                    )
        finally:
            self._conn.close()
            if self._lease is not None:
                self._lease.release()
                self._lease = None

    def __enter__(self) -> ConversationStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # Conversations

    def create_conversation(
        self,
        title: str | None = None,
        system_prompt: str | None = None,
        sampling: dict | None = None,
        model: str | None = None,
    ) -> Conversation:
        """A new, empty conversation. Without a title, its first user message names it."""
        now = time.time()
        conversation = Conversation(
            id=uuid.uuid4().hex,
            title=title,
            created_at=now,
            updated_at=now,
            pinned=False,
            deleted_at=None,
            system_prompt=system_prompt,
            sampling=dict(sampling or {}),
            current_leaf_id=None,
            draft="",
            model=model,
        )
        self._execute(
            f"INSERT INTO conversations ({rows.CONVERSATION_COLUMNS}) "
            "VALUES (?, ?, ?, ?, 0, NULL, ?, ?, NULL, '', ?, NULL, NULL, NULL)",
            (
                conversation.id,
                title,
                now,
                now,
                system_prompt,
                json.dumps(conversation.sampling),
                model,
            ),
        )
        return conversation

    def get_conversation(self, conversation_id: str) -> Conversation:
        """By full id or, like git, by a unique prefix of at least 4 characters."""
        full_id = self._resolve(conversation_id)
        row = self._execute(
            f"SELECT {rows.CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", (full_id,)
        ).fetchone()
        return rows.conversation_of(row)

    def list_conversations(
        self, include_deleted: bool = False, limit: int | None = None
    ) -> list[Conversation]:
        """Pinned first, then most recently updated: the order of the sidebar."""
        where = "" if include_deleted else "WHERE deleted_at IS NULL"
        found = self._execute(
            f"SELECT {rows.CONVERSATION_COLUMNS} FROM conversations {where} "
            "ORDER BY pinned DESC, updated_at DESC LIMIT ?",
            (-1 if limit is None else limit,),
        ).fetchall()
        return [rows.conversation_of(row) for row in found]

    def most_recent_empty(self) -> Conversation | None:
        """The latest conversation with no message and no draft: where "New chat" goes, so
        untouched conversations do not pile up in the sidebar."""
        row = self._execute(
            f"SELECT {rows.CONVERSATION_COLUMNS} FROM conversations c WHERE deleted_at IS NULL "
            "AND draft = '' AND NOT EXISTS (SELECT 1 FROM messages m "
            "WHERE m.conversation_id = c.id) ORDER BY updated_at DESC LIMIT 1"
        ).fetchone()
        return None if row is None else rows.conversation_of(row)

    def most_recent(self) -> Conversation | None:
        """The conversation to reopen at start-up, pinned or not."""
        row = self._execute(
            f"SELECT {rows.CONVERSATION_COLUMNS} FROM conversations WHERE deleted_at IS NULL "
            "ORDER BY updated_at DESC LIMIT 1"
        ).fetchone()
        return None if row is None else rows.conversation_of(row)

    def rename(self, conversation_id: str, title: str) -> None:
        self._set(conversation_id, "title", title)

    def mark_imported(self, conversation_id: str) -> None:
        self._set(conversation_id, "imported_at", time.time())

    def mark_served(self, conversation_id: str, client: str | None) -> None:
        """An API conversation: served now by the server beside the window, to `client`."""
        with self._transaction():
            full_id = self._resolve(conversation_id)
            self._conn.execute(
                "UPDATE conversations SET served_at = ?, served_to = ? WHERE id = ?",
                (time.time(), client, full_id),
            )

    def served_roots(self, system_prompt: str | None, role: Role, content: str) -> list[Message]:
        """First messages of the API conversations (not deleted) with this system prompt
        that open with this message, the most recently updated conversation first: where a
        served turn may continue a branch (served.py)."""
        found = self._execute(
            f"SELECT {rows.MESSAGE_COLUMNS} FROM messages m"
            " JOIN conversations c ON c.id = m.conversation_id"
            " WHERE m.parent_id IS NULL AND c.served_at IS NOT NULL AND c.deleted_at IS NULL"
            " AND c.system_prompt IS ? AND m.role = ? AND m.content = ?"
            " ORDER BY c.updated_at DESC, m.seq DESC",
            (system_prompt, role, content),
        ).fetchall()
        return [rows.message_of(row) for row in found]

    def set_pinned(self, conversation_id: str, pinned: bool) -> None:
        self._set(conversation_id, "pinned", int(pinned))

    def delete(self, conversation_id: str) -> None:
        """Soft delete: hidden from lists and search until `restore` (the UI's undo)."""
        self._set(conversation_id, "deleted_at", time.time())

    def restore(self, conversation_id: str) -> None:
        self._set(conversation_id, "deleted_at", None)

    def purge(self, conversation_id: str) -> None:
        """Delete for good, with all its messages."""
        full_id = self._resolve(conversation_id)
        self._execute("DELETE FROM conversations WHERE id = ?", (full_id,))

    def set_system_prompt(self, conversation_id: str, system_prompt: str | None) -> None:
        self._set(conversation_id, "system_prompt", system_prompt)

    def set_sampling(self, conversation_id: str, sampling: dict) -> None:
        """Replace the whole sampling dict; the store does not interpret it."""
        self._set(conversation_id, "sampling", json.dumps(sampling))

    def set_draft(self, conversation_id: str, draft: str) -> None:
        """The unsent input, so text typed before a crash or a switch is not lost."""
        self._set(conversation_id, "draft", draft)

    def get_draft(self, conversation_id: str) -> str:
        return self.get_conversation(conversation_id).draft

    def set_model(self, conversation_id: str, model: str | None) -> None:
        self._set(conversation_id, "model", model)

    # Messages

    def add_message(
        self,
        conversation_id: str,
        parent_id: str | None,
        role: Role,
        content: str,
        *,
        token_ids: list[int] | None = None,
        tokens_fingerprint: str | None = None,
        status: Status = "complete",
        finish_reason: str | None = None,
        stats: dict | None = None,
        attachments: list[dict] | None = None,
        tool_calls: Sequence[ToolCall] = (),
        tool_call_id: str | None = None,
        tool_name: str | None = None,
    ) -> Message:
        """Append a message under `parent_id` (None: a root) and make it the current leaf.

        A second child of the same parent is an edit (user) or a regeneration (assistant).
        Tool calls belong to assistant messages; a tool message is one call's result, named
        by the call's id and the function's name.
        """
        _check(role, ROLES, "role")
        _check(status, STATUSES, "status")
        if tool_calls and role != "assistant":
            raise ValueError("only an assistant message makes tool calls")
        if (tool_call_id is not None or tool_name is not None) and role != "tool":
            raise ValueError("only a tool message answers a tool call")
        now = time.time()
        with self._transaction():
            full_id = self._resolve(conversation_id)
            if parent_id is not None:
                self._check_in_conversation(parent_id, full_id)
            message = rows.new_message(
                full_id,
                parent_id,
                role,
                content,
                now,
                token_ids=None if token_ids is None else list(token_ids),
                tokens_fingerprint=tokens_fingerprint,
                status=status,
                finish_reason=finish_reason,
                stats=stats,
                attachments=attachments or None,
                tool_calls=tuple(tool_calls),
                tool_call_id=tool_call_id,
                tool_name=tool_name,
            )
            self._insert(message)
        return message

    def append_user_message(
        self, conversation_id: str, content: str, attachments: list[dict] | None = None
    ) -> Message:
        """The user's message after the conversation's current leaf, read and moved in one
        transaction, so no other writer can slip a message in between. The same text already
        waiting unanswered at the leaf (a turn that never started) is returned instead of a
        twin; other text after an unanswered message follows an empty interrupted reply."""
        now = time.time()
        with self._transaction():
            full_id = self._resolve(conversation_id)
            leaf_id = self._conn.execute(
                "SELECT current_leaf_id FROM conversations WHERE id = ?", (full_id,)
            ).fetchone()[0]
            if leaf_id is not None:
                leaf = rows.message_of(
                    self._conn.execute(
                        f"SELECT {rows.MESSAGE_COLUMNS} FROM messages m WHERE m.id = ?", (leaf_id,)
                    ).fetchone()
                )
                same = leaf.content == content and leaf.attachments == (attachments or None)
                if leaf.role == "user" and same:
                    return leaf
                if leaf.role == "user":
                    leaf_id = self._insert_no_reply(leaf, now)
            message = rows.new_message(
                full_id, leaf_id, "user", content, now, attachments=attachments or None
            )
            self._insert(message)
        return message

    def _insert_no_reply(self, user: Message, now: float) -> str:
        """An empty interrupted reply under a user message that never got one (the app died
        before its reply began, or the context was full), so the tree keeps alternating, the
        next prompt says no answer came, and Continue can still answer it. Its id."""
        gap = rows.new_message(
            user.conversation_id,
            user.id,
            "assistant",
            "",
            now,
            status="interrupted",
            finish_reason="no reply",
        )
        self._insert(gap)
        return gap.id

    def _insert(self, message: Message) -> None:
        """Add `message` and make it its conversation's current leaf (inside a transaction)."""
        title = self._auto_title(message.conversation_id, message)
        writer = self._lease.id if self._lease and message.status == "streaming" else None
        self._conn.execute(
            f"INSERT INTO messages ({', '.join(rows.MESSAGE_FIELDS)}, writer) "
            f"VALUES ({', '.join('?' * (len(rows.MESSAGE_FIELDS) + 1))})",
            (*rows.message_row(message), writer),
        )
        self._conn.execute(
            "UPDATE conversations SET current_leaf_id = ?, updated_at = ?, "
            "title = coalesce(?, title) WHERE id = ?",
            (message.id, message.updated_at, title, message.conversation_id),
        )

    def update_message(
        self,
        message_id: str,
        *,
        content: str | None = None,
        token_ids: list[int] | None = None,
        tokens_fingerprint: str | None = None,
        status: Status | None = None,
        finish_reason: str | None = None,
        stats: dict | None = None,
        tool_calls: Sequence[ToolCall] | None = None,
    ) -> None:
        """Overwrite the given fields: one UPDATE, cheap enough to call every ~100 ms while a
        reply streams (streaming replies are not search-indexed until they stop). A reply's
        `tool_calls` are written with its last words, so the two are never apart on disk."""
        if status is not None:
            _check(status, STATUSES, "status")
        changes: dict[str, Any] = {
            "content": content,
            "token_ids": None if token_ids is None else rows.pack(token_ids),
            "tokens_fingerprint": tokens_fingerprint,
            "status": status,
            "finish_reason": finish_reason,
            "stats": rows.dumps(stats),
            "tool_calls": None if tool_calls is None else rows.pack_calls(tool_calls),
        }
        changes = {name: value for name, value in changes.items() if value is not None}
        if status == "streaming" and self._lease is not None:
            changes["writer"] = self._lease.id
        changes["updated_at"] = time.time()
        assignments = ", ".join(f"{name} = ?" for name in changes)
        cursor = self._execute(
            f"UPDATE messages SET {assignments} WHERE id = ?", (*changes.values(), message_id)
        )
        if cursor.rowcount == 0:
            raise UnknownMessageError(message_id)

    def get_message(self, message_id: str) -> Message:
        row = self._execute(
            f"SELECT {rows.MESSAGE_COLUMNS} FROM messages m WHERE m.id = ?", (message_id,)
        ).fetchone()
        if row is None:
            raise UnknownMessageError(message_id)
        return rows.message_of(row)

    def path_to(self, message_id: str) -> list[Message]:
        """Root..message: the branch the model sees as the conversation."""
        found = self._execute(
            "WITH RECURSIVE up(id, depth) AS ("
            " SELECT ?, 0"
            " UNION ALL"
            " SELECT m.parent_id, up.depth + 1 FROM messages m JOIN up ON m.id = up.id"
            " WHERE m.parent_id IS NOT NULL"
            f") SELECT {rows.MESSAGE_COLUMNS} FROM up JOIN messages m ON m.id = up.id"
            " ORDER BY up.depth DESC",
            (message_id,),
        ).fetchall()
        if not found:
            raise UnknownMessageError(message_id)
        return [rows.message_of(row) for row in found]

    def current_path(self, conversation_id: str) -> list[Message]:
        leaf = self.get_conversation(conversation_id).current_leaf_id
        return [] if leaf is None else self.path_to(leaf)

    def children(self, message_id: str | None, conversation_id: str) -> list[Message]:
        """Replies to `message_id` (None: the roots), oldest first."""
        full_id = self._resolve(conversation_id)
        found = self._execute(
            f"SELECT {rows.MESSAGE_COLUMNS} FROM messages m "
            "WHERE m.conversation_id = ? AND m.parent_id IS ? ORDER BY m.created_at, m.seq",
            (full_id, message_id),
        ).fetchall()
        return [rows.message_of(row) for row in found]

    def siblings(self, message_id: str) -> tuple[list[Message], int]:
        """The message's alternatives (itself included) and its index, for "< 2/3 >"."""
        message = self.get_message(message_id)
        alternatives = self.children(message.parent_id, message.conversation_id)
        return alternatives, [m.id for m in alternatives].index(message_id)

    def set_current_leaf(self, conversation_id: str, message_id: str) -> None:
        """Switch the branch shown; `message_id` must belong to the conversation."""
        with self._transaction():
            full_id = self._resolve(conversation_id)
            self._check_in_conversation(message_id, full_id)
            self._conn.execute(
                "UPDATE conversations SET current_leaf_id = ? WHERE id = ?", (message_id, full_id)
            )

    def leaf_of(self, message_id: str) -> Message:
        """The newest message in the subtree under `message_id` (itself if it has no replies),
        so switching to a sibling branch lands where that branch was last continued."""
        message = self.get_message(message_id)
        row = self._execute(
            "WITH RECURSIVE down(id) AS ("
            " SELECT ?"
            " UNION ALL"
            " SELECT m.id FROM messages m JOIN down"
            " ON m.conversation_id = ? AND m.parent_id = down.id"
            f") SELECT {rows.MESSAGE_COLUMNS} FROM down JOIN messages m ON m.id = down.id"
            " ORDER BY m.created_at DESC, m.seq DESC LIMIT 1",
            (message_id, message.conversation_id),
        ).fetchone()
        return rows.message_of(row)

    def recover_interrupted(self) -> int:
        """Mark replies left 'streaming' by a process that is gone as 'interrupted' (their text
        and token ids so far are kept); a reply another live process is writing is left alone.
        Returns how many there were."""
        writers = [
            row[0]
            for row in self._execute(
                "SELECT DISTINCT writer FROM messages WHERE status = 'streaming'"
            ).fetchall()
        ]
        gone = [w for w in writers if w is None or not self._alive(w)]
        if not gone:
            return 0
        cursor = self._execute(
            "UPDATE messages SET status = 'interrupted', finish_reason = 'interrupted', "
            "updated_at = ? WHERE status = 'streaming' AND (writer IS NULL OR writer IN "
            f"({', '.join('?' * len(gone))}))",
            (time.time(), *gone),
        )
        return cursor.rowcount

    # Turns: one writer per conversation at a time

    def claim_turn(self, conversation_id: str) -> int | None:
        """Take the conversation for one turn (its user message through its reply). Returns
        None when taken, else the pid of the live process whose turn holds it (0 if unknown);
        a turn whose process is gone is taken over, its streaming reply marked interrupted."""
        with self._transaction():
            full_id = self._resolve(conversation_id)
            holder = self._conn.execute(
                "SELECT writer FROM conversations WHERE id = ?", (full_id,)
            ).fetchone()[0]
            mine = self._lease.id if self._lease else None
            if holder is not None and holder != mine and self._alive(holder):
                return leases.pid_of(holder) or 0
            self._conn.execute("UPDATE conversations SET writer = ? WHERE id = ?", (mine, full_id))
        if holder is not None and holder != mine:
            self.recover_interrupted()
        return None

    def release_turn(self, conversation_id: str) -> None:
        """End this store's turn on the conversation, if it holds one."""
        if self._lease is None:
            return
        full_id = self._resolve(conversation_id)
        self._execute(
            "UPDATE conversations SET writer = NULL WHERE id = ? AND writer = ?",
            (full_id, self._lease.id),
        )

    def _alive(self, lease_id: str) -> bool:
        return (self._lease is not None and lease_id == self._lease.id) or leases.is_alive(
            self._leases, lease_id
        )

    # Search

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Titles, then messages, best match first. Any text is a valid query: each word is
        quoted (no FTS syntax), and the last one matches as a prefix (search as you type)."""
        match = _match_expression(query)
        if match is None:
            return []
        titles = self._execute(
            "SELECT c.id, c.title, highlight(titles_fts, 0, '«', '»') FROM titles_fts"
            " JOIN conversations c ON c.id = titles_fts.conversation_id"
            " WHERE titles_fts MATCH ? AND c.deleted_at IS NULL"
            " ORDER BY bm25(titles_fts) LIMIT ?",
            (match, limit),
        ).fetchall()
        messages = self._execute(
            "SELECT m.conversation_id, m.id, c.title,"
            " snippet(messages_fts, 0, '«', '»', '…', 16) FROM messages_fts"
            " JOIN messages m ON m.seq = messages_fts.rowid"
            " JOIN conversations c ON c.id = m.conversation_id"
            " WHERE messages_fts MATCH ? AND c.deleted_at IS NULL"
            " ORDER BY bm25(messages_fts) LIMIT ?",
            (match, limit - len(titles)),
        ).fetchall()
        return [SearchHit(cid, None, title, snippet) for cid, title, snippet in titles] + [
            SearchHit(cid, mid, title, snippet) for cid, mid, title, snippet in messages
        ]

    # Internals

    def _execute(self, sql: str, parameters: tuple = ()) -> sqlite3.Cursor:
        with database.translated(self.path):
            return self._conn.execute(sql, parameters)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """Several statements as one write; the write lock is taken up front (IMMEDIATE) so a
        busy database fails at BEGIN, not halfway."""
        with database.translated(self.path):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _resolve(self, conversation_id: str) -> str:
        row = self._execute(
            "SELECT id FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is not None:
            return row[0]
        matches = []
        if _ID_PREFIX.fullmatch(conversation_id.lower()):
            matches = self._execute(
                "SELECT id FROM conversations WHERE id GLOB ? LIMIT 2",
                (conversation_id.lower() + "*",),
            ).fetchall()
            if len(matches) == 1:
                return matches[0][0]
        raise UnknownConversationError(conversation_id, ambiguous=len(matches) > 1)

    def _set(self, conversation_id: str, column: str, value: object) -> None:
        with self._transaction():
            full_id = self._resolve(conversation_id)
            self._conn.execute(
                f"UPDATE conversations SET {column} = ? WHERE id = ?", (value, full_id)
            )

    def _check_in_conversation(self, message_id: str, conversation_id: str) -> None:
        row = self._conn.execute(
            "SELECT 1 FROM messages WHERE id = ? AND conversation_id = ?",
            (message_id, conversation_id),
        ).fetchone()
        if row is None:
            raise UnknownMessageError(message_id, conversation_id)

    def _auto_title(self, conversation_id: str, message: Message) -> str | None:
        """The title the conversation gets from its first user message, or None to keep it."""
        if message.role != "user":
            return None
        row = self._conn.execute(
            "SELECT title IS NULL AND NOT EXISTS ("
            " SELECT 1 FROM messages WHERE conversation_id = ? AND role = 'user')"
            " FROM conversations WHERE id = ?",
            (conversation_id, conversation_id),
        ).fetchone()
        return _title_from(message.content) if row[0] else None


def _check(value: str, allowed: tuple[str, ...], name: str) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, not {value!r}")


def _title_from(content: str) -> str | None:
    line = next((line.strip() for line in content.splitlines() if line.strip()), "")
    if len(line) > TITLE_LENGTH:
        line = line[: TITLE_LENGTH - 1].rstrip() + "…"
    return line or None


def _match_expression(query: str) -> str | None:
    """An FTS5 MATCH expression from free text, or None if it has no searchable word."""
    terms = [term for term in query.replace("\x00", " ").split() if any(c.isalnum() for c in term)]
    if not terms:
        return None
    return " ".join('"' + term.replace('"', '""') + '"' for term in terms) + "*"
