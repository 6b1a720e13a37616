"""The llama.cpp engine, on llama-cpp-python's low-level API.

`Llama` hides what Stoke needs: several sequences in one context, trimming a sequence at
the point a new prompt diverges, prefill without sampling, and cancelling between tokens.
So this drives llama.cpp directly: one model, one context, one KV sequence per resident slot,
each in a KV stream of its own (`kv_unified` false: a prefill then attends over its own
conversation's cells, not every resident's) unless the options ask for one shared pool.
The slot policy (eviction, snapshots, prefix sync, the generate loop) is `SlotEngine`'s; this
module supplies llama.cpp's hooks, the tokenizer and the load parameters. Native handles
belong to the owners in `handles.py`.
"""

from __future__ import annotations

import codecs
import ctypes
import logging
import os
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import llama_cpp
import llguidance
import numpy as np
from gguf import GGMLQuantizationType
from llama_cpp import mtmd_cpp as mtmd

from app import paths
from app.engine import kvstore
from app.engine.chat_template import builtin_template
from app.engine.constraint import Constraint, tokenizer_from_vocab
from app.engine.gguf_info import inspect_gguf
from app.engine.images import find_projector, has_images, is_image, no_vision, open_picture
from app.engine.llamacpp import cpu_buffers, rpc
from app.engine.llamacpp.embeddings import Embedder
from app.engine.llamacpp.handles import LlamaBatch, LlamaContext, LlamaModel, LlamaSampler
from app.engine.llamacpp.mtp import LlamaMtpHead, hidden_rows, nextn_api
from app.engine.llamacpp.overrides import apply_overrides
from app.engine.llamacpp.vision import Vision
from app.engine.logprobs import NO_SCORES, Scores, scores
from app.engine.model_file import check_gguf, fingerprint
from app.engine.mtp import HiddenRows, MtpDrafter
from app.engine.protocol import (
    ContextOverflowError,
    EngineError,
    LoadOptions,
    ModelInfo,
    ModelLoadError,
    SamplingParams,
    check_context,
)
from app.engine.runtime import Slot
from app.engine.safe_mode import is_conservative
from app.engine.slots import SlotEngine
from app.engine.speculate import MAX_DRAFT

logger = logging.getLogger("stoke.engine.llamacpp")

_LOG_LINES = 200
KV_TYPES = {  # the KV cache element types llama.cpp accepts (the planner offers the same)
    name: int(GGMLQuantizationType[name.upper()])
    for name in ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
}
# Recurrent-state snapshots a hybrid memory (deepseek4's compressors) keeps per sequence, so
# refused drafts can be cut after a verify: the longest draft, its pending token and one more.
ROLLBACK = max(MAX_DRAFT.values()) + 2


class _LlamaLog:
    """Keeps llama.cpp's log in memory (quiet terminals, readable load errors)."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=_LOG_LINES)
        self._callback = llama_cpp.llama_log_callback(self._on_log)
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))
        mtmd.mtmd_log_set(self._callback, ctypes.c_void_p(0))  # the vision projector's
        mtmd.mtmd_helper_log_set(self._callback, ctypes.c_void_p(0))

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


@dataclass(kw_only=True)
class _Sequence(Slot):
    """One KV sequence of the shared context."""

    seq_id: int
    hidden: HiddenRows | None = None  # the last positions' hidden states, for an MTP head
    rollback: int = 0  # positions a hybrid memory can be cut back by (see `_trim`)


class Vocab:
    """A model's tokenizer, over llama.cpp's vocab (read-only, safe beside a running decode)."""

    def __init__(self, model: llama_cpp.llama_model_p, *, owner: LlamaModel | None = None) -> None:
        self.ptr = llama_cpp.llama_model_get_vocab(model)
        self._owner = owner  # a vocab-only model lives as long as its vocab

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

    def control_ids(self) -> list[int]:
        """Control tokens, which a grammar's plain text must never match."""
        control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
        return [
            t for t in range(self.n_tokens) if llama_cpp.llama_vocab_get_attr(self.ptr, t) & control
        ]


def _load_model(path: Path, params: llama_cpp.llama_model_params) -> LlamaModel:
    log = _install_log()
    model = LlamaModel.load(path, params)
    if model is None:
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
    return Vocab(model.ptr, owner=model)


