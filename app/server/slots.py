"""Which engine slot (KV sequence) serves which client conversation.

API clients name no conversation, so the request's prompt tokens decide: a request goes to
the slot whose tokens it extends (the next turn) or which extends it (a retry, a regenerate,
the real request after a `max_tokens: 0` prewarm), the longest such. Anything else is a new
conversation and gets a new slot name. A slot is never taken over by a conversation that
merely shares its beginning (a common system prompt): that would trim the other agent's KV.
The engine still copies such a shared prefix from a resident sequence, or restores it from a
snapshot, so a new conversation prefills only what is new. The engine keeps the slots
resident up to its limit and snapshots the least recently used ones, so a conversation that
comes back after others restores instead of prefilling.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

MAX_SLOTS = 256  # names remembered; a forgotten one only loses its name, not its snapshot


@dataclass
class _Slot:
    tokens: tuple[int, ...] = ()
    busy: bool = False


class SlotMap:
    """Slot names for the server's requests, chosen by prefix. Used from one event loop."""

    def __init__(self, prefix: str = "api", max_slots: int = MAX_SLOTS) -> None:
        self._prefix = prefix
        self._max_slots = max_slots
        self._slots: OrderedDict[str, _Slot] = OrderedDict()  # least recently used first
        self._names = itertools.count()

    def __len__(self) -> int:
        return len(self._slots)

    def acquire(self, prompt: Sequence[int]) -> str:
        """The slot for a request with these prompt tokens; it is busy until released."""
        query = tuple(prompt)
        best, best_len = None, -1
        for name, slot in self._slots.items():
            if slot.busy or not slot.tokens:
                continue
            n = len(slot.tokens)
            related = query[:n] == slot.tokens or slot.tokens[: len(query)] == query
            if related and n > best_len:
                best, best_len = name, n
        if best is None:
            best = f"{self._prefix}-{next(self._names)}"
            self._slots[best] = _Slot()
            while len(self._slots) > self._max_slots:
                self._slots.popitem(last=False)
        slot = self._slots[best]
        slot.busy = True
        self._slots.move_to_end(best)
        return best

    def release(self, name: str, tokens: Sequence[int]) -> None:
        """The request is over; the slot now holds `tokens` (prompt + reply ids)."""
        slot = self._slots.get(name)
        if slot is not None:
            slot.busy = False
            slot.tokens = tuple(tokens)

    def names(self) -> list[str]:
        return list(self._slots)

    def busy(self, name: str) -> bool:
        slot = self._slots.get(name)
        return slot.busy if slot else False

    def tokens(self, name: str) -> tuple[int, ...]:
        slot = self._slots.get(name)
        return slot.tokens if slot else ()
