"""The MLX engine: the same promises as the llama.cpp engine, on mlx / mlx-lm.

mlx-lm's `stream_generate` evaluates each sampled token before the caller has seen it, so
its cache runs one token ahead of what the reply keeps (an end-of-turn token included).
Stoke needs the KV to hold exactly the tokens it reports, so this drives the model step by
step instead: token ids in, token ids out, a cancel check between prefill chunks and
between tokens. It keeps mlx-lm's overlap (the next token is evaluated while this one is
handed out) where the cache can take a token back, and takes back an end-of-turn token.

Each resident conversation (slot) owns one mlx-lm prompt cache. The slot policy (`n_ctx`
and `n_seq_max` budgets, eviction, prefix sync, the generate loop) is `SlotEngine`'s, the
same as the llama.cpp engine's; a slot pushed out is snapshotted through mlx-lm's
`save_prompt_cache` into the same checked RAM/disk tiers (`KVStore`, engine tag "mlx").
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import numpy as np
from llguidance import LLTokenizer
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
from app.engine.chat_template import builtin_template
from app.engine.constraint import Constraint
from app.engine.logprobs import NO_SCORES, Scores
from app.engine.logprobs import scores as logprob_scores
from app.engine.mlx.models import LoadedModel, load_model
from app.engine.mtp import HiddenRows, MtpDrafter
from app.engine.protocol import (
    EngineError,
    LoadOptions,
    ModelInfo,
    SamplingParams,
    check_context,
)
from app.engine.runtime import Slot
from app.engine.slots import SlotEngine

logger = logging.getLogger("stoke.engine.mlx")

SNAPSHOT_FOLDER = "mlx"  # beside llama.cpp's files for the same model, never mixed with them
# A GPU reads a prompt in steps this long at the least (mlx-lm's prefill_step_size): in steps
# of the default n_batch (512) the engine read a 2,048-token prompt at 0.61x of mlx-lm's speed
# on an H100 (bench/results/engines-mlx-h100-dsv4-scaled-n512-20261205.json). A CPU keeps
# n_batch: a step there takes seconds, and Stop lands between steps.
GPU_PREFILL_STEP = 2048


@dataclass(kw_only=True)
class _Slot(Slot):
    """One conversation's mlx-lm prompt cache."""

    cache: list[Any]
    logits: mx.array | None = None  # the next-token logits after `tokens`, when known
    hidden: HiddenRows | None = None  # the last positions' hidden states, for an MTP head


def prefill_steps(options: LoadOptions, device: mx.Device) -> LoadOptions:
    """`options` with the prompt read in steps of GPU_PREFILL_STEP at the least on a GPU."""
    if device == mx.cpu:
        return options
    return replace(options, n_batch=max(options.n_batch, GPU_PREFILL_STEP))


class _Payload(io.BytesIO):
    """Snapshot bytes as a file: `load_prompt_cache` picks the reader by the file's name."""

    name = "snapshot.safetensors"


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


class _MlxDraw:
    """One reply's sampler over mlx-lm's sampler and logits processors. Where the cache can
    take a token back, a drawn token is evaluated before its value is read (as mlx-lm's
    generate_step does: the device works on the next logits while Python hands this one
    out), and an end-of-turn token is then taken back."""

    def __init__(self, engine: MlxEngine, sampling: SamplingParams) -> None:
        self._engine = engine
        self._sample = engine._sampler(sampling)
        self._processors = engine._logits_processors(sampling)
        self._penalty_last_n = sampling.penalty_last_n
        self._logits: mx.array | None = None  # what the last token was drawn from
        self._ahead = False
        self._constraint = engine._constraint(sampling)
        self._n_top = sampling.logprobs
        self._scores: Scores = NO_SCORES

    def next(self, slot: _Slot, last: bool) -> int:
        self._logits = slot.logits
        scores = self._logits[None]
        if self._processors:
            context = mx.array(slot.tokens[-self._penalty_last_n :])
            for process in self._processors:
                scores = process(context, scores)
        if self._constraint is not None:
            allowed = self._constraint.allowed()
            width = scores.shape[-1]
            allowed = np.pad(allowed, (0, max(width - allowed.size, 0)))[:width]
            scores = mx.where(mx.array(allowed)[None], scores, -mx.inf)
        sampled = self._sample(scores - mx.logsumexp(scores, axis=-1, keepdims=True))
        self._ahead = self._engine._trimmable and not last
        if self._ahead:
            self._engine._feed_ahead(slot, sampled)
        token = int(sampled.item())
        if self._constraint is not None:
            self._constraint.accept(token)
        if self._n_top is not None:
            self._scores = logprob_scores(
                np.array(scores[0].astype(mx.float32)), token, self._n_top
            )
        if self._ahead:
            slot.tokens.append(token)
        return token

    def take_back(self, slot: _Slot) -> None:
        """Trim the token fed ahead from the cache and restore the logits it was drawn from."""
        if not self._ahead:
            return
        slot.tokens.pop()
        if slot.hidden is not None:
            slot.hidden.cut(len(slot.tokens))
        trimmed = trim_prompt_cache(slot.cache, 1)
        if trimmed == 1:
            slot.logits = self._logits
        else:  # the cache could only go back further, to a point it can restore
            del slot.tokens[len(slot.tokens) + 1 - trimmed :]
            slot.logits = None

    def scores(self) -> Scores:
        return self._scores

    def close(self) -> None:
        """Nothing native to free: MLX arrays go with their last reference."""


