"""The MLX engine: the same promises as the llama.cpp engine, on mlx / mlx-lm.

mlx-lm's `stream_generate` evaluates each sampled token before the caller has seen it, so
its cache runs one token ahead of what the reply keeps (an end-of-turn token included).
Stoke needs the KV to hold exactly the tokens it reports, so this drives the model step by
step instead: token ids in, token ids out, a cancel check between prefill chunks and
between tokens. It keeps mlx-lm's overlap (the next token is evaluated while this one is
handed out) where the cache can take a token back, and takes back an end-of-turn token.

Each resident conversation (slot) owns one mlx-lm prompt cache; all of them together stay
within `n_ctx` tokens and `n_seq_max` slots, like the llama.cpp engine's shared context,
and a slot pushed out is snapshotted through mlx-lm's `save_prompt_cache` into the same
checked RAM/disk tiers (`KVStore`, engine tag "mlx").
"""

from __future__ import annotations

import io
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    KVCache,
    can_trim_prompt_cache,
    load_prompt_cache,
    make_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from app import paths
from app.engine.kvstore import KVStore
from app.engine.mlx.models import LoadedModel, load_model
from app.engine.protocol import (
    CancelToken,
    ContextOverflowError,
    EngineError,
    FinishReason,
    GenerationEvent,
    GenerationStats,
    LoadOptions,
    ModelInfo,
    SamplingParams,
    TokenEvent,
)

logger = logging.getLogger("stoke.engine.mlx")

RESTORE_MIN_GAIN = 32  # tokens a snapshot must add over the live KV to be worth loading
SNAPSHOT_FOLDER = "mlx"  # beside llama.cpp's files for the same model, never mixed with them


@dataclass
class _Slot:
    """One conversation's prompt cache and the exact tokens it holds."""

    cache: list[Any]
    tokens: list[int] = field(default_factory=list)
    saved: list[int] = field(default_factory=list)  # the tokens of its last snapshot
    logits: mx.array | None = None  # the next-token logits after `tokens`, when known


class _Payload(io.BytesIO):
    """Snapshot bytes as a file: `load_prompt_cache` picks the reader by the file's name."""

    name = "snapshot.safetensors"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def compact_cache(cache: list[Any]) -> list[Any]:
    """The cache with only the rows in use: KVCache buffers grow in steps of 256 rows and a
    trim only moves the offset. Its KVCache layers are new objects (a copy to write into)."""
    out = []
    for layer in cache:
        if type(layer) is KVCache and layer.keys is not None:
            copy = KVCache()
            copy.keys = layer.keys[..., : layer.offset, :]
            copy.values = layer.values[..., : layer.offset, :]
            copy.offset = layer.offset
            layer = copy
        out.append(layer)
    return out


