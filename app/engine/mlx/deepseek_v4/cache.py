"""DeepSeek V4's cache (`DeepseekV4Cache`, one per layer), and what trimming it can reach.

It holds per layer: every raw K row (any position can be returned to), the compressed rows,
and for each compressor the projections of the tokens that its next block still needs. That
last part is state carried across chunks, like llama.cpp's recurrent "compressor state", so
chunked prefill and decode compute exactly what one pass over the whole prompt computes.

What trimming can and cannot do. A compressor's next row depends on the projections of the
tokens since the start of its (previous, for 4:1) block; those are not kept for every
position. So the cache trims *exactly* to any position within the last `history` tokens (it
keeps enough projections for that), and to any multiple of `checkpoint_every` (128 by
default; at a multiple of 128 the 128:1 compressors have nothing pending and the 4:1 ones
need only the last 4 tokens' projections, which each checkpoint keeps). For any other
position `trim(n)` goes back to the checkpoint at or before it and returns the larger count
it removed: the engine then re-feeds the tokens between that checkpoint and its target
(at most `checkpoint_every - 1` of them). Every layer applies the same rule, so they always
agree. llama.cpp, by contrast, can only roll its compressor state back to `n_rs_seq`
snapshots. `snapshot()`/`restore()` capture the whole state in O(1) (MLX arrays are
immutable values; later writes copy on write).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache

from app.engine.mlx.deepseek_v4.args import CSA_RATIO, HCA_RATIO


class _Rows:
    """An append-only 2-D buffer grown in steps (like mlx-lm's KVCache), trimmable."""

    step = 256

    def __init__(self) -> None:
        self.buf: mx.array | None = None
        self.n = 0

    def append(self, rows: mx.array) -> None:
        end = self.n + rows.shape[0]
        if self.buf is None or end > self.buf.shape[0]:
            grow = ((end - self.n + self.step - 1) // self.step) * self.step
            fresh = mx.zeros((grow, rows.shape[1]), rows.dtype)
            kept = self.buf[: self.n] if self.buf is not None else None
            self.buf = fresh if kept is None else mx.concatenate([kept, fresh])
        self.buf[self.n : end] = rows
        self.n = end

    def view(self, start: int = 0, end: int | None = None) -> mx.array:
        assert self.buf is not None
        return self.buf[start : self.n if end is None else end]

    def copy(self) -> _Rows:
        out = _Rows()
        out.buf, out.n = (self.buf[: self.n] if self.buf is not None else None), self.n
        return out


@dataclass
class Pending:
    """A compressor's per-token projections (kv, gate score) of positions start.. ."""

    kv: mx.array
    score: mx.array
    start: int


class _CompressorState:
    """One compressor's memory: its compressed rows, pending projections, checkpoints."""

    def __init__(self, ratio: int, width: int) -> None:
        self.ratio = ratio
        self.overlap = ratio == CSA_RATIO
        self.rows = _Rows()
        empty = mx.zeros((0, width), mx.float32)
        self.pending = Pending(empty, empty, 0)
        self.checkpoints: dict[int, Pending] = {}

    def needed_from(self, position: int) -> int:
        """First position whose projections the next block after `position` reads."""
        return max(0, (position // self.ratio - int(self.overlap)) * self.ratio)

    def copy(self) -> _CompressorState:
        out = _CompressorState.__new__(_CompressorState)
        out.ratio, out.overlap = self.ratio, self.overlap
        out.rows, out.pending, out.checkpoints = (
            self.rows.copy(),
            self.pending,
            dict(self.checkpoints),
        )
        return out


class DeepseekV4Cache:
    """One layer's cache: raw K rows, and for compressed layers the compressor states.

    See the module docstring for what `trim` can reach. `history` and `checkpoint_every`
    must be the same for every layer of a model (`Model.make_cache` sees to it).
    """

    def __init__(self, ratio: int, history: int = 256, checkpoint_every: int = HCA_RATIO) -> None:
        if checkpoint_every % HCA_RATIO:
            raise ValueError("checkpoint_every must be a multiple of 128")
        self.ratio = ratio
        self.history = history
        self.checkpoint_every = checkpoint_every
        self.offset = 0
        self.start = 0  # the first position it holds (an MTP block's cache may begin later)
        self.floor = 0  # the earliest position trim() reaches exactly
        self.raw = _Rows()
        self.compressors: dict[str, _CompressorState] = {}

    def compressor(self, name: str, ratio: int, width: int) -> _CompressorState:
        if name not in self.compressors:
            self.compressors[name] = _CompressorState(ratio, width)
        return self.compressors[name]

    def advance(self, n_tokens: int) -> None:
        """Called once the layer has written a chunk: moves offset and the exact-trim floor."""
        self.offset += n_tokens
        self.floor = max(self.floor, self.offset - self.history, 0)

    # mlx-lm's cache protocol

    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.offset == 0

    def is_trimmable(self) -> bool:
        return True

    def reachable(self, position: int) -> int:
        """The position trim() lands on when asked for `position`."""
        position = max(0, min(position, self.offset))
        if position >= self.floor:
            return position
        return (position // self.checkpoint_every) * self.checkpoint_every

    def trim(self, n: int) -> int:
        """Remove the last n tokens, or more (back to a checkpoint); returns how many."""
        target = self.reachable(self.offset - n)
        if target == self.offset:
            return 0
        exact = target >= self.floor
        self.raw.n = target
        for state in self.compressors.values():
            state.rows.n = target // state.ratio
            state.checkpoints = {c: p for c, p in state.checkpoints.items() if c <= target}
            if exact:
                p = state.pending
                cut = target - p.start
                state.pending = Pending(p.kv[:cut], p.score[:cut], p.start)
            else:
                state.pending = state.checkpoints.get(target) or _empty_like(state.pending)
        trimmed = self.offset - target
        self.offset = target
        if not exact:
            self.floor = target
        return trimmed

    def snapshot(self) -> DeepseekV4Cache:
        """An independent copy of this layer's state (cheap: arrays are shared until written)."""
        out = DeepseekV4Cache(self.ratio, self.history, self.checkpoint_every)
        out.offset, out.floor, out.raw = self.offset, self.floor, self.raw.copy()
        out.compressors = {k: v.copy() for k, v in self.compressors.items()}
        return out

    def restore(self, snapshot: DeepseekV4Cache) -> None:
        copy = snapshot.snapshot()
        self.__dict__.update(copy.__dict__)

    @property
    def state(self) -> dict[str, Any]:
        """Everything as arrays and scalars: mlx-lm's `save_prompt_cache` writes it as is."""
        compressors = {}
        for name, c in self.compressors.items():
            held = {"pending": c.pending, **{f"cp{k}": p for k, p in c.checkpoints.items()}}
            compressors[name] = {
                "ratio": c.ratio,
                "rows": c.rows.view() if c.rows.n else None,
                **{
                    key: {"kv": p.kv, "score": p.score, "start": p.start} for key, p in held.items()
                },
            }
        return {
            "ratio": self.ratio,
            "history": self.history,
            "checkpoint_every": self.checkpoint_every,
            "offset": self.offset,
            "floor": self.floor,
            "raw": self.raw.view() if self.raw.n else None,
            "compressors": compressors,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> DeepseekV4Cache:
        """The inverse of `state` (mlx-lm's `load_prompt_cache` calls it)."""
        cache = cls(state["ratio"], state["history"], state["checkpoint_every"])
        cache.offset, cache.floor = state["offset"], state["floor"]
        if state["raw"] is not None:
            cache.raw.append(state["raw"])
        for name, held in state.get("compressors", {}).items():  # empty ones are not saved
            pending = held["pending"]
            c = cache.compressor(name, held["ratio"], pending["kv"].shape[1])
            if held["rows"] is not None:
                c.rows.append(held["rows"])
            c.pending = Pending(pending["kv"], pending["score"], pending["start"])
            c.checkpoints = {
                int(key[2:]): Pending(p["kv"], p["score"], p["start"])
                for key, p in held.items()
                if key.startswith("cp")
            }
        return cache

    @property
    def nbytes(self) -> int:
        arrays = [self.raw.view()] if self.raw.buf is not None else []
        for s in self.compressors.values():
            if s.rows.buf is not None:
                arrays.append(s.rows.view())
            for p in (s.pending, *s.checkpoints.values()):
                arrays += [p.kv, p.score]
        return sum(a.nbytes for a in arrays)


def _empty_like(p: Pending) -> Pending:
    empty = mx.zeros((0, p.kv.shape[1]), mx.float32)
    return Pending(empty, empty, 0)


# mlx-lm's load_prompt_cache finds a cache class by its name among its own module's globals.
setattr(mlx_cache, DeepseekV4Cache.__name__, DeepseekV4Cache)
