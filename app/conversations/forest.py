"""Recovered rows made into conversations Stoke can show and continue.

Salvage (repair.py) brings back what it can read of a damaged database, and what it could
not read leaves holes. `mend` closes them, in the fresh database, so that afterwards:

- every message's conversation exists: one titled "Recovered conversation" stands in for a
  conversation whose own row was lost;
- every message descends from a root of its own conversation. A message whose parent was
  lost (or whose parents, read from damaged pages, go round in a circle) is attached under
  the latest earlier message of its conversation: in a conversation that went straight on,
  that is where the lost part was, so the conversation stays one piece with a gap rather
  than breaking in two. Where the roles would not take turns there, a stand-in takes the
  lost message's place: a user message that says a message was lost, or an empty
  interrupted reply (as the store leaves for a reply that never began), so every prompt
  template still sees user and assistant alternate;
- every conversation's current leaf is one of its messages (its newest when it was lost);
- a reply keeps its token ids only when they can be its tokens: whole uint32s, each below
  2**24 (above any vocabulary; text or random bytes read as uint32 are far larger), and
  some where it has text. Otherwise they go, with their fingerprint, so the next turn
  tokenizes the reply's text again instead of feeding the model ids that are not its own.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from typing import NamedTuple

from app.conversations import rows

LOST_MESSAGE = "(A message here was lost when the conversation database was damaged.)"
_TOKEN_LIMIT = 1 << 24
# What may come before each role: a root's parent is None.
_FOLLOWS: dict[str, tuple[str | None, ...]] = {
    "user": (None, "assistant", "tool"),
    "assistant": ("user", "tool"),
    "tool": ("assistant", "tool"),
}


class _Row(NamedTuple):
    seq: int
    id: str
    conversation_id: str
    parent_id: str | None
    role: str
    created_at: object  # a float, unless damage read through SQL made it something else


def mend(conn: sqlite3.Connection) -> int:
    """Close the holes salvage left in `conn` (inside its open transaction); returns how
    many stand-ins for lost messages were added."""
    conn.execute(
        "INSERT INTO conversations (id, title, created_at, updated_at)"
        " SELECT conversation_id, 'Recovered conversation', min(created_at), max(updated_at)"
        " FROM messages WHERE conversation_id NOT IN (SELECT id FROM conversations)"
        " GROUP BY conversation_id"
    )
    stand_ins = _reattach(conn)
    conn.execute(
        "UPDATE conversations SET current_leaf_id = (SELECT m.id FROM messages m"
        " WHERE m.conversation_id = conversations.id ORDER BY m.created_at DESC, m.seq DESC"
        " LIMIT 1) WHERE current_leaf_id IS NULL OR current_leaf_id NOT IN"
        " (SELECT m.id FROM messages m WHERE m.conversation_id = conversations.id)"
    )
    _drop_foreign_tokens(conn)
    return stand_ins


def _reattach(conn: sqlite3.Connection) -> int:
    """Attach every message that no root of its conversation reaches; the stand-ins added.

    Messages are visited oldest first (by seq, which only grows), so when one is visited
    every earlier message of its conversation is already reached: the first unreached one
    heads a branch whose parent was lost (or sits on a circle), and attaching it reaches
    its whole branch."""
    found = [
        _Row(*row)
        for row in conn.execute(
            "SELECT seq, id, conversation_id, parent_id, role, created_at FROM messages"
            " ORDER BY seq"
        )
    ]
    by_id = {row.id: row for row in found}
    children: dict[str, list[str]] = defaultdict(list)
    for row in found:
        parent = by_id.get(row.parent_id) if row.parent_id is not None else None
        if parent is not None and parent.conversation_id == row.conversation_id:
            children[row.parent_id].append(row.id)
    reached: set[str] = set()
    for row in found:
        if row.parent_id is None:
            _reach(row.id, children, reached)
    latest: dict[str, _Row] = {}
    stand_ins = 0
    for row in found:
        if row.id not in reached:
            before = latest.get(row.conversation_id)
            parent, added = _parent_for(conn, row, row.role, before)
            stand_ins += added
            conn.execute("UPDATE messages SET parent_id = ? WHERE seq = ?", (parent, row.seq))
            _reach(row.id, children, reached)
        latest[row.conversation_id] = row
    return stand_ins


def _reach(start: str, children: dict[str, list[str]], reached: set[str]) -> None:
    pending = [start]
    while pending:
        message = pending.pop()
        if message not in reached:
            reached.add(message)
            pending += children.get(message, ())


def _parent_for(
    conn: sqlite3.Connection, row: _Row, role: str, before: _Row | None
) -> tuple[str | None, int]:
    """The parent a message of `role` gets under `before` (None: a root), with the
    stand-ins put between them for roles to take turns; and how many were added."""
    if (before.role if before is not None else None) in _FOLLOWS[role]:
        return (before.id if before is not None else None), 0
    lost = "user" if role == "assistant" else "assistant"
    parent, added = _parent_for(conn, row, lost, before)
    stand_in = rows.new_message(
        row.conversation_id,
        parent,
        lost,
        LOST_MESSAGE if lost == "user" else "",
        _time(row.created_at) - 0.001,  # older than the message it stands before
        status="complete" if lost == "user" else "interrupted",
        finish_reason=None if lost == "user" else "lost",
    )
    conn.execute(
        f"INSERT INTO messages ({', '.join(rows.MESSAGE_FIELDS)}) "
        f"VALUES ({', '.join('?' * len(rows.MESSAGE_FIELDS))})",
        rows.message_row(stand_in),
    )
    return stand_in.id, added + 1


def _drop_foreign_tokens(conn: sqlite3.Connection) -> None:
    """Forget token ids that cannot be the reply's own (see the module's promises)."""
    foreign = [
        seq
        for seq, blob, content in conn.execute(
            "SELECT seq, token_ids, content FROM messages WHERE token_ids IS NOT NULL"
        )
        if not _plausible(blob, content)
    ]
    conn.executemany(
        "UPDATE messages SET token_ids = NULL, tokens_fingerprint = NULL WHERE seq = ?",
        [(seq,) for seq in foreign],
    )


def _plausible(blob: object, content: object) -> bool:
    if not isinstance(blob, bytes) or len(blob) % 4:
        return False
    ids = rows.unpack(blob) or []
    if not ids:
        return not content
    return max(ids) < _TOKEN_LIMIT


def _time(value: object) -> float:
    """A timestamp as stored; 0 for one damage made into something else."""
    return float(value) if isinstance(value, int | float) else 0.0
