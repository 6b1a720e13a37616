"""The slot engine both local runtimes share: resident conversations, prefix sync, snapshots,
prefill and the generate loop.

A slot is one conversation's KV sequence and the exact tokens it holds, at most `n_ctx`
(the model's window). At most `n_seq_max` slots are resident; where the runtime's slots share
one pool of cells (MLX's memory, llama.cpp's unified KV) they also stay within it together.
When room is needed the least recently used slot is snapshotted into `KVStore`'s RAM and disk
tiers and dropped. Where each slot has a KV stream of its own (llama.cpp's default), a
prefill attends over its own conversation's cells only, however many others are resident.
A prompt is synced to the longest prefix among its own sequence, the other resident sequences
(where the runtime can copy a prefix) and the snapshots, so only the rest is evaluated.

That policy is written once, here. A runtime (llama.cpp, MLX) subclasses `SlotEngine` and
supplies a handful of hooks (new slot, trim, serialize, deserialize, forward, verify, sample,
and optionally copying a prefix between sequences), so that every decoding strategy built on
them is written once for both: the generate loop's token source is `speculate.Decoder`,
plain decoding or speculative decoding with the drafters the load options choose.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic

import numpy as np

from app.engine.draft_model import drafters_for
from app.engine.drafting import Drafter
from app.engine.images import has_images, is_image, run_start
from app.engine.kvstore import KVStore, common_prefix
from app.engine.model_file import weights_id
from app.engine.protocol import (
    CancelToken,
    ContextOverflowError,
    EngineError,
    FinishReason,
    GenerationEvent,
    GenerationStats,
    LoadOptions,
    ModelInfo,
    PrefillProgress,
    ProgressCallback,
    SamplingParams,
    TokenEvent,
)
from app.engine.runtime import Draw, S
from app.engine.speculate import Decoder, Pace

RESTORE_MIN_GAIN = 32  # tokens a snapshot or another sequence must add to be worth copying


class SlotEngine(Generic[S]):
    """The Engine contract's slot, prefill and generate methods over a runtime's hooks.

    Not thread-safe: the engine host serialises calls. A subclass's `load` sets `_options`,
    `_n_ctx`, `_pool`, `_eog` and `_kv` (through `_open_store`), and `info` last, once all is up.
    """

    backend_name = ""

    def __init__(self) -> None:
        self.info: ModelInfo | None = None
        self._options: LoadOptions | None = None
        self._n_ctx = 0  # one conversation's window
        self._pool = 0  # cells the resident slots share (0: each has n_ctx of its own)
        self._eog: frozenset[int] = frozenset()
        self._slots: OrderedDict[str, S] = OrderedDict()  # least recently used first
        self._kv: KVStore | None = None
        self._trimmable = True  # False: restore only a snapshot the slot can extend
        self._copies_prefixes = False  # True: `_copy_prefix` shares a resident prefix
        self._speculates = False  # True: `_verify` works and the KV can be cut anywhere
        self._verify_exact = False  # True: `_verify`'s rows and K/V are one-token decoding's
        self._drafters: list[Drafter] = []  # set by `_open_drafters` (speculate.py)
        self._pace = Pace()

    # -- the runtime's hooks ----------------------------------------------------------------

    def _new_slot(self) -> S:
        """An empty sequence for a new resident conversation (room for it has been made)."""
        raise NotImplementedError

    def _release(self, slot: S) -> None:
        """Free the runtime's sequence of an evicted slot (already snapshotted)."""

    def _trim(self, slot: S, keep: int) -> int:
        """Drop the runtime's KV (and any logits it held) from position `keep` on; returns the
        position it could keep (0: it started over). `slot.tokens` is cut by the caller."""
        raise NotImplementedError

    def _has_logits(self, slot: S) -> bool:
        """Whether the logits after the slot's last token are ready to sample from."""
        raise NotImplementedError

    def _serialize(self, name: str, slot: S) -> bytes | None:
        """The slot's KV as snapshot bytes, or None when this runtime cannot save it."""
        raise NotImplementedError

    def _deserialize(self, payload: bytes, n_tokens: int) -> Any | None:
        """A snapshot read back, before any slot is touched; None when it does not fit."""
        raise NotImplementedError

    def _install(self, slot: S, state: Any) -> bool:
        """Put a deserialized snapshot into the (emptied) slot; False when that failed."""
        raise NotImplementedError

    def _copy_prefix(self, donor: S, slot: S, n: int) -> bool:
        """Share (or copy) the donor's first `n` positions into the (emptied) slot; False
        when that failed and the slot is still empty."""
        raise NotImplementedError

    def _forward(self, slot: S, chunk: list[int], *, want_logits: bool) -> None:
        """Evaluate `chunk` after `slot.tokens` and append it there; with `want_logits`, the
        logits after its last token become ready."""
        raise NotImplementedError

    def _verify(self, slot: S, chunk: list[int]) -> np.ndarray:
        """Evaluate `chunk` after `slot.tokens` in one batch and append it there; returns the
        logits after each of its tokens (rows of float32), the last also left ready."""
        raise NotImplementedError

    def _logits(self, slot: S) -> np.ndarray:
        """The ready logits after the slot's last token (`_has_logits`), as float32."""
        raise NotImplementedError

    def _draw(self, sampling: SamplingParams, prompt: Sequence[int]) -> Draw[S]:
        """The sampler of one reply to `prompt`."""
        raise NotImplementedError

    def _text_stream(self) -> Callable[[int], str]:
        """Per reply: each token's text as it arrives (multi-byte characters held back)."""
        raise NotImplementedError

    def _close_runtime(self) -> None:
        """Free the model and everything the runtime holds for it."""

    # -- loading ------------------------------------------------------------------------------

    def _open_store(
        self, options: LoadOptions, fingerprint: str, directory: Path | None = None
    ) -> None:
        """The snapshot tiers for the loaded model, when the options ask for snapshots: under
        the weights' id, so snapshots of other weights behind the same fingerprint are
        dropped, never restored."""
        if options.snapshots:
            self._kv = KVStore(
                weights_id(options.model_path, fingerprint),
                self.backend_name,
                ram_budget=options.kv_ram_budget,
                disk_budget=options.kv_disk_budget,
                directory=directory,
            )

    def _open_drafters(self, options: LoadOptions, info: ModelInfo) -> None:
        """The drafters the options ask for, where this runtime can verify (speculate.py);
        `info` is the target's, which a draft model must match."""
        self._pace = Pace()
        if self._speculates:
            self._drafters = drafters_for(type(self), options, info)

    def unload(self) -> None:
        """Free the model; resident conversations are snapshotted first (an app restart
        then restores them from disk instead of prefilling)."""
        for drafter in self._drafters:
            drafter.close()
        self._drafters = []
        if self._kv is not None:
            for name, slot in self._slots.items():
                self._save(name, slot)
            self._kv.close()
            self._kv = None
        self._slots.clear()
        self._close_runtime()
        self.info = None

    def _require_model(self) -> None:
        if self.info is None:
            raise EngineError("No model is loaded.")

    # -- slots: resident conversations, eviction, snapshots -----------------------------------

    def _slot(self, name: str) -> S:
        """The slot's sequence; a new slot past `n_seq_max` evicts the least recently used."""
        slot = self._slots.get(name)
        if slot is None:
            while self._slots and len(self._slots) >= max(self._options.n_seq_max, 1):
                self._evict(next(iter(self._slots)))
            slot = self._new_slot()
            self._slots[name] = slot
        self._slots.move_to_end(name)
        return slot

    def _evict(self, name: str) -> None:
        """Snapshot a resident conversation, then free its sequence."""
        slot = self._slots.pop(name)
        self._save(name, slot)
        self._release(slot)

    def _clear(self, slot: S, keep: int = 0) -> int:
        """Drop the slot's KV from position `keep` on; returns what was kept (a sequence that
        cannot be cut there starts over, or stops at the nearest point it can reach)."""
        keep = self._trim(slot, keep)
        del slot.tokens[keep:]
        return keep

    def _make_room(self, slot: S, n_new: int) -> None:
        """Keep all resident tokens within a shared pool: evict others, oldest first."""
        while self._pool and sum(len(s.tokens) for s in self._slots.values()) + n_new > self._pool:
            others = [name for name, other in self._slots.items() if other is not slot]
            if not others:
                return
            self._evict(others[0])

    def _save(self, name: str, slot: S) -> int:
        if self._kv is None or not slot.tokens or slot.saved == slot.tokens:
            return 0
        payload = self._serialize(name, slot)
        if payload is None:
            return 0
        self._kv.put(name, slot.tokens, payload)
        slot.saved = list(slot.tokens)
        return len(slot.tokens)

    def snapshot(self, slot: str, *, wait: bool = False) -> int:
        """Save the slot's KV; the tokens its snapshot now covers (0: no snapshot of it)."""
        self._require_model()
        held = self._slots.get(slot)
        saved = self._save(slot, held) if held is not None else 0
        if not saved and held is not None and self._kv is not None and held.saved == held.tokens:
            saved = len(held.saved)  # saved before, by a reply's background snapshot
        if wait and self._kv is not None:
            self._kv.flush()
        return saved

    def _restore(self, slot: S, tokens: Sequence[int], live: int) -> bool:
        """Load the snapshot sharing the longest prefix with `tokens` when it beats the live
        KV by enough to pay for the copy. A slot that cannot be trimmed only takes a snapshot
        it can extend. False when none does (or it failed its checks)."""
        match = self._kv.best(tokens) if self._kv is not None else None
        if match is None or match.common < live + RESTORE_MIN_GAIN:
            return False
        if not self._trimmable and match.common < min(match.n_tokens, len(tokens) - 1):
            return False
        snap = self._kv.load(match)
        state = self._deserialize(snap.payload, len(snap.tokens)) if snap is not None else None
        if state is None:
            return False
        self._clear(slot)
        self._make_room(slot, len(snap.tokens))
        if not self._install(slot, state):
            self._clear(slot)
            return False
        slot.tokens = list(snap.tokens)
        return True

    def _share_live_prefix(self, slot: S, tokens: Sequence[int], own: int) -> int:
        """Copy the longest prefix another resident sequence holds (where the runtime shares
        cells this is nearly free); returns the prefix length now in `slot`."""
        if not self._copies_prefixes:
            return own
        best, donor = own, None
        for other in self._slots.values():
            common = common_prefix(other.tokens, tokens)
            if other is not slot and common > best:
                best, donor = common, other
        if donor is None or best < own + RESTORE_MIN_GAIN:
            return own
        self._clear(slot)
        if not self._copy_prefix(donor, slot, best):
            return 0
        slot.tokens = list(donor.tokens[:best])
        return best

    def resident_tokens(self, slot: str) -> list[int]:
        held = self._slots.get(slot)
        return list(held.tokens) if held else []

    # -- prefill and generation -------------------------------------------------------------

    def _check_fits(self, n_prompt: int) -> None:
        if n_prompt >= self._n_ctx:
            raise ContextOverflowError(n_prompt, self._n_ctx)

    def _sync(
        self,
        slot: S,
        tokens: Sequence[int],
        cancel: CancelToken | None,
        progress: ProgressCallback | None = None,
        chunk: int = 0,
    ) -> tuple[int, int, int]:
        """Make the slot hold exactly `tokens` with the last token's logits ready.

        The longest prefix wins among the slot itself, the other resident sequences and the
        RAM and disk snapshots; what diverges is trimmed and only the tail evaluated, in
        chunks of `n_batch` (or the smaller `chunk`) with a cancel check between them, each
        reported to `progress`.
        Returns (reused, restored, prefilled)."""
        if not tokens:
            return 0, 0, 0
        own = common_prefix(slot.tokens, tokens)
        if own == len(tokens) == len(slot.tokens) and self._has_logits(slot):
            return own, 0, 0
        live = self._share_live_prefix(slot, tokens, own)
        restored = self._restore(slot, tokens, live)
        keep = min(common_prefix(slot.tokens, tokens), len(tokens) - 1)  # last gives logits
        keep = run_start(tokens, keep)  # never through an image (engine/images.py)
        keep = self._clear(slot, keep) if keep < len(slot.tokens) else keep
        tail = list(tokens[keep:])
        self._make_room(slot, len(tail))
        n_batch = max(min(self._options.n_batch, chunk or self._options.n_batch), 1)
        start = 0
        while start < len(tail):
            if cancel is not None and cancel.cancelled:
                break
            end = min(start + n_batch, len(tail))
            if end < len(tail) and run_start(tail, end) > start:
                end = run_start(tail, end)  # an image's run goes whole into the next piece
            elif end < len(tail) and is_image(tail[end]) and tail[end - 1] == tail[end]:
                end = _run_end(tail, start)  # a run longer than a piece: alone, whole
            self._forward(slot, tail[start:end], want_logits=end == len(tail))
            start = end
            if progress is not None:
                progress(PrefillProgress(len(slot.tokens), len(tokens)))
        return keep, keep if restored else 0, len(slot.tokens) - keep

    def prefill(
        self,
        tokens: Sequence[int],
        *,
        slot: str = "default",
        cancel: CancelToken | None = None,
        progress: ProgressCallback | None = None,
        prefill_chunk: int = 0,
    ) -> GenerationStats:
        self._require_model()
        self._check_fits(len(tokens))
        start = time.perf_counter()
        held = self._slot(slot)
        reused, restored, prefilled = self._sync(held, tokens, cancel, progress, prefill_chunk)
        elapsed = time.perf_counter() - start
        done = len(held.tokens) == len(tokens)
        return GenerationStats.timed(
            prompt_tokens=len(tokens),
            reused_tokens=reused,
            prefilled_tokens=prefilled,
            generated_tokens=0,
            ttft_s=elapsed,
            prefill_s=elapsed,
            decode_s=0.0,
            finish_reason=FinishReason.PREFILLED if done else FinishReason.CANCELLED,
            restored_tokens=restored,
        )

    def generate(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        max_tokens: int,
        *,
        slot: str = "default",
        cancel: CancelToken | None = None,
        progress: ProgressCallback | None = None,
        prefill_chunk: int = 0,
    ) -> Iterator[GenerationEvent]:
        """Sync the prompt (in `prefill_chunk` pieces, or n_batch, each told to `progress`),
        then draw tokens until end of turn, `max_tokens`, a full context or a cancel (checked
        between tokens). The KV keeps exactly the tokens handed out."""
        self._require_model()
        if not tokens:
            raise EngineError("Nothing to reply to: the prompt is empty.")
        self._check_fits(len(tokens))
        start = time.perf_counter()
        held = self._slot(slot)
        reused, restored, prefilled = self._sync(held, tokens, cancel, progress, prefill_chunk)
        prefill_s = time.perf_counter() - start
        text = self._text_stream()
        # a draft model or MTP head reads no image: with one in the prompt, lookup drafts alone
        drafters = [d for d in self._drafters if d.free] if has_images(tokens) else self._drafters
        decoder = Decoder(self, self._draw(sampling, tokens), sampling, slot, drafters)
        decoder.pace = self._pace
        generated = 0
        first_at = last_at = None
        reason = FinishReason.LENGTH
        try:
            while generated < max_tokens:
                if (cancel is not None and cancel.cancelled) or len(held.tokens) < len(tokens):
                    reason = FinishReason.CANCELLED
                    break
                drawn, ended = decoder.next(held, max_tokens - generated)
                last_at = time.perf_counter()
                first_at = first_at or last_at
                for token in drawn:
                    generated += 1
                    yield TokenEvent(token, text(token), *decoder.scores())
                if ended:
                    reason = FinishReason.STOP
                    break
                if not drawn:  # the context is full
                    break
        finally:
            decoder.draw.close()
        end = last_at or time.perf_counter()
        ttft = (first_at or end) - start
        decode_s = end - (first_at or end)
        yield GenerationStats.timed(
            prompt_tokens=len(tokens),
            reused_tokens=reused,
            prefilled_tokens=prefilled,
            generated_tokens=generated,
            ttft_s=ttft,
            prefill_s=prefill_s,
            decode_s=decode_s,
            finish_reason=reason,
            restored_tokens=restored,
            drafted_tokens=decoder.counts.drafted,
            accepted_tokens=decoder.counts.accepted,
        )


def _run_end(tokens: Sequence[int], start: int) -> int:
    """Where the image run starting at `start` ends."""
    end = start
    while end < len(tokens) and tokens[end] == tokens[start]:
        end += 1
    return end
