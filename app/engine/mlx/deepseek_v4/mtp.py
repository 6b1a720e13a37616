"""DeepSeek V4's MTP block on MLX as the head `app/engine/mtp.py` drafts with: one window
cache per conversation, beginning where the drafter starts its entries (`DeepseekV4Cache`
with `start`: raw rows only, the block's attention has no compression)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from app.engine.mlx.deepseek_v4 import DeepseekV4Cache, Model


class MtpCache(DeepseekV4Cache):
    """The MTP block's K rows of positions start.. ."""

    def __init__(self, start: int) -> None:
        super().__init__(0)
        self.start = self.offset = self.floor = start

    def cut(self, keep: int) -> None:
        keep = max(self.start, min(keep, self.offset))
        self.raw.n = keep - self.start
        self.offset = keep


class MlxMtpHead:
    """The model's `mtp[0]` block over one `MtpCache` per key; while it is open the model
    keeps its last call's final streams (`Model.keep_hidden`)."""

    def __init__(self, model: Model) -> None:
        self.window = model.args.sliding_window
        self._model = model
        self._caches: dict[str, MtpCache] = {}
        model.keep_hidden = True

    def cut(self, key: str, keep: int) -> None:
        cache = self._caches.get(key)
        if cache is None:
            return
        if keep <= cache.start:
            del self._caches[key]
        else:
            cache.cut(keep)

    def step(
        self, key: str, start: int, tokens: Sequence[int], states: list[Any]
    ) -> tuple[np.ndarray, Any]:
        cache = self._caches.get(key)
        if cache is None or cache.offset != start:
            cache = self._caches[key] = MtpCache(start)
        block = self._model.mtp[0]
        logits, out = block(self._model, mx.array(list(tokens)), mx.stack(states), cache)
        last = logits[-1].astype(mx.float32)
        mx.eval(last, out, cache.raw.view())
        return np.array(last), out[-1]

    def close(self) -> None:
        self._caches.clear()
        self._model.keep_hidden = False
        self._model.hidden = None