def window(options: LoadOptions, n_ctx_train: int) -> int:
    """One conversation's context: what the options ask for, within what the model was
    trained on."""
    return min(options.n_ctx, n_ctx_train) if n_ctx_train > 0 else options.n_ctx


def keeps_own_streams(model: llama_cpp.llama_model_p) -> bool:
    """Hybrid and recurrent memories (deepseek4's) keep a stream per sequence whatever the
    layout asked for: they get the shared layout their memory was measured in."""
    return bool(llama_cpp.llama_model_is_hybrid(model) or llama_cpp.llama_model_is_recurrent(model))


# A speculative context's K element type in place of f16/f32 (`exact_attention`); only K's
# type picks the attention's path (V's is `exact_v_type`).
EXACT_K = {"f16": "q8_0", "f32": "q8_0"}


def exact_attention(options: LoadOptions, model: LlamaModel) -> bool:
    """Whether a context gets the attention whose verify batches equal one-token decodes bit
    for bit on a CPU, as a speculative one does (flash attention over a quantized K):
    without flash attention ggml hands the attention matmuls of two tokens or more, never of
    one, to llamafile's sgemm, and with it a one-token decode over an f16 or f32 K of 512
    cells or more splits the cells across threads, while a batch takes each row whole; a
    quantized K takes every row whole. Measured on the default model at 1,000 tokens: the
    first way, verify logits up to 1.21 off a decode's and the K/V written moving the next
    decode's by 0.81; the second, 1.35 and 0.79; with a q8_0 K (V f16 or q8_0), 0 and 0.
    V's type only sets the speed, and which is faster depends on the CPU: on an AMD EPYC a
    q8_0 V (dequantized row by row) made each decode 10-18% slower than the default context
    at 500 to 3,500 tokens and an f16 V 2-9% faster, on an Intel Xeon the other way round; so
    on a CPU it is this machine's measured verdict (`exact_v_type`). Not in safe mode (no
    flash attention there), nor for hybrid memories. A split over other devices gets it too,
    so that its replies stay those of the same model on one machine."""
    return (
        (options.speculation != "off" or options.exact_batches)
        and not is_conservative(options)
        and not keeps_own_streams(model.ptr)
    )


def all_on_cpu(options: LoadOptions) -> bool:
    """Whether every layer runs on this machine's CPU (no GPU, no remote device)."""
    return options.n_gpu_layers == 0 and not options.rpc_servers and not options.devices


def exact_v_type(options: LoadOptions) -> str:
    """The exact attention's V type for `options`' own (f16 or f32): on a CPU the faster one
    there (the machine verdict's `exact_v`), elsewhere the type asked for."""
    if options.kv_type in EXACT_K and all_on_cpu(options):
        return cpu_buffers.machine_verdict().exact_v
    return options.kv_type


def snapshot_folder(info: ModelInfo, cparams: llama_cpp.llama_context_params) -> Path:
    """Where this context's snapshots live: a folder per KV layout beside the model's others.

    A sequence's state holds its K and V in the context's element types (V transposed
    without flash attention) and installs only into a context of the same layout, while
    snapshots are matched by tokens alone: with one folder, a conversation held before a
    switch of plan (a CPU context's V type is this machine's verdict, a split's is f16) or of
    `kv_type` could match in place of the conversation's own, then fail to install. Files
    from before layouts had folders (their layout unknown) are removed, so none lingers
    outside every store's disk budget."""
    names = {number: name for name, number in KV_TYPES.items()}
    flash = cparams.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    model_dir = paths.kv_dir(info.fingerprint)
    for stale in model_dir.iterdir():
        if stale.suffix in (kvstore.SUFFIX, kvstore.TMP_SUFFIX) and stale.is_file():
            stale.unlink(missing_ok=True)
    layout = f"{names[cparams.type_k]}-{names[cparams.type_v]}-{'fa' if flash else 'nofa'}"
    return model_dir / f"llama.cpp-{layout}"


def verifies_exactly(options: LoadOptions, model: LlamaModel, path: Path) -> bool:
    """Whether verify rows can be trusted whole (`speculate.py`): the exact attention with
    every layer on this CPU (GPU kernels and remote devices were not measured) and no
    matmul over 16- or 32-bit weights (`float_matmuls`)."""
    return exact_attention(options, model) and all_on_cpu(options) and not float_matmuls(path)


