"""Drafters: cheap guesses of the next tokens of a reply, for the target to verify in one batch
(`speculate.py`). A drafter proposes up to k tokens that follow a conversation's tokens; it is
told the slot's name so that one with state of its own (a draft model's KV sequence, a
model's MTP head) keeps it per conversation.

Prompt lookup needs no second model: agents and code edits repeat what they were given, so
the tokens that followed the latest earlier occurrence of the conversation's last few tokens
are a good guess (the "n-gram" or prompt lookup decoding of llama.cpp and vLLM). The longest
matching suffix wins, so a line that recurs in the code is told apart by what came before it.
An edit that renames as it copies breaks every n-gram at the new name, so a last token that
the copy does not have is read as a substitution and the copy resumes after the old one.
How long the match behind a guess is says how far to trust it: in a copy the last dozen
tokens or more recur and the next ones do too, while two or three recurring tokens in prose
(a name, "the JSON file") are a weak bet. So each proposal comes with its `band`, and the
decoder keeps a drafter's odds per band (`speculate.py`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import numpy as np

SPECULATION_MODES = ("auto", "lookup", "draft", "mtp", "off")  # LoadOptions.speculation
MIN_NGRAM = 2  # a single repeated token says too little to bet a batch on
MAX_NGRAM = 24  # long enough to tell apart the copies of a line that recurs in code
SUBSTITUTION_LEAD = 4  # how much longer the match before the last token must be to skip it
KEPT_INDEXES = 8  # conversations whose token buffer is kept between requests
BANDS = (4, 12)  # match lengths from which a lookup's guess is a stronger bet (band 1, 2)


class Drafter(Protocol):
    """Proposes the next tokens after `history` (the slot's tokens and any drawn since)."""

    name: str  # "lookup", "draft": what the stats and the bench call it
    free: bool  # proposing runs no model, so it can be scored while speculation is off

    def propose(self, slot: str, history: Sequence[int], k: int) -> list[int]: ...

    def band(self) -> int:
        """Which of its records the last proposal's odds are kept in (0 for a drafter whose
        guesses are all one kind of bet)."""
        ...

    def close(self) -> None: ...


class _Tokens:
    """A conversation's tokens in a numpy buffer that grows as the reply does, so that each
    lookup scans them at numpy's speed instead of indexing every n-gram."""

    def __init__(self) -> None:
        self.buf = np.zeros(1024, dtype=np.int64)
        self.n = 0

    def holds_prefix_of(self, history: Sequence[int]) -> bool:
        return self.n <= len(history) and self.buf[: self.n].tolist() == list(history[: self.n])

    def extend(self, history: Sequence[int]) -> None:
        new = history[self.n :]
        if self.n + len(new) > self.buf.size:
            grown = np.zeros(max(self.buf.size * 2, self.n + len(new)), dtype=np.int64)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n : self.n + len(new)] = new
        self.n += len(new)

    def lookup(self, k: int) -> tuple[list[int], int]:
        """What followed the earlier occurrence that matches the longest suffix (at least
        MIN_NGRAM tokens; the latest of equals), and that match's length. When the suffix
        before the last token matches much further back, the last token is read as a
        substitution (an edit that renames as it copies) and the copy resumes one token past
        that match."""
        n = self.n
        exact, at = self._longest(n - 1)
        skipped, skip_at = self._longest(n - 2)
        if skipped >= exact + SUBSTITUTION_LEAD and skip_at + 2 < n:
            at, exact = skip_at + 1, skipped  # the source's token replaced by the last one
        elif exact < MIN_NGRAM:
            return [], 0
        return self.buf[at + 1 : min(at + 1 + k, n)].tolist(), exact

    def _longest(self, end: int) -> tuple[int, int]:
        """The longest match of the tokens up to `end` (inclusive) ending earlier, and where
        that match ends (the latest of equals); (0, -1) when none reaches MIN_NGRAM."""
        tokens = self.buf[: self.n]
        if end < MIN_NGRAM:
            return 0, -1
        starts = np.flatnonzero(tokens[:end] == tokens[end])  # candidate match ends
        length = np.ones(starts.size, dtype=np.int64)
        alive = np.ones(starts.size, dtype=bool)
        for back in range(1, min(MAX_NGRAM, end)):
            alive &= starts >= back
            alive[alive] = tokens[starts[alive] - back] == tokens[end - back]
            if not alive.any():
                break
            length += alive
        if not starts.size or length.max() < MIN_NGRAM:
            return 0, -1
        return int(length.max()), int(starts[np.flatnonzero(length == length.max())[-1]])


class PromptLookup:
    """Drafts from the conversation's own tokens: the longest recent n-gram match."""

    name = "lookup"
    free = True

    def __init__(self) -> None:
        self._tokens: OrderedDict[str, _Tokens] = OrderedDict()
        self._band = 0

    def propose(self, slot: str, history: Sequence[int], k: int) -> list[int]:
        held = self._tokens.get(slot)
        if held is None or not held.holds_prefix_of(history):
            held = _Tokens()  # another branch, or trimmed: start from this history
            self._tokens[slot] = held
            while len(self._tokens) > KEPT_INDEXES:
                self._tokens.popitem(last=False)
        self._tokens.move_to_end(slot)
        held.extend(history)
        drafts, matched = held.lookup(k)
        self._band = sum(matched >= edge for edge in BANDS)
        return drafts

    def band(self) -> int:
        """0, 1 or 2: the last guess's match was shorter than 4 tokens, shorter than 12, or
        longer (BANDS)."""
        return self._band

    def close(self) -> None:
        self._tokens.clear()