class MlxEngine:
    """Engine contract over MLX. Not thread-safe: the engine host serialises calls."""

    backend_name = "mlx"

    def __init__(self) -> None:
        self._loaded: LoadedModel | None = None
        self._options: LoadOptions | None = None
        self.info: ModelInfo | None = None
        self._n_ctx = 0
        self._slots: OrderedDict[str, _Slot] = OrderedDict()  # least recently used first
        self._kv: KVStore | None = None
        self._trimmable = True

    # -- loading --------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> ModelInfo:
        self.unload()
        loaded = load_model(options.model_path)
        mx.eval(loaded.model.parameters())
        self._loaded, self._options = loaded, options
        train = loaded.n_ctx_train
        self._n_ctx = min(options.n_ctx, train) if train > 0 else options.n_ctx
        self._trimmable = can_trim_prompt_cache(make_prompt_cache(loaded.model))
        self.info = ModelInfo(
            path=options.model_path,
            name=loaded.name,
            fingerprint=loaded.fingerprint,
            architecture=loaded.architecture,
            n_ctx=self._n_ctx,
            n_ctx_train=train,
            n_vocab=loaded.n_vocab,
            chat_template=options.chat_template or loaded.chat_template,
            bos_token=loaded.bos_token,
            eos_token=loaded.eos_token,
            add_bos=loaded.add_bos,
            bos_id=loaded.bos_id,
            eog_ids=tuple(sorted(loaded.eog_ids)),
            backend=self.backend_name,
            size_bytes=loaded.size_bytes,
        )
        if options.snapshots:
            self._kv = KVStore(
                loaded.fingerprint,
                self.backend_name,
                ram_budget=options.kv_ram_budget,
                disk_budget=options.kv_disk_budget,
                directory=paths.kv_dir(loaded.fingerprint) / SNAPSHOT_FOLDER,
            )
        return self.info

    def unload(self) -> None:
        """Free the model; resident conversations are snapshotted first."""
        if self._kv is not None:
            for name, slot in self._slots.items():
                self._save(name, slot)
            self._kv.close()
            self._kv = None
        self._slots.clear()
        self._loaded = None
        self.info = None
        mx.clear_cache()

    # -- tokens ---------------------------------------------------------------------------

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return self._require_model().tokenizer.tokenize(text, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._require_model().tokenizer.detokenize(tokens)

    def _require_model(self) -> LoadedModel:
        if self._loaded is None:
            raise EngineError("No model is loaded.")
        return self._loaded

    # -- slots: resident conversations, eviction, snapshots -------------------------------

    def _slot(self, name: str) -> _Slot:
        """The slot's cache; a new slot past `n_seq_max` evicts the least recently used."""
        slot = self._slots.get(name)
        if slot is None:
            while self._slots and len(self._slots) >= max(self._options.n_seq_max, 1):
                self._evict(next(iter(self._slots)))
            slot = _Slot(make_prompt_cache(self._loaded.model))
            self._slots[name] = slot
        self._slots.move_to_end(name)
        return slot

    def _evict(self, name: str) -> None:
        self._save(name, self._slots.pop(name))

    def _clear(self, slot: _Slot, keep: int = 0) -> int:
        """Drop the slot's KV from position `keep` on; returns what was kept (a cache that
        cannot be cut there starts over, or stops at the nearest point it can reach)."""
        if keep and self._trimmable:
            keep = len(slot.tokens) - trim_prompt_cache(slot.cache, len(slot.tokens) - keep)
        else:
            keep = 0
        if not keep:
            slot.cache = make_prompt_cache(self._loaded.model)
        del slot.tokens[keep:]
        slot.logits = None
        return keep

    def _make_room(self, slot: _Slot, n_new: int) -> None:
        """Keep all resident tokens within n_ctx: evict others, oldest first."""
        while sum(len(s.tokens) for s in self._slots.values()) + n_new > self._n_ctx:
            others = [name for name, other in self._slots.items() if other is not slot]
            if not others:
                return
            self._evict(others[0])

    def _save(self, name: str, slot: _Slot) -> int:
        if self._kv is None or not slot.tokens or slot.saved == slot.tokens:
            return 0
        buffer = io.BytesIO()
        try:
            save_prompt_cache(buffer, compact_cache(slot.cache), {"engine": self.backend_name})
        except (ValueError, AttributeError, TypeError) as exc:  # a cache mlx-lm cannot save
            logger.warning("no snapshot for %s: %s", name, exc)
            return 0
        self._kv.put(name, slot.tokens, buffer.getvalue())
        slot.saved = list(slot.tokens)
        return len(slot.tokens)

    def snapshot(self, slot: str, *, wait: bool = False) -> int:
        self._require_model()
        held = self._slots.get(slot)
        saved = self._save(slot, held) if held is not None else 0
        if wait and self._kv is not None:
            self._kv.flush()
        return saved

    def _load_cache(self, payload: bytes, n_tokens: int) -> list[Any] | None:
        """The prompt cache in a snapshot, or None when it does not fit this model."""
        template = make_prompt_cache(self._loaded.model)
        try:
            cache = load_prompt_cache(_Payload(payload))
        except Exception as exc:  # the bytes passed their checksum; still never trust them
            logger.warning("snapshot unreadable: %s", exc)
            return None
        fits = len(cache) == len(template) and all(
            type(c) is type(t) and c.size() in (n_tokens, 0)
            for c, t in zip(cache, template, strict=True)
        )
        return cache if fits and any(c.size() == n_tokens for c in cache) else None

    def _restore(self, slot: _Slot, tokens: Sequence[int], live: int) -> bool:
        """Load the snapshot sharing the longest prefix with `tokens` when it beats the live
        KV by enough. A cache that cannot be trimmed only takes a snapshot it can extend."""
        match = self._kv.best(tokens) if self._kv is not None else None
        if match is None or match.common < live + RESTORE_MIN_GAIN:
            return False
        if not self._trimmable and match.common < min(match.n_tokens, len(tokens) - 1):
            return False
        snap = self._kv.load(match)
        cache = self._load_cache(snap.payload, len(snap.tokens)) if snap is not None else None
        if cache is None:
            return False
        self._clear(slot)
        self._make_room(slot, len(snap.tokens))
        slot.cache, slot.tokens = cache, list(snap.tokens)
        return True

    def resident_tokens(self, slot: str) -> list[int]:
        held = self._slots.get(slot)
        return list(held.tokens) if held else []

    # -- prefill and generation -----------------------------------------------------------

    def _check_fits(self, n_prompt: int) -> None:
        if n_prompt >= self._n_ctx:
            raise ContextOverflowError(n_prompt, self._n_ctx)

    def _sync(
        self, slot: _Slot, tokens: Sequence[int], cancel: CancelToken | None
    ) -> tuple[int, int, int]:
        """Make the slot hold exactly `tokens` with the next-token logits ready.

        The longest prefix wins among the slot itself and the RAM and disk snapshots; what
        diverges is trimmed and only the tail evaluated. Returns (reused, restored, prefilled).
        """
        if not tokens:
            return 0, 0, 0
        own = _common_prefix(slot.tokens, tokens)
        if own == len(tokens) == len(slot.tokens) and slot.logits is not None:
            return own, 0, 0
        restored = self._restore(slot, tokens, own)
        keep = min(_common_prefix(slot.tokens, tokens), len(tokens) - 1)  # last gives logits
        keep = self._clear(slot, keep) if keep < len(slot.tokens) else keep
        tail = list(tokens[keep:])
        self._make_room(slot, len(tail))
        n_batch = max(self._options.n_batch, 1)
        for start in range(0, len(tail), n_batch):
            if cancel is not None and cancel.cancelled:
                break
            chunk = tail[start : start + n_batch]
            self._forward(slot, chunk, want_logits=start + len(chunk) == len(tail))
        return keep, keep if restored else 0, len(slot.tokens) - keep

    def _forward(self, slot: _Slot, chunk: list[int], *, want_logits: bool) -> None:
        """Evaluate `chunk` into the slot's cache. The vocabulary projection is computed only
        for the last token, and only when its logits are wanted (MLX is lazy: a prefix
        chunk's logits that are never read are never computed)."""
        model = self._loaded.model
        try:
            head = chunk[:-1] if want_logits else chunk
            if head:
                model(mx.array(head)[None], cache=slot.cache)
                mx.eval([c.state for c in slot.cache])
            if want_logits:
                logits = model(mx.array(chunk[-1:])[None], cache=slot.cache)[0, -1]
                mx.eval(logits, [c.state for c in slot.cache])
        except (RuntimeError, ValueError, MemoryError) as exc:
            self._clear(slot)
            raise EngineError(f"MLX failed to evaluate the prompt: {exc}") from exc
        slot.tokens.extend(chunk)
        slot.logits = logits if want_logits else None

    def _feed_ahead(self, slot: _Slot, sampled: mx.array) -> None:
        """Evaluate a sampled token before its value is read, as mlx-lm's generate_step
        does: the device works on the next logits while Python hands this token out. The
        caller appends the token to `slot.tokens` once it is known and kept."""
        try:
            logits = self._loaded.model(sampled.reshape(1, 1), cache=slot.cache)[0, -1]
        except (RuntimeError, ValueError, MemoryError) as exc:
            self._clear(slot)
            raise EngineError(f"MLX failed to evaluate the reply: {exc}") from exc
        mx.async_eval(logits)
        slot.logits = logits

    def _take_back(self, slot: _Slot, logits: mx.array) -> None:
        """Undo `_feed_ahead` of a token that is not kept (end of turn): trim it from the
        cache and restore the logits it was sampled from."""
        trimmed = trim_prompt_cache(slot.cache, 1)
        if trimmed == 1:
            slot.logits = logits
        else:  # the cache could only go back further, to a point it can restore
            del slot.tokens[len(slot.tokens) + 1 - trimmed :]
            slot.logits = None

    def prefill(
        self, tokens: Sequence[int], *, slot: str = "default", cancel: CancelToken | None = None
    ) -> GenerationStats:
        self._require_model()
        self._check_fits(len(tokens))
        start = time.perf_counter()
        held = self._slot(slot)
        reused, restored, prefilled = self._sync(held, tokens, cancel)
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
    ) -> Iterator[GenerationEvent]:
        loaded = self._require_model()
        if not tokens:
            raise EngineError("Nothing to reply to: the prompt is empty.")
        self._check_fits(len(tokens))
        start = time.perf_counter()
        held = self._slot(slot)
        reused, restored, prefilled = self._sync(held, tokens, cancel)
        prefill_s = time.perf_counter() - start
        sample = self._sampler(sampling)
        processors = self._logits_processors(sampling)
        text = loaded.tokenizer.stream()
        generated = 0
        first_at = last_at = None
        reason = FinishReason.LENGTH
        while True:
            if (cancel is not None and cancel.cancelled) or len(held.tokens) < len(tokens):
                reason = FinishReason.CANCELLED
                break
            if generated >= max_tokens:
                break
            logits = held.logits
            scores = logits[None]
            if processors:
                context = mx.array(held.tokens[-sampling.penalty_last_n :])
                for process in processors:
                    scores = process(context, scores)
            sampled = sample(scores - mx.logsumexp(scores, axis=-1, keepdims=True))
            last = generated + 1 >= max_tokens or len(held.tokens) + 1 >= self._n_ctx
            ahead = self._trimmable and not last
            if ahead:
                self._feed_ahead(held, sampled)
            token = int(sampled.item())
            last_at = time.perf_counter()
            first_at = first_at or last_at
            if token in loaded.eog_ids:
                if ahead:
                    self._take_back(held, logits)
                reason = FinishReason.STOP
                break
            generated += 1
            if ahead:
                held.tokens.append(token)
            yield TokenEvent(token, text.add(token))
            if last:
                break
            if not ahead:
                self._forward(held, [token], want_logits=True)
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
        )

    @staticmethod
    def _logits_processors(sampling: SamplingParams) -> list[Callable]:
        """mlx-lm's logit bias and penalties, over the same last `penalty_last_n` tokens
        (prompt and reply) as llama.cpp's sampler chain, so both engines penalise alike."""
        n = sampling.penalty_last_n
        return make_logits_processors(
            dict(sampling.logit_bias) or None,
            repetition_penalty=sampling.repeat_penalty if sampling.repeat_penalty != 1.0 else None,
            repetition_context_size=n,
            presence_penalty=sampling.presence_penalty or None,
            presence_context_size=n,
            frequency_penalty=sampling.frequency_penalty or None,
            frequency_context_size=n,
        )

    @staticmethod
    def _sampler(sampling: SamplingParams):
        """mlx-lm's sampler chain (greedy at temperature <= 0); a seed makes it repeatable."""
        if sampling.temperature <= 0:
            return make_sampler(0.0)
        if sampling.seed is not None:
            mx.random.seed(sampling.seed & 0xFFFFFFFF)
        return make_sampler(
            sampling.temperature,
            top_p=sampling.top_p if sampling.top_p < 1.0 else 0.0,
            min_p=sampling.min_p,
            top_k=sampling.top_k,
        )