def float_matmuls(path: Path) -> bool:
    """Whether any matrix the model multiplies by is F32, F16 or BF16: llamafile's sgemm
    takes those in a batch and ggml's own dot products in a one-token decode, which round
    differently (the default model's BF16 and F16 copies: verify logits up to 0.29 and 0.14
    off a decode's; its Q4_1, Q8_0 and Q4_0: 0). The token embedding counts only when it is
    also the output matrix (no `output.weight`); 1-D tensors are norms and biases."""
    tensors = inspect_gguf(path).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    return any(
        len(t.shape) > 1
        and t.ggml_type in ("F32", "F16", "BF16")
        and (tied or t.name != "token_embd.weight")
        for t in tensors
    )


def exact_context(options: LoadOptions) -> LoadOptions:
    """The options, speculation off, whose context a speculative load of `options` gets on a
    CPU: the plain decoding its replies equal token for token (`exact_attention`)."""
    return replace(options, speculation="off", exact_batches=True)


def _context_params(
    options: LoadOptions, model: LlamaModel, n_ctx_train: int
) -> llama_cpp.llama_context_params:
    """The context the options ask for: a stream of one window per resident conversation
    (llama.cpp splits n_ctx evenly between them), or one pool they share."""
    cparams = llama_cpp.llama_context_default_params()
    size = window(options, n_ctx_train)
    if keeps_own_streams(model.ptr):
        cparams.kv_unified, cparams.n_ctx = True, size
    elif options.kv_unified:
        cparams.kv_unified, cparams.n_ctx = True, options.n_ctx
    else:
        cparams.kv_unified, cparams.n_ctx = False, size * options.n_seq_max
    cparams.n_batch = options.n_batch
    cparams.n_ubatch = min(options.n_ubatch, options.n_batch)
    cparams.n_seq_max = options.n_seq_max
    hybrid = llama_cpp.llama_model_is_hybrid(model.ptr)
    cparams.swa_full = options.swa_full if options.swa_full is not None else not hybrid
    if options.kv_type not in KV_TYPES:
        raise ModelLoadError(
            f"Unknown KV cache type {options.kv_type!r}: use one of {', '.join(KV_TYPES)}."
        )
    exact = exact_attention(options, model)
    k_type = EXACT_K.get(options.kv_type, options.kv_type) if exact else options.kv_type
    v_type = exact_v_type(options) if exact else options.kv_type
    cparams.type_k, cparams.type_v = KV_TYPES[k_type], KV_TYPES[v_type]
    cparams.offload_kqv = options.kv_offload
    threads = options.n_threads or max(os.cpu_count() or 1, 1)
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.no_perf = True
    cparams.flash_attn_type = (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if options.flash_attn or exact
        else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    return cparams


class _LlamaDraw:
    """One reply's sampler chain: llama.cpp samples from the context's last logits, and a
    kept token is decoded after it has been handed out."""

    def __init__(
        self,
        chain: LlamaSampler,
        ctx: LlamaContext,
        n_vocab: int,
        constraint: Constraint | None = None,
        n_top: int | None = None,  # logprobs asked for, with this many alternatives
    ) -> None:
        self._chain, self._ctx = chain, ctx
        self._n_vocab, self._constraint, self._n_top = n_vocab, constraint, n_top
        self._scores: Scores = NO_SCORES

    def next(self, seq: _Sequence, last: bool) -> int:
        if self._constraint is None and self._n_top is None:
            return self._chain.sample(self._ctx)
        pointer = llama_cpp.llama_get_logits_ith(self._ctx.ptr, -1)
        logits = np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))
        if self._constraint is not None:
            self._constraint.mask_in_place(logits)  # in place: the chain samples from these
        token = self._chain.sample(self._ctx)
        if self._constraint is not None:
            self._constraint.accept(token)
        if self._n_top is not None:
            self._scores = scores(logits, token, self._n_top)
        return token

    def scores(self) -> Scores:
        return self._scores

    def take_back(self, seq: _Sequence) -> None:
        """Nothing to undo: a drawn token is evaluated only once it is kept."""

    def close(self) -> None:
        self._chain.close()


