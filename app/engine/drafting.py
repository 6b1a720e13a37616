"""Drafters: cheap guesses of the next tokens of a reply, for the target to verify in one batch
(`speculate.py`). A drafter proposes up to k tokens that follow a conversation's tokens; it is
told the slot's name so that one with state of its own (a draft model's KV sequence, a
model's MTP head) keeps it per conversation.

Prompt lookup needs no second model: agents and code edits repeat what they were given, so
the tokens that followed the latest earlier occurrence of the conversation's last few tokens
are a good guess (the "n-gram" or prompt lookup decoding of llama.cpp and vLLM).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

SPECULATION_MODES = ("auto", "lookup", "draft", "mtp", "off")  # LoadOptions.speculation
MIN_NGRAM = 2  # a single repeated token says too little to bet a batch on
MAX_NGRAM = 5
KEPT_INDEXES = 8  # conversations whose n-gram index is kept between requests


class Drafter(Protocol):
    """Proposes the next tokens after `history` (the slot's tokens and any drawn since)."""

    name: str  # "lookup", "draft": what the stats and the bench call it
    free: bool  # proposing runs no model, so it can be scored while speculation is off

    def propose(self, slot: str, history: Sequence[int], k: int) -> list[int]: ...

    def close(self) -> None: ...


class _Index:
    """Every n-gram of a token list (MIN_NGRAM..MAX_NGRAM long) mapped to the position of the
    token that followed its latest occurrence, extended as the list grows."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.after: list[dict[tuple[int, ...], int]] = [{} for _ in range(MAX_NGRAM + 1)]

    def extend(self, history: Sequence[int]) -> None:
        start = len(self.tokens)
        self.tokens.extend(history[start:])
        tokens = self.tokens
        for end in range(max(start, 1), len(tokens)):  # n-grams ending before `end`
            for n in range(MIN_NGRAM, min(MAX_NGRAM, end) + 1):
                self.after[n][tuple(tokens[end - n : end])] = end

    def lookup(self, k: int) -> list[int]:
        tokens = self.tokens
        for n in range(min(MAX_NGRAM, len(tokens)), MIN_NGRAM - 1, -1):
            at = self.after[n].get(tuple(tokens[-n:]))
            if at is not None:
                return tokens[at : at + k]
        return []


class PromptLookup:
    """Drafts from the conversation's own tokens: the longest recent n-gram match."""

    name = "lookup"
    free = True

    def __init__(self) -> None:
        self._indexes: OrderedDict[str, _Index] = OrderedDict()

    def propose(self, slot: str, history: Sequence[int], k: int) -> list[int]:
        index = self._indexes.get(slot)
        held = len(index.tokens) if index is not None else 0
        if index is None or held > len(history) or history[:held] != index.tokens:
            index = _Index()  # another branch, or trimmed: index this history afresh
            self._indexes[slot] = index
            while len(self._indexes) > KEPT_INDEXES:
                self._indexes.popitem(last=False)
        self._indexes.move_to_end(slot)
        index.extend(history)
        return index.lookup(k)

    def close(self) -> None:
        self._indexes.clear()
