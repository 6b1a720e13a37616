"""The draft model: a smaller model with the target's tokenizer guesses the next k tokens
greedily, for the target to verify in one batch (`speculate.py`).

It runs on the same runtime as the target, as a second `SlotEngine` in the engine process
(snapshots off), and keeps one KV sequence per conversation under the target slot's name,
under the same exact-transcript rules: before each proposal its sequence is synced to the
target's tokens by longest common prefix (`SlotEngine._sync`), which cuts its own refused
guesses and evaluates only what the target kept since. It takes no snapshots of its own:
after the target restores a conversation, or the draft's sequence was evicted, the draft
re-syncs by prefix (a prefill of the conversation on the small model, once).

`drafters_for` turns the load options into the list of drafters a reply tries in order. A
draft model that cannot load, or does not share the target's tokenizer, is left out with a
line in the engine log (Settings' draft model applies to whichever model loads; the reply's
stats then show nothing drafted by it), never failing the target's load.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from app.engine.drafting import SPECULATION_MODES, Drafter, PromptLookup
from app.engine.model_file import tokenizer_fingerprint
from app.engine.protocol import EngineError, LoadOptions, ModelInfo, ModelLoadError
from app.engine.runtime import SlotRuntime

logger = logging.getLogger("stoke.engine.draft")


class DraftModel:
    """Greedy guesses from a small model's own KV sequence of the conversation."""

    name = "draft"
    free = False

    def __init__(self, engine: SlotRuntime[Any]) -> None:
        self._engine = engine

    @classmethod
    def load(
        cls, runtime: type[SlotRuntime[Any]], options: LoadOptions, target: ModelInfo
    ) -> DraftModel:
        """The draft model of `options` on `runtime`; ModelLoadError, in words, when it cannot
        load or does not share the target's tokenizer."""
        path = options.draft_model
        draft_options = replace(
            options,
            model_path=path,
            snapshots=False,
            speculation="off",
            draft_model=None,
            overrides=(),
            tensor_split=(),
            chat_template=None,
        )
        engine = runtime()
        try:
            info = engine.load(draft_options)
        except EngineError as exc:
            raise ModelLoadError(f"The draft model could not load: {exc}") from exc
        if info.n_vocab != target.n_vocab or tokenizer_fingerprint(path) != tokenizer_fingerprint(
            target.path
        ):
            engine.unload()
            raise ModelLoadError(
                f"The draft model {info.name} does not share {target.name}'s tokenizer, so its "
                "guesses cannot be checked. Choose a draft model from the same family, or none."
            )
        return cls(engine)

    def propose(self, slot: str, history: Sequence[int], k: int) -> list[int]:
        engine = self._engine
        if len(history) + k >= engine._n_ctx:
            return []
        held = engine._slot(slot)
        engine._sync(held, history, None)
        if len(held.tokens) != len(history):
            return []
        logits = engine._logits(held)
        drafts: list[int] = []
        for i in range(k):
            token = int(np.argmax(logits))
            drafts.append(token)
            if token in engine._eog or i == k - 1:
                break
            logits = engine._verify(held, [token])[0]
        return drafts

    def band(self) -> int:
        return 0

    def close(self) -> None:
        self._engine.unload()


def drafters_for(
    runtime: type[SlotRuntime[Any]], options: LoadOptions, target: ModelInfo
) -> list[Drafter]:
    """The drafters `options.speculation` asks for, prompt lookup first (it costs nothing)."""
    mode = options.speculation
    if mode not in SPECULATION_MODES:
        choices = ", ".join(SPECULATION_MODES)
        raise ModelLoadError(f"Unknown speculation {mode!r}: use one of {choices}.")
    drafters: list[Drafter] = []
    if mode in ("auto", "lookup"):
        drafters.append(PromptLookup())
    if mode in ("auto", "draft") and options.draft_model:
        try:
            drafters.append(DraftModel.load(runtime, options, target))
        except ModelLoadError as exc:
            logger.warning("no draft model: %s", exc)
    return drafters
