"""The llama.cpp engine, on llama-cpp-python's low-level API.

`Llama` hides what Stoke needs: several sequences in one context, trimming a sequence at
the point a new prompt diverges, prefill without sampling, and cancelling between tokens.
So this drives llama.cpp directly: one model, one context, one KV sequence per resident slot.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
from gguf import GGMLQuantizationType

from app.engine.kvstore import KVStore
from app.engine.llamacpp import cpu_buffers
from app.engine.llamacpp.overrides import apply_overrides
from app.engine.model_file import check_gguf, fingerprint
from app.engine.protocol import (
    CancelToken,
    ContextOverflowError,
    EngineError,
    FinishReason,
    GenerationEvent,
    GenerationStats,
    LoadOptions,
    ModelInfo,
    ModelLoadError,
    SamplingParams,
    TokenEvent,
)

_LOG_LINES = 200
KV_TYPES = {  # the KV cache element types llama.cpp accepts (the planner offers the same)
    name: int(GGMLQuantizationType[name.upper()])
    for name in ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
}
RESTORE_MIN_GAIN = 32  # tokens a snapshot or another sequence must add to be worth copying


class _LlamaLog:
    """Keeps llama.cpp's log in memory (quiet terminals, readable load errors)."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=_LOG_LINES)
        self._callback = llama_cpp.llama_log_callback(self._on_log)
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))

    def _on_log(self, level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        self.lines.append(text.decode("utf-8", "replace"))

    def reason(self) -> str:
        """The most telling recent error line, for a user-facing message."""
        for line in reversed(self.lines):
            lowered = line.lower()
            if any(word in lowered for word in ("error", "failed", "invalid", "not within")):
                return line.strip().removeprefix("llama_model_load: ").strip()
        return ""


_log: _LlamaLog | None = None


def _install_log() -> _LlamaLog:
    global _log
    if _log is None:
        llama_cpp.llama_backend_init()
        _log = _LlamaLog()
    return _log


@dataclass
class _Sequence:
    """One KV sequence of the context and the exact tokens it holds."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    saved: list[int] = field(default_factory=list)  # the tokens of its last snapshot


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Vocab:
    """A model's tokenizer, over llama.cpp's vocab (read-only, safe beside a running decode)."""

    def __init__(self, model: llama_cpp.llama_model_p, *, owns_model: bool = False) -> None:
        self.ptr = llama_cpp.llama_model_get_vocab(model)
        self._model = model if owns_model else None  # a vocab-only model is ours to free

    def __del__(self) -> None:
        if self._model:
            llama_cpp.llama_model_free(self._model)

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.ptr, data, len(data), buf, capacity, False, special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self.ptr, data, len(data), buf, capacity, False, special)
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one token; control tokens are rendered as their text."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def text(self, token: int) -> str:
        if token < 0:
            return ""
        return llama_cpp.llama_vocab_get_text(self.ptr, token).decode("utf-8", "replace")

    @property
    def n_tokens(self) -> int:
        return llama_cpp.llama_vocab_n_tokens(self.ptr)

    @property
    def bos(self) -> int:
        return llama_cpp.llama_vocab_bos(self.ptr)

    @property
    def eos(self) -> int:
        return llama_cpp.llama_vocab_eos(self.ptr)

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self.ptr))

    def eog_ids(self) -> frozenset[int]:
        """End-of-generation tokens (end of turn, eos), as llama.cpp classifies them."""
        return frozenset(
            t for t in range(self.n_tokens) if llama_cpp.llama_vocab_is_eog(self.ptr, t)
        )


def _load_model(path: Path, params: llama_cpp.llama_model_params) -> llama_cpp.llama_model_p:
    log = _install_log()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        reason = log.reason() or "llama.cpp could not read it"
        raise ModelLoadError(
            f"Could not load the model {path.name}: {reason}. The file may be truncated, "
            "damaged or of an architecture this llama.cpp does not know; download it again "
            "or choose another model."
        )
    return model


def load_vocab(model_path: str) -> Vocab:
    """Only the tokenizer of a GGUF (no weights): lets the app build prompts in-process."""
    path = check_gguf(model_path)
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = _load_model(path, params)
    return Vocab(model, owns_model=True)


class LlamaCppEngine:
    """Engine contract over llama.cpp. Not thread-safe: the engine host serialises calls."""

    backend_name = "llama.cpp"

    def __init__(self) -> None:
        self._model: llama_cpp.llama_model_p | None = None
        self._ctx: llama_cpp.llama_context_p | None = None
        self._vocab = None
        self._batch: llama_cpp.llama_batch | None = None
        self._options: LoadOptions | None = None
        self.info: ModelInfo | None = None
        self._slots: OrderedDict[str, _Sequence] = OrderedDict()  # least recently used first
        self._free_seq_ids: list[int] = []
        self._logits_ready: tuple[int, int] | None = None  # (seq_id, n_tokens) of last logits
        self._eog: frozenset[int] = frozenset()
        self._kv: KVStore | None = None
        self._partial_copies = True

    # -- loading --------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> ModelInfo:
        self.unload()
        path = check_gguf(options.model_path)
        mparams = cpu_buffers.model_params(options.cpu_buffers)  # this CPU's safe types
        mparams.n_gpu_layers = options.n_gpu_layers
        if options.overrides:
            mparams.use_extra_bufts = False  # host experts in a plain buffer, as planned
        keepalive = apply_overrides(
            mparams, options.overrides, tensor_split=options.tensor_split or None
        )
        model = _load_model(path, mparams)
        del keepalive  # llama.cpp has read the override patterns
        n_ctx_train = llama_cpp.llama_model_n_ctx_train(model)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = min(options.n_ctx, n_ctx_train) if n_ctx_train > 0 else options.n_ctx
        cparams.n_batch = options.n_batch
        cparams.n_ubatch = min(options.n_ubatch, options.n_batch)
        cparams.n_seq_max = options.n_seq_max
        cparams.kv_unified = True  # resident conversations share one pool of cells
        hybrid = llama_cpp.llama_model_is_hybrid(model)
        cparams.swa_full = options.swa_full if options.swa_full is not None else not hybrid
        if options.kv_type not in KV_TYPES:
            llama_cpp.llama_model_free(model)
            raise ModelLoadError(
                f"Unknown KV cache type {options.kv_type!r}: use one of {', '.join(KV_TYPES)}."
            )
        cparams.type_k = cparams.type_v = KV_TYPES[options.kv_type]
        cparams.offload_kqv = options.kv_offload
        threads = options.n_threads or max(os.cpu_count() or 1, 1)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        cparams.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if options.flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            llama_cpp.llama_model_free(model)
            reason = _install_log().reason() or "not enough memory for the context"
            raise ModelLoadError(
                f"Could not create a context of {cparams.n_ctx:,} tokens for {path.name}: "
                f"{reason}. Try a smaller context size."
            )
        self._model, self._ctx, self._options = model, ctx, options
        self._vocab = Vocab(model)
        # Hybrid and recurrent memories (deepseek4's compressor state) copy only whole
        # sequences; a partial seq_cp aborts the process.
        self._partial_copies = not (
            llama_cpp.llama_model_is_hybrid(model) or llama_cpp.llama_model_is_recurrent(model)
        )
        self._batch = llama_cpp.llama_batch_init(options.n_batch, 0, 1)
        self._free_seq_ids = list(range(options.n_seq_max))
        self._eog = self._vocab.eog_ids()
        self.info = self._describe(path, n_ctx_train, self._vocab.n_tokens)
        if options.snapshots:
            self._kv = KVStore(
                self.info.fingerprint,
                self.backend_name,
                ram_budget=options.kv_ram_budget,
                disk_budget=options.kv_disk_budget,
            )
        return self.info

    def _describe(self, path: Path, n_ctx_train: int, n_vocab: int) -> ModelInfo:
        template = llama_cpp.llama_model_chat_template(self._model, None)
        bos, eos = self._vocab.bos, self._vocab.eos
        return ModelInfo(
            path=str(path),
            name=self._meta("general.name") or path.stem,
            fingerprint=fingerprint(path),
            architecture=self._meta("general.architecture") or "unknown",
            n_ctx=llama_cpp.llama_n_ctx(self._ctx),
            n_ctx_train=n_ctx_train,
            n_vocab=n_vocab,
            chat_template=self._options.chat_template
            or (template.decode("utf-8", "replace") if template else None),
            bos_token=self._vocab.text(bos),
            eos_token=self._vocab.text(eos),
            add_bos=self._vocab.add_bos,
            bos_id=bos if bos >= 0 else None,
            eog_ids=tuple(sorted(self._eog)),
            backend=self.backend_name,
            size_bytes=path.stat().st_size,
        )

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def unload(self) -> None:
        """Free the model; resident conversations are snapshotted first (an app restart
        then restores them from disk instead of prefilling)."""
        if self._kv is not None:
            for name, seq in self._slots.items():
                self._save(name, seq)
            self._kv.close()
            self._kv = None
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
        if self._model:
            llama_cpp.llama_model_free(self._model)
        self._model = self._ctx = self._vocab = self._batch = None
        self._slots.clear()
        self._logits_ready = None
        self.info = None

    # -- tokens ---------------------------------------------------------------------------

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return self._require_vocab().tokenize(text, special=special)

    def token_bytes(self, token: int) -> bytes:
        return self._require_vocab().token_bytes(token)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._require_vocab().detokenize(tokens)

    def _require_vocab(self) -> Vocab:
        if self._vocab is None:
            raise EngineError("No model is loaded.")
        return self._vocab

    # -- slots: resident conversations, eviction, snapshots -----------------------------------

    def _slot(self, name: str) -> _Sequence:
        """The slot's sequence; a new slot takes a free id, evicting the least recently used."""
        seq = self._slots.get(name)
        if seq is None:
            if not self._free_seq_ids:
                self._evict(next(iter(self._slots)))
            seq = _Sequence(self._free_seq_ids.pop(0))
            self._slots[name] = seq
        self._slots.move_to_end(name)
        return seq

    def _evict(self, name: str) -> None:
        """Snapshot a resident conversation, then free its sequence."""
        seq = self._slots.pop(name)
        self._save(name, seq)
        self._clear(seq)
        self._free_seq_ids.append(seq.seq_id)

    def _clear(self, seq: _Sequence, keep: int = 0) -> int:
        """Drop the sequence's KV from position `keep` on; returns what was kept."""
        mem = llama_cpp.llama_get_memory(self._ctx)
        if keep and not llama_cpp.llama_memory_seq_rm(mem, seq.seq_id, keep, -1):
            keep = 0  # this model's memory cannot be cut mid-sequence: start over
        if not keep:
            llama_cpp.llama_memory_seq_rm(mem, seq.seq_id, -1, -1)
        del seq.tokens[keep:]
        if self._logits_ready and self._logits_ready[0] == seq.seq_id:
            self._logits_ready = None
        return keep

    def _make_room(self, seq: _Sequence, n_new: int) -> None:
        """Keep all resident tokens within the context's cells: evict others, oldest first."""
        budget = llama_cpp.llama_n_ctx(self._ctx)
        while sum(len(s.tokens) for s in self._slots.values()) + n_new > budget:
            others = [name for name, other in self._slots.items() if other is not seq]
            if not others:
                return
            self._evict(others[0])

    def _save(self, name: str, seq: _Sequence) -> int:
        if self._kv is None or not seq.tokens or seq.saved == seq.tokens:
            return 0
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq.seq_id)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, seq.seq_id)
        if n == 0:
            return 0
        self._kv.put(name, seq.tokens, memoryview(buf)[:n].tobytes())
        seq.saved = list(seq.tokens)
        return len(seq.tokens)

    def snapshot(self, slot: str, *, wait: bool = False) -> int:
        self._require_model()
        seq = self._slots.get(slot)
        saved = self._save(slot, seq) if seq is not None else 0
        if wait and self._kv is not None:
            self._kv.flush()
        return saved

    def _restore(self, seq: _Sequence, tokens: Sequence[int], live: int) -> bool:
        """Load the snapshot sharing the longest prefix with `tokens` when it beats the live
        KV by enough to pay for the copy. False when none does (or it failed its checks)."""
        match = self._kv.best(tokens) if self._kv is not None else None
        if match is None or match.common < live + RESTORE_MIN_GAIN:
            return False
        snap = self._kv.load(match)
        if snap is None:
            return False
        self._clear(seq)
        self._make_room(seq, len(snap.tokens))
        payload = ctypes.cast(ctypes.c_char_p(snap.payload), ctypes.POINTER(ctypes.c_uint8))
        size = len(snap.payload)
        if not llama_cpp.llama_state_seq_set_data(self._ctx, payload, size, seq.seq_id):
            self._clear(seq)
            return False
        seq.tokens = list(snap.tokens)
        return True

    def _share_live_prefix(self, seq: _Sequence, tokens: Sequence[int], own: int) -> int:
        """Copy the longest prefix another resident sequence holds (cells are shared, so
        this is nearly free); returns the prefix length now in `seq`."""
        if not self._partial_copies:
            return own
        best, donor = own, None
        for other in self._slots.values():
            common = _common_prefix(other.tokens, tokens)
            if other is not seq and common > best:
                best, donor = common, other
        if donor is None or best < own + RESTORE_MIN_GAIN:
            return own
        self._clear(seq)
        mem = llama_cpp.llama_get_memory(self._ctx)
        llama_cpp.llama_memory_seq_cp(mem, donor.seq_id, seq.seq_id, 0, best)
        seq.tokens = list(donor.tokens[:best])
        return best

    def resident_tokens(self, slot: str) -> list[int]:
        seq = self._slots.get(slot)
        return list(seq.tokens) if seq else []

    # -- prefill and generation -------------------------------------------------------------

    def _check_fits(self, n_prompt: int) -> None:
        n_ctx = llama_cpp.llama_n_ctx(self._ctx)
        if n_prompt >= n_ctx:
            raise ContextOverflowError(n_prompt, n_ctx)

    def _sync(
        self, seq: _Sequence, tokens: Sequence[int], cancel: CancelToken | None
    ) -> tuple[int, int, int]:
        """Make the sequence hold exactly `tokens` with the last token's logits ready.

        The longest prefix wins among the sequence itself, the other resident sequences and
        the RAM and disk snapshots; what diverges is trimmed and only the tail evaluated.
        Returns (reused, restored, prefilled)."""
        if not tokens:
            return 0, 0, 0
        own = _common_prefix(seq.tokens, tokens)
        if own == len(tokens) == len(seq.tokens) and self._logits_ready == (
            seq.seq_id,
            len(tokens),
        ):
            return own, 0, 0
        live = self._share_live_prefix(seq, tokens, own)
        restored = self._restore(seq, tokens, live)
        keep = min(_common_prefix(seq.tokens, tokens), len(tokens) - 1)  # last one gives logits
        keep = self._clear(seq, keep) if keep < len(seq.tokens) else keep
        tail = list(tokens[keep:])
        self._make_room(seq, len(tail))
        n_batch = self._options.n_batch if self._options else 512
        for start in range(0, len(tail), n_batch):
            if cancel is not None and cancel.cancelled:
                break
            chunk = tail[start : start + n_batch]
            self._decode(seq, chunk, want_logits=start + len(chunk) == len(tail))
        return keep, keep if restored else 0, len(seq.tokens) - keep

    def _decode(self, seq: _Sequence, chunk: Sequence[int], *, want_logits: bool) -> None:
        batch = self._batch
        pos = len(seq.tokens)
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq.seq_id
            batch.logits[i] = 0
        batch.logits[len(chunk) - 1] = 1 if want_logits else 0
        batch.n_tokens = len(chunk)
        rc = llama_cpp.llama_decode(self._ctx, batch)
        if rc != 0:
            self._logits_ready = None
            if rc == 1:
                raise ContextOverflowError(pos + len(chunk), llama_cpp.llama_n_ctx(self._ctx))
            raise EngineError(f"llama.cpp failed to evaluate the prompt (code {rc}).")
        seq.tokens.extend(chunk)
        self._logits_ready = (seq.seq_id, len(seq.tokens)) if want_logits else None

    def prefill(
        self, tokens: Sequence[int], *, slot: str = "default", cancel: CancelToken | None = None
    ) -> GenerationStats:
        self._require_model()
        self._check_fits(len(tokens))
        start = time.perf_counter()
        seq = self._slot(slot)
        reused, restored, prefilled = self._sync(seq, tokens, cancel)
        elapsed = time.perf_counter() - start
        done = len(seq.tokens) == len(tokens)
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
        self._require_model()
        if not tokens:
            raise EngineError("Nothing to reply to: the prompt is empty.")
        self._check_fits(len(tokens))
        start = time.perf_counter()
        seq = self._slot(slot)
        reused, restored, prefilled = self._sync(seq, tokens, cancel)
        prefill_s = time.perf_counter() - start
        n_ctx = llama_cpp.llama_n_ctx(self._ctx)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        sampler = self._sampler(sampling, tokens)
        generated = 0
        first_at = last_at = None
        reason = FinishReason.LENGTH
        try:
            while True:
                if (cancel is not None and cancel.cancelled) or len(seq.tokens) < len(tokens):
                    reason = FinishReason.CANCELLED
                    break
                if generated >= max_tokens:
                    break
                token = llama_cpp.llama_sampler_sample(sampler, self._ctx, -1)
                last_at = time.perf_counter()
                first_at = first_at or last_at
                if token in self._eog:
                    reason = FinishReason.STOP
                    break
                generated += 1
                yield TokenEvent(token, decoder.decode(self.token_bytes(token)))
                if generated >= max_tokens or len(seq.tokens) + 1 >= n_ctx:
                    break
                self._decode(seq, [token], want_logits=True)
        finally:
            llama_cpp.llama_sampler_free(sampler)
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

    def _sampler(
        self, sampling: SamplingParams, prompt: Sequence[int]
    ) -> llama_cpp.llama_sampler_p:
        """The sampler chain: logit bias and penalties first (on every logit, greedy too),
        then the truncations, temperature and the draw. The penalties see the prompt's last
        tokens, as llama-server's do, and each sampled token as the chain accepts it."""
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        n_vocab = self.info.n_vocab
        if sampling.logit_bias:
            biases = (llama_cpp.llama_logit_bias * len(sampling.logit_bias))(
                *(llama_cpp.llama_logit_bias(token, bias) for token, bias in sampling.logit_bias)
            )
            llama_cpp.llama_sampler_chain_add(
                chain, llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), biases)
            )
        if sampling.penalized:
            penalties = llama_cpp.llama_sampler_init_penalties(
                n_vocab,
                sampling.penalty_last_n,
                sampling.repeat_penalty,
                sampling.frequency_penalty,
                sampling.presence_penalty,
            )
            for token in prompt[-sampling.penalty_last_n :]:
                llama_cpp.llama_sampler_accept(penalties, token)
            llama_cpp.llama_sampler_chain_add(chain, penalties)
        if sampling.temperature <= 0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
            return chain
        if sampling.top_k > 0:
            llama_cpp.llama_sampler_chain_add(
                chain, llama_cpp.llama_sampler_init_top_k(sampling.top_k)
            )
        if sampling.top_p < 1.0:
            llama_cpp.llama_sampler_chain_add(
                chain, llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1)
            )
        if sampling.min_p > 0.0:
            llama_cpp.llama_sampler_chain_add(
                chain, llama_cpp.llama_sampler_init_min_p(sampling.min_p, 1)
            )
        llama_cpp.llama_sampler_chain_add(
            chain, llama_cpp.llama_sampler_init_temp(sampling.temperature)
        )
        seed = llama_cpp.LLAMA_DEFAULT_SEED if sampling.seed is None else sampling.seed & 0xFFFFFFFF
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))
        return chain

    def _require_model(self) -> None:
        if self._ctx is None:
            raise EngineError("No model is loaded.")
