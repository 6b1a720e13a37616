"""A runtime as the slot engine's parts see it: a slot (one conversation's sequence), a reply's
sampler (`Draw`) and `SlotRuntime`, the `SlotEngine` methods speculation (`speculate.py`) and
the draft model (`draft_model.py`) call. slots.py builds on them, so they are written here:
the generate loop imports its decoder and drafters, and they never import it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from app.engine.logprobs import Scores
from app.engine.protocol import CancelToken, LoadOptions, ModelInfo


@dataclass(kw_only=True)
class Slot:
    """One conversation's sequence: the exact tokens its KV holds (runtimes add the handle)."""

    tokens: list[int] = field(default_factory=list)
    saved: list[int] = field(default_factory=list)  # the tokens of its last snapshot


S = TypeVar("S", bound=Slot)


class Draw(Protocol[S]):
    """One reply's token source on a runtime: its sampler state, and any evaluation it runs
    ahead of the loop (MLX overlaps the next token's forward with handing this one out)."""

    def next(self, slot: S, last: bool) -> int:
        """Sample a token from the logits after `slot.tokens`. Unless `last`, it may evaluate
        the token at once and append it to `slot.tokens`."""
        ...

    def take_back(self, slot: S) -> None:
        """The token `next` drew is not kept (end of turn): undo what it evaluated."""
        ...

    def scores(self) -> Scores:
        """The last drawn token's logprob and top alternatives, when the sampling asked."""
        ...

    def close(self) -> None: ...


class SlotRuntime(Protocol[S]):
    """A `SlotEngine` (slots.py) as speculation and the draft model drive it: the runtime's
    hooks and the slot methods over them (private: only the engine's own parts call them)."""

    _n_ctx: int  # one conversation's window
    _eog: frozenset[int]  # the end-of-turn tokens
    _verify_exact: bool  # `_verify`'s rows and K/V are one-token decoding's

    def load(self, options: LoadOptions) -> ModelInfo: ...

    def unload(self) -> None: ...

    def _slot(self, name: str) -> S: ...

    def _sync(
        self, slot: S, tokens: Sequence[int], cancel: CancelToken | None
    ) -> tuple[int, int, int]: ...

    def _clear(self, slot: S, keep: int = 0) -> int: ...

    def _forward(self, slot: S, chunk: list[int], *, want_logits: bool) -> None: ...

    def _verify(self, slot: S, chunk: list[int]) -> np.ndarray: ...

    def _logits(self, slot: S) -> np.ndarray: ...