class MlxEngine(SlotEngine[_Slot]):
    """Engine contract over MLX. Not thread-safe: the engine host serialises calls."""

    backend_name = "mlx"

    def __init__(self) -> None:
        super().__init__()
        self._loaded: LoadedModel | None = None
        self._lltokenizer: LLTokenizer | None = None  # for grammars, once asked
        self._keep_hidden = 0  # hidden states kept per slot (an MTP drafter asks for them)

    # -- loading --------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> ModelInfo:
        self.unload()
        check_context(options)
        loaded = load_model(options.model_path)
        mx.eval(loaded.model.parameters())
        options = prefill_steps(options, mx.default_device())
        self._loaded, self._options = loaded, options
        train = loaded.n_ctx_train
        self._n_ctx = min(options.n_ctx, train) if train > 0 else options.n_ctx
        # The slots' caches grow in RAM: a window each, as llama.cpp's streams, or one pool.
        self._pool = options.n_ctx if options.kv_unified else self._n_ctx * options.n_seq_max
        self._trimmable = can_trim_prompt_cache(make_prompt_cache(loaded.model))
        self._speculates = self._trimmable  # refused drafts are trimmed from the cache
        self._eog = frozenset(loaded.eog_ids)
        info = ModelInfo(
            path=options.model_path,
            name=loaded.name,
            fingerprint=loaded.fingerprint,
            architecture=loaded.architecture,
            n_ctx=self._n_ctx,
            n_ctx_train=train,
            n_vocab=loaded.n_vocab,
            chat_template=options.chat_template
            or loaded.chat_template
            or builtin_template(loaded.architecture, loaded.name),
            bos_token=loaded.bos_token,
            eos_token=loaded.eos_token,
            add_bos=loaded.add_bos,
            bos_id=loaded.bos_id,
            eog_ids=tuple(sorted(loaded.eog_ids)),
            backend=self.backend_name,
            size_bytes=loaded.size_bytes,
        )
        self._open_drafters(options, info)
        self._open_store(
            options, loaded.fingerprint, paths.kv_dir(loaded.fingerprint) / SNAPSHOT_FOLDER
        )
        self.info = info
        return info

    def _close_runtime(self) -> None:
        self._loaded = None
        self._lltokenizer = None
        mx.clear_cache()

    def _constraint(self, sampling: SamplingParams) -> Constraint | None:
        """The reply's grammar, over a vocabulary view built once per loaded model."""
        if sampling.grammar is None:
            return None
        if self._lltokenizer is None:
            self._lltokenizer = self._loaded.tokenizer.grammar_tokenizer(sorted(self._eog))
        return Constraint(self._lltokenizer, sampling.grammar, self.info.n_vocab)

    # -- tokens ---------------------------------------------------------------------------

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return self._require_loaded().tokenizer.tokenize(text, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._require_loaded().tokenizer.detokenize(tokens)

    def _require_loaded(self) -> LoadedModel:
        if self._loaded is None:
            raise EngineError("No model is loaded.")
        return self._loaded

    # -- SlotEngine hooks: one mlx-lm prompt cache per slot ---------------------------------

    def _new_slot(self) -> _Slot:
        return _Slot(cache=make_prompt_cache(self._loaded.model))

    def _trim(self, slot: _Slot, keep: int) -> int:
        if keep and self._trimmable:
            keep = len(slot.tokens) - trim_prompt_cache(slot.cache, len(slot.tokens) - keep)
        else:
            keep = 0
        if not keep:
            slot.cache = make_prompt_cache(self._loaded.model)
        slot.logits = None
        if slot.hidden is not None:
            slot.hidden.cut(keep)
        return keep

    def _has_logits(self, slot: _Slot) -> bool:
        return slot.logits is not None

    def _serialize(self, name: str, slot: _Slot) -> bytes | None:
        buffer = io.BytesIO()
        try:
            save_prompt_cache(buffer, compact_cache(slot.cache), {"engine": self.backend_name})
        except (ValueError, AttributeError, TypeError) as exc:  # a cache mlx-lm cannot save
            logger.warning("no snapshot for %s: %s", name, exc)
            return None
        return buffer.getvalue()

    def _deserialize(self, payload: bytes, n_tokens: int) -> list[Any] | None:
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

    def _install(self, slot: _Slot, cache: list[Any]) -> bool:
        slot.cache = cache
        return True

    def _forward(self, slot: _Slot, chunk: list[int], *, want_logits: bool) -> None:
        """Evaluate `chunk` into the slot's cache. The vocabulary projection is computed only
        for the last token, and only when its logits are wanted (MLX is lazy: a prefix
        chunk's logits that are never read are never computed)."""
        try:
            head = chunk[:-1] if want_logits else chunk
            if head:
                self._call(slot, mx.array(head), len(slot.tokens))
                mx.eval([c.state for c in slot.cache])
            if want_logits:
                at = len(slot.tokens) + len(head)
                logits = self._call(slot, mx.array(chunk[-1:]), at)[0, -1]
                mx.eval(logits, [c.state for c in slot.cache])
        except (RuntimeError, ValueError, MemoryError) as exc:
            self._clear(slot)
            raise EngineError(f"MLX failed to evaluate the prompt: {exc}") from exc
        slot.tokens.extend(chunk)
        slot.logits = logits if want_logits else None

    def _verify(self, slot: _Slot, chunk: list[int]) -> np.ndarray:
        """All positions' logits: the model call returns them (the projection is computed for
        every token of the chunk, which is the point)."""
        try:
            logits = self._call(slot, mx.array(chunk), len(slot.tokens))[0]
            mx.eval(logits, [c.state for c in slot.cache])
        except (RuntimeError, ValueError, MemoryError) as exc:
            self._clear(slot)
            raise EngineError(f"MLX failed to evaluate the reply: {exc}") from exc
        slot.tokens.extend(chunk)
        slot.logits = logits[-1]
        return np.array(logits.astype(mx.float32))

    def _call(self, slot: _Slot, tokens: mx.array, start: int) -> mx.array:
        """The model over `tokens` [L] at positions start.., into the slot's cache; the final
        hidden states recorded where an MTP drafter asked for them."""
        model = self._loaded.model
        logits = model(tokens[None], cache=slot.cache)
        if self._keep_hidden:
            rows = model.hidden[-self._keep_hidden :]
            if slot.hidden is None:
                slot.hidden = HiddenRows(self._keep_hidden)
            slot.hidden.record(start + tokens.shape[0] - rows.shape[0], rows, rows.shape[0])
        return logits

    def _open_drafters(self, options: LoadOptions, info: ModelInfo) -> None:
        """The shared drafters, and the model's own MTP head after prompt lookup where it
        has one (DeepSeek V4 from a GGUF with the NextN block) and the options allow it."""
        super()._open_drafters(options, info)
        model = self._loaded.model
        if not self._speculates or options.speculation not in ("auto", "mtp"):
            return
        if not getattr(model, "mtp", None):
            return
        from app.engine.mlx.deepseek_v4.mtp import MlxMtpHead

        drafter = MtpDrafter(self, MlxMtpHead(model), options.n_seq_max)
        lookup = [d for d in self._drafters if d.free]
        self._drafters[len(lookup) : len(lookup)] = [drafter]

    def _logits(self, slot: _Slot) -> np.ndarray:
        return np.array(slot.logits.astype(mx.float32))

    def _feed_ahead(self, slot: _Slot, sampled: mx.array) -> None:
        """Evaluate a sampled token before its value is read; the draw appends it to
        `slot.tokens` once it is known."""
        try:
            logits = self._call(slot, sampled.reshape(1), len(slot.tokens))[0, -1]
        except (RuntimeError, ValueError, MemoryError) as exc:
            self._clear(slot)
            raise EngineError(f"MLX failed to evaluate the reply: {exc}") from exc
        mx.async_eval(logits)
        slot.logits = logits

    def _text_stream(self) -> Callable[[int], str]:
        return self._loaded.tokenizer.stream().add

    def _draw(self, sampling: SamplingParams, prompt: Sequence[int]) -> _MlxDraw:
        return _MlxDraw(self, sampling)

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