class LlamaCppEngine(SlotEngine[_Sequence]):
    """Engine contract over llama.cpp. Not thread-safe: the engine host serialises calls."""

    backend_name = "llama.cpp"

    def __init__(self) -> None:
        super().__init__()
        self._model: LlamaModel | None = None
        self._ctx: LlamaContext | None = None
        self._batch: LlamaBatch | None = None
        self._vocab: Vocab | None = None
        self._free_seq_ids: list[int] = []
        self._logits_ready: tuple[int, int] | None = None  # (seq_id, n_tokens) of last logits
        self._lltokenizer: llguidance.LLTokenizer | None = None  # for grammars, once asked
        self._keep_hidden = 0  # hidden states kept per slot (an MTP drafter asks for them)
        self._nextn = None  # llama.cpp's hidden-state calls, once an MTP head is open
        self._cparams: llama_cpp.llama_context_params | None = None
        self._rollback = 0  # the context's n_rs_seq
        self._embedder: Embedder | None = None  # the embedding context, once asked
        self._vision: Vision | None = None  # the model's projector, when it has one

    # -- loading --------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> ModelInfo:
        self.unload()
        check_context(options)
        path = check_gguf(options.model_path)
        mparams = cpu_buffers.model_params(options.cpu_buffers)  # this CPU's safe types
        mparams.n_gpu_layers = options.n_gpu_layers
        # Only when asked: measured on the scaled deepseek4 file (app/bench/mtp_decode.py), MTP
        # decode with rollback snapshots ran at a tenth of plain decode's speed on llama.cpp.
        mtp = options.speculation == "mtp"
        mparams.load_mtp = mtp  # where the GGUF has one
        if options.overrides:
            mparams.use_extra_bufts = False  # host experts in a plain buffer, as planned
        remote = rpc.connect(options.rpc_servers)  # raises ModelLoadError in words
        try:
            keepalive = apply_overrides(
                mparams,
                options.overrides,
                tensor_split=options.tensor_split or None,
                devices=options.devices,
                remote=remote,
            )
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        with ExitStack() as stack:  # a failure on the way frees what was made so far
            stack.callback(self._close_runtime)
            model = stack.enter_context(_load_model(path, mparams))
            del keepalive  # llama.cpp has read the override patterns
            n_ctx_train = llama_cpp.llama_model_n_ctx_train(model.ptr)
            cparams = _context_params(options, model, n_ctx_train)
            if mtp:
                cparams.n_rs_seq = ROLLBACK  # ignored by models whose memory cuts anywhere
            ctx = LlamaContext.create(model, cparams)
            if ctx is None:
                reason = _install_log().reason() or "not enough memory for the context"
                raise ModelLoadError(
                    f"Could not create a context of {cparams.n_ctx:,} tokens for {path.name}: "
                    f"{reason}. Try a smaller context size or fewer conversations kept loaded."
                )
            stack.enter_context(ctx)
            # llama.cpp caps a batch at the context asked for (n_ctx 300 in one stream: 300)
            # and aborts the process on a longer one, so prefill chunks keep to its cap.
            options = replace(
                options, n_batch=min(options.n_batch, llama_cpp.llama_n_batch(ctx.ptr))
            )
            batch = stack.enter_context(LlamaBatch(options.n_batch))
            self._model, self._ctx, self._batch, self._options = model, ctx, batch, options
            self._verify_exact = verifies_exactly(options, model, path)
            self._vocab = Vocab(model.ptr)
            if cparams.kv_unified:
                self._pool = llama_cpp.llama_n_ctx(ctx.ptr)
                self._n_ctx = min(self._pool, window(options, n_ctx_train))
            else:
                self._pool, self._n_ctx = 0, llama_cpp.llama_n_ctx_seq(ctx.ptr)
            # Hybrid and recurrent memories (deepseek4's compressor state) copy only whole
            # sequences; a partial seq_cp aborts the process.
            self._copies_prefixes = not keeps_own_streams(model.ptr)
            # refused drafts need a cut anywhere, or within a hybrid's rollback snapshots
            self._rollback = llama_cpp.llama_n_rs_seq(ctx.ptr)
            self._speculates = self._copies_prefixes or self._rollback > 0
            self._cparams = cparams
            self._free_seq_ids = list(range(options.n_seq_max))
            self._eog = self._vocab.eog_ids()
            projector = Path(options.mmproj) if options.mmproj else find_projector(path)
            if projector is not None:
                self._vision = Vision(
                    projector, model.ptr, cparams.n_threads, use_gpu=not all_on_cpu(options)
                )
            info = self._describe(path, n_ctx_train, self._vocab.n_tokens)
            self._open_drafters(options, info)
            if options.snapshots:
                self._open_store(options, info.fingerprint, snapshot_folder(info, cparams))
            stack.pop_all()
        self.info = info
        return info

    def _describe(self, path: Path, n_ctx_train: int, n_vocab: int) -> ModelInfo:
        template = llama_cpp.llama_model_chat_template(self._model.ptr, None)
        bos, eos = self._vocab.bos, self._vocab.eos
        name = self._meta("general.name") or path.stem
        architecture = self._meta("general.architecture") or "unknown"
        return ModelInfo(
            path=str(path),
            name=name,
            fingerprint=fingerprint(path),
            architecture=architecture,
            n_ctx=self._n_ctx,
            n_ctx_train=n_ctx_train,
            n_vocab=n_vocab,
            chat_template=self._options.chat_template
            or (template.decode("utf-8", "replace") if template else None)
            or builtin_template(architecture, f"{name} {path.name}"),
            bos_token=self._vocab.text(bos),
            eos_token=self._vocab.text(eos),
            add_bos=self._vocab.add_bos,
            bos_id=bos if bos >= 0 else None,
            eog_ids=tuple(sorted(self._eog)),
            backend=self.backend_name,
            size_bytes=path.stat().st_size,
            projector=str(self._vision.path) if self._vision is not None else None,
        )

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = llama_cpp.llama_model_meta_val_str(self._model.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One L2-normalised vector per input's tokens (embeddings.py), from a small context
        made on first use and kept until the model unloads."""
        if self._model is None:
            raise EngineError("No model is loaded.")
        if self._embedder is None:
            self._embedder = Embedder(self._model, self._cparams.n_threads)
        return self._embedder.embed(inputs)

    def image_run(self, data: bytes) -> list[int]:
        """The ids a prompt holds for an image (engine/images.py), registered for decoding."""
        if self._vision is None:
            raise EngineError(no_vision(self.info))
        return self._vision.run(open_picture(data))

    def _close_runtime(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._vision is not None:
            self._vision.close()
            self._vision = None
        for handle in (self._batch, self._ctx, self._model):
            if handle is not None:
                handle.close()
        self._model = self._ctx = self._vocab = self._batch = None
        self._logits_ready = None
        self._nextn = self._cparams = None
        self._lltokenizer = None

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

    # -- SlotEngine hooks: sequences of the shared context ----------------------------------

    def _new_slot(self) -> _Sequence:
        return _Sequence(seq_id=self._free_seq_ids.pop(0))

    def _release(self, seq: _Sequence) -> None:
        self._clear(seq)
        self._free_seq_ids.append(seq.seq_id)

    def _trim(self, seq: _Sequence, keep: int) -> int:
        mem = llama_cpp.llama_get_memory(self._ctx.ptr)
        # A hybrid memory's rollback snapshots are of the last forward's tokens only (an older
        # position would get the state of that forward's start), and serve one cut.
        reachable = self._copies_prefixes or len(seq.tokens) - keep <= seq.rollback
        seq.rollback = 0
        if keep and not (reachable and llama_cpp.llama_memory_seq_rm(mem, seq.seq_id, keep, -1)):
            keep = 0  # this model's memory cannot be cut there: start over
        if not keep:
            llama_cpp.llama_memory_seq_rm(mem, seq.seq_id, -1, -1)
        if self._logits_ready and self._logits_ready[0] == seq.seq_id:
            self._logits_ready = None
        if seq.hidden is not None:
            seq.hidden.cut(keep)
        return keep

    def _has_logits(self, seq: _Sequence) -> bool:
        return self._logits_ready == (seq.seq_id, len(seq.tokens))

    def _serialize(self, name: str, seq: _Sequence) -> bytes | None:
        size = llama_cpp.llama_state_seq_get_size(self._ctx.ptr, seq.seq_id)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(self._ctx.ptr, buf, size, seq.seq_id)
        return memoryview(buf)[:n].tobytes() if n else None

    def _deserialize(self, payload: bytes, n_tokens: int) -> bytes:
        return payload  # llama.cpp reads it into the sequence itself (`_install`)

    def _install(self, seq: _Sequence, payload: bytes) -> bool:
        data = ctypes.cast(ctypes.c_char_p(payload), ctypes.POINTER(ctypes.c_uint8))
        return bool(
            llama_cpp.llama_state_seq_set_data(self._ctx.ptr, data, len(payload), seq.seq_id)
        )

    def _copy_prefix(self, donor: _Sequence, seq: _Sequence, n: int) -> bool:
        mem = llama_cpp.llama_get_memory(self._ctx.ptr)
        if self._pool:  # one pool: the sequences share the prefix's cells
            llama_cpp.llama_memory_seq_cp(mem, donor.seq_id, seq.seq_id, 0, n)
            return True
        # Between streams llama.cpp copies only whole streams, and only at the next decode
        # (a snapshot installed before then would be overwritten): copy the donor's state.
        payload = self._serialize("", donor)
        if payload is None or not self._install(seq, payload):
            self._trim(seq, 0)
            return False
        return bool(llama_cpp.llama_memory_seq_rm(mem, seq.seq_id, n, -1))

    def _forward(
        self, seq: _Sequence, chunk: Sequence[int], *, want_logits: bool, every: bool = False
    ) -> None:
        """Decode `chunk`; the logits of its last token when wanted, of all with `every`.
        An image's run in it (engine/images.py) goes through the projector's embeddings."""
        if self._vision is not None and has_images(chunk):
            self._forward_with_images(seq, chunk, want_logits=want_logits)
            return
        batch = self._batch.ptr
        pos = len(seq.tokens)
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq.seq_id
            batch.logits[i] = 1 if every else 0
        batch.logits[len(chunk) - 1] = 1 if want_logits else 0
        batch.n_tokens = len(chunk)
        rc = llama_cpp.llama_decode(self._ctx.ptr, batch)
        if rc != 0:
            self._logits_ready = None
            if rc == 1:
                raise ContextOverflowError(pos + len(chunk), self._n_ctx)
            raise EngineError(f"llama.cpp failed to evaluate the prompt (code {rc}).")
        seq.tokens.extend(chunk)
        seq.rollback = min(len(chunk), self._rollback)
        self._logits_ready = (seq.seq_id, len(seq.tokens)) if want_logits else None
        if self._keep_hidden and self._nextn is not None:
            width = llama_cpp.llama_model_n_embd_out(self._model.ptr)
            rows = hidden_rows(self._nextn, self._ctx, len(chunk), width, self._keep_hidden)
            if seq.hidden is None:
                seq.hidden = HiddenRows(self._keep_hidden)
            seq.hidden.record(len(seq.tokens) - len(rows), rows, len(rows))

    def _forward_with_images(
        self, seq: _Sequence, chunk: Sequence[int], *, want_logits: bool
    ) -> None:
        """`chunk` as its text pieces and whole image runs, in order."""
        i = 0
        while i < len(chunk):
            if is_image(chunk[i]):
                n = self._vision.n_tokens(chunk[i])
                if list(chunk[i : i + n]) != [chunk[i]] * n:
                    raise EngineError("The prompt cuts an image short; send the image whole.")
                self._vision.decode(
                    self._ctx.ptr, chunk[i], len(seq.tokens), seq.seq_id, self._options.n_batch
                )
                seq.tokens.extend(chunk[i : i + n])
                seq.rollback = 0
                self._logits_ready = None
                i += n
                continue
            end = i
            while end < len(chunk) and not is_image(chunk[end]):
                end += 1
            self._forward(seq, chunk[i:end], want_logits=want_logits and end == len(chunk))
            i = end

    def _open_drafters(self, options: LoadOptions, info: ModelInfo) -> None:
        """The shared drafters, and the model's own MTP head when the GGUF carries one
        (`load_mtp` loaded it) and the options ask for "mtp" ("auto" does not, see `load`)."""
        super()._open_drafters(options, info)
        if not self._speculates or options.speculation != "mtp":
            return
        if llama_cpp.llama_model_n_layer_nextn(self._model.ptr) <= 0:
            return
        api = nextn_api()
        arch = info.architecture
        window = int(self._meta(f"{arch}.attention.sliding_window") or 0)
        # llama.cpp 0.3.36 divides by zero (SIGFPE) making the MTP context of a DeepSeek whose
        # head is as wide as its indexer's (a Hadamard rotation for an empty cache)
        widths = {self._meta(f"{arch}.attention.{k}") for k in ("key_length", "indexer.key_length")}
        head = None
        if api is not None and window > 0 and len(widths) == 2:
            head = LlamaMtpHead.open(api, self._model, self._cparams, window)
        if head is None:
            logger.warning("no MTP drafter: %s", _install_log().reason() or "not supported")
            return
        api.set(self._ctx.ptr, True, False)  # the target hands out every token's state
        self._nextn = api
        drafter = MtpDrafter(self, head, self._cparams.n_seq_max)
        lookup = [d for d in self._drafters if d.free]
        self._drafters[len(lookup) : len(lookup)] = [drafter]

    def _verify(self, seq: _Sequence, chunk: list[int]) -> np.ndarray:
        self._forward(seq, chunk, want_logits=True, every=True)
        pointer = llama_cpp.llama_get_logits(self._ctx.ptr)
        n_vocab = self.info.n_vocab
        return np.ctypeslib.as_array(pointer, shape=(len(chunk), n_vocab)).copy()

    def _logits(self, seq: _Sequence) -> np.ndarray:
        pointer = llama_cpp.llama_get_logits_ith(self._ctx.ptr, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.info.n_vocab,)).copy()

    def _text_stream(self) -> Callable[[int], str]:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        return lambda token: decoder.decode(self.token_bytes(token))

    def _draw(self, sampling: SamplingParams, prompt: Sequence[int]) -> _LlamaDraw:
        n_vocab = self.info.n_vocab
        constraint = None
        if sampling.grammar is not None:
            constraint = Constraint(self._grammar_tokenizer(), sampling.grammar, n_vocab)
        chain = self._sampler(sampling, prompt)
        return _LlamaDraw(chain, self._ctx, n_vocab, constraint, sampling.logprobs)

    def _grammar_tokenizer(self) -> llguidance.LLTokenizer:
        """The vocabulary as the grammar library reads it, built once per loaded model."""
        if self._lltokenizer is None:
            self._lltokenizer = tokenizer_from_vocab(self._require_vocab(), self._eog)
        return self._lltokenizer

    def _sampler(self, sampling: SamplingParams, prompt: Sequence[int]) -> LlamaSampler:
        """The sampler chain: logit bias and penalties first (on every logit, greedy too),
        then the truncations, temperature and the draw. The penalties see the prompt's last
        tokens, as llama-server's do, and each sampled token as the chain accepts it."""
        chain = LlamaSampler()
        n_vocab = self.info.n_vocab
        if sampling.logit_bias:
            biases = (llama_cpp.llama_logit_bias * len(sampling.logit_bias))(
                *(llama_cpp.llama_logit_bias(token, bias) for token, bias in sampling.logit_bias)
            )
            chain.add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), biases))
        if sampling.penalized:
            penalties = llama_cpp.llama_sampler_init_penalties(
                n_vocab,
                sampling.penalty_last_n,
                sampling.repeat_penalty,
                sampling.frequency_penalty,
                sampling.presence_penalty,
            )
            for token in prompt[-sampling.penalty_last_n :]:
                if is_image(token):
                    continue
                llama_cpp.llama_sampler_accept(penalties, token)
            chain.add(penalties)
        if sampling.temperature <= 0:
            chain.add(llama_cpp.llama_sampler_init_greedy())
            return chain
        if sampling.top_k > 0:
            chain.add(llama_cpp.llama_sampler_init_top_k(sampling.top_k))
        if sampling.top_p < 1.0:
            chain.add(llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1))
        if sampling.min_p > 0.0:
            chain.add(llama_cpp.llama_sampler_init_min_p(sampling.min_p, 1))
        chain.add(llama_cpp.llama_sampler_init_temp(sampling.temperature))
        seed = llama_cpp.LLAMA_DEFAULT_SEED if sampling.seed is None else sampling.seed & 0xFFFFFFFF
        chain.add(llama_cpp.llama_sampler_init_dist(seed))
        return chain
