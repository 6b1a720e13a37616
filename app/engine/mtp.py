"""The model's own multi-token-prediction (MTP) head as a drafter (DeepSeek V4's NextN block).

An MTP block predicts one token further than the model: its entry at position p reads the
token at p and the target's last hidden state at p - 1 (the state that predicted that token),
`eh_proj([enorm(embed(x_p)); hnorm(h_{p-1})])`, runs one transformer block whose attention
sees the block's own entries of the last `window` positions, and its logits guess x_{p+1}.
Its output state stands in for the target's when the guess is fed back, so one head drafts
k tokens in k small forwards (llama.cpp's `common_speculative_impl_draft_mtp`, one head).

The target's hidden states come from the runtime: while `SlotEngine._keep_hidden` is set,
each forward records the states of the last positions it evaluated in the slot's
`HiddenRows`. The head's entries are built lazily, at a proposal, for the positions the
target has evaluated since (only the last `window` matter: older entries are outside every
later entry's attention), so nothing runs while speculation is off. Entries built from the
head's own guesses are dropped after each proposal; the rest follow the target's tokens
by common prefix, as the draft model's KV does, so refused drafts never linger there.
Where the reply's next token is not drawn yet (the runtime evaluated the last one ahead, as
MLX does), the head's entry of the last evaluated token guesses it, two positions past the
target state it reads (the target's own logits then judge that guess before any batch).

A runtime supplies the head (`MtpHead`): llama.cpp's MTP context (`llamacpp/mtp.py`), the
MLX DeepSeek V4 block (`mlx/deepseek_v4/mtp.py`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from app.engine.kvstore import common_prefix

if TYPE_CHECKING:
    from app.engine.slots import SlotEngine

logger = logging.getLogger("stoke.engine.mtp")

HIDDEN_SPARE = 32  # rows kept beyond the head's window: a verify batch and its drafts


class HiddenRows:
    """The target's hidden state per position, the last `keep` of them (any array rows)."""

    def __init__(self, keep: int) -> None:
        self._rows: deque[Any] = deque(maxlen=keep)
        self.end = 0  # one past the last position held

    @property
    def first(self) -> int:
        return self.end - len(self._rows)

    def record(self, start: int, rows: Any, n: int) -> None:
        """The states of positions start..start + n - 1 (`rows[i]` is position start + i);
        what was held from `start` on is replaced, a gap starts the rows afresh."""
        if start > self.end or start < self.first:
            self._rows.clear()
        else:
            for _ in range(self.end - start):
                self._rows.pop()
        for i in range(max(0, n - (self._rows.maxlen or n)), n):
            self._rows.append(rows[i])
        self.end = start + n

    def cut(self, keep: int) -> None:
        """Forget the states of positions from `keep` on (the KV no longer holds them)."""
        while self._rows and self.end > keep:
            self._rows.pop()
            self.end -= 1
        self.end = min(self.end, keep)

    def get(self, start: int, end: int) -> list[Any] | None:
        if start < self.first or end > self.end:
            return None
        return [self._rows[p - self.first] for p in range(start, end)]


class MtpHead(Protocol):
    """A runtime's MTP block, one sequence of entries per key (a slot's name)."""

    window: int  # positions back the block's attention sees

    def cut(self, key: str, keep: int) -> None:
        """Drop the key's entries from position `keep` on (0: all of them)."""
        ...

    def step(
        self, key: str, start: int, tokens: Sequence[int], states: list[Any]
    ) -> tuple[np.ndarray, Any]:
        """Evaluate the entries (tokens[i], states[i]) at positions start + i after the key's
        entries (which end at `start`, or are none); returns the last entry's logits (float32)
        and its output state, the state to feed with the next guess."""
        ...

    def close(self) -> None: ...


@dataclass
class _Entries:
    """What one key's entries hold: the tokens at positions first..first + len - 1."""

    first: int = 0
    tokens: list[int] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.first + len(self.tokens)


class MtpDrafter:
    """Greedy guesses from the model's MTP head, fed with the target's hidden states."""

    name = "mtp"
    free = False

    def __init__(self, engine: SlotEngine[Any], head: MtpHead, n_keys: int) -> None:
        self._engine, self._head, self._n_keys = engine, head, max(n_keys, 1)
        self._entries: OrderedDict[str, _Entries] = OrderedDict()
        engine._keep_hidden = head.window + HIDDEN_SPARE

    def propose(self, slot: str, history: Sequence[int], k: int) -> list[int]:
        engine = self._engine
        held = engine._slots.get(slot)
        if held is None or held.hidden is None or len(history) + k >= engine._n_ctx:
            return []
        last = len(history) - 1  # the head's entry of the last token guesses the next
        entries = self._sync(slot, history, held.hidden, last)
        if entries is None:
            return []
        try:
            return self._draft(slot, entries, history, held.hidden, last, k)
        except RuntimeError as exc:  # the head failed (memory): decode plainly, say why once
            logger.warning("the MTP head could not draft: %s", exc)
            self._head.cut(slot, 0)
            entries.tokens.clear()
            return []

    def _draft(
        self,
        slot: str,
        entries: _Entries,
        history: Sequence[int],
        hidden: HiddenRows,
        last: int,
        k: int,
    ) -> list[int]:
        start = entries.end
        states = hidden.get(start - 1, last)
        logits, state = self._head.step(slot, start, history[start : last + 1], states)
        entries.tokens.extend(history[start : last + 1])
        drafts: list[int] = []
        while True:
            token = int(np.argmax(logits))
            drafts.append(token)
            if token in self._engine._eog or len(drafts) == k:
                break
            logits, state = self._head.step(slot, last + len(drafts), [token], [state])
        self._head.cut(slot, last + 1)  # the guesses' entries go
        return drafts

    def _sync(
        self, key: str, history: Sequence[int], hidden: HiddenRows, last: int
    ) -> _Entries | None:
        """The key's entries cut to what still matches `history` (the last one always, to
        read its logits again), and started afresh (within the head's window of `last`) when
        the states to extend them are gone. None when the target's states stop short."""
        entries = self._entries.get(key)
        if entries is None:
            entries = self._entries[key] = _Entries()
            while len(self._entries) > self._n_keys:
                gone, _ = self._entries.popitem(last=False)
                self._head.cut(gone, 0)
        self._entries.move_to_end(key)
        first = entries.first
        common = min(first + common_prefix(entries.tokens, history[first:last]), last)
        if common < entries.end:
            self._head.cut(key, common)
            del entries.tokens[max(common - first, 0) :]
        lowest = max(hidden.first + 1, last - self._head.window)
        if entries.end < lowest or not entries.tokens:
            self._head.cut(key, 0)
            entries.first, entries.tokens = max(lowest, 1), []
        if entries.end > last or hidden.get(entries.end - 1, last) is None:
            return None
        return entries

    def band(self) -> int:
        return 0

    def close(self) -> None:
        self._engine._keep_hidden = 0
        self._entries.clear()
        self._head.close()
