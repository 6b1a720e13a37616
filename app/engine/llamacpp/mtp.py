"""llama.cpp's MTP context: the head `app/engine/mtp.py` drafts with, on a model loaded with
`load_mtp` (DeepSeek V4's NextN block in the same GGUF).

A context of type `LLAMA_CONTEXT_TYPE_MTP` over the target's own model runs only the NextN
block; each entry is a token plus the target's hidden state (`n_embd_out` wide: DeepSeek V4's
hyper-connection streams, before its output head), set as the token's input embedding of an
extended batch (`llama_batch_ext_set_embd_token`: `llama_batch_ext_set_embd_state` is still a
stub in this llama.cpp). The target context hands out those states once asked by
`llama_set_embeddings_nextn`, and the MTP context its own output state the same way.

Those two calls (and their getters) are llama.cpp's staging API, `src/llama-ext.h`: declared
without `extern "C"`, so libllama exports them under their C++ (Itanium) names, which ctypes
finds like any other symbol. `nextn_api()` is None where a build lacks them.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

from app.engine.llamacpp.handles import LlamaContext, LlamaModel, Owner

_FLOATS = ctypes.POINTER(ctypes.c_float)
_MANGLED = {  # llama-ext.h, as g++ and clang mangle them
    "set": ("_Z26llama_set_embeddings_nextnP13llama_contextbb", [ctypes.c_bool] * 2, None),
    "all": ("_Z26llama_get_embeddings_nextnP13llama_context", [], _FLOATS),
    "ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti", [ctypes.c_int32], _FLOATS),
}


@dataclass(frozen=True)
class NextnApi:
    """The staging calls: turn the hidden-state output on, read all rows or one."""

    set: Any  # (ctx, value, masked): masked = only the rows of tokens with logits
    all: Any  # (ctx) -> float* rows of every token of the last batch (unmasked)
    ith: Any  # (ctx, i) -> float* row of batch index i (masked)


def nextn_api() -> NextnApi | None:
    lib = llama_cpp.llama_cpp._lib
    found = {}
    for key, (symbol, args, result) in _MANGLED.items():
        function = getattr(lib, symbol, None)
        if function is None:
            return None
        function.argtypes, function.restype = [ctypes.c_void_p, *args], result
        found[key] = function
    return NextnApi(**found)


def hidden_rows(api: NextnApi, ctx: LlamaContext, n: int, width: int, keep: int) -> np.ndarray:
    """The target's states of the last `keep` of the `n` tokens it just evaluated."""
    rows = np.ctypeslib.as_array(api.all(ctx.ptr), shape=(n, width))
    return rows[max(0, n - keep) :].copy()


class _BatchExt(Owner):
    def __init__(self, ctx: LlamaContext) -> None:
        super().__init__(llama_cpp.llama_batch_ext_init(ctx.ptr), llama_cpp.llama_batch_ext_free)


class LlamaMtpHead:
    """The NextN block of a loaded model in an MTP context of its own, one sequence per key
    (as many as the target's resident conversations, least recently used reused)."""

    def __init__(
        self,
        api: NextnApi,
        model: LlamaModel,
        ctx: LlamaContext,
        n_seq: int,
        window: int,
    ) -> None:
        self.window = window
        self._api, self._ctx = api, ctx
        self._batch = _BatchExt(ctx)
        self._width = llama_cpp.llama_model_n_embd_out(model.ptr)
        self._n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model.ptr))
        self._n_batch = llama_cpp.llama_n_batch(ctx.ptr)
        self._seqs: OrderedDict[str, int] = OrderedDict()
        self._free = list(range(n_seq))

    @classmethod
    def open(
        cls,
        api: NextnApi,
        model: LlamaModel,
        target: llama_cpp.llama_context_params,
        window: int,
    ) -> LlamaMtpHead | None:
        """The head over `model` with the target's context sizes; None when llama.cpp could
        not make the context (the model has no MTP block, or no memory for it)."""
        params = llama_cpp.llama_context_default_params()
        shared = ("n_ctx", "n_seq_max", "n_threads", "n_threads_batch", "kv_unified", "type_k")
        for name in (*shared, "type_v", "offload_kqv", "flash_attn_type"):
            setattr(params, name, getattr(target, name))
        params.n_batch = params.n_ubatch = max(target.n_ubatch, window + 64)
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.swa_full = False  # the block attends over a window: keep only that many cells
        params.no_perf = True
        ctx = LlamaContext.create(model, params)
        if ctx is None:
            return None
        api.set(ctx.ptr, True, True)
        return cls(api, model, ctx, target.n_seq_max, window)

    def _seq(self, key: str) -> int:
        seq = self._seqs.get(key)
        if seq is None:
            if not self._free:
                _, seq = self._seqs.popitem(last=False)
                self._forget(seq, 0)
            else:
                seq = self._free.pop(0)
            self._seqs[key] = seq
        self._seqs.move_to_end(key)
        return seq

    def _forget(self, seq: int, keep: int) -> None:
        mem = llama_cpp.llama_get_memory(self._ctx.ptr)
        llama_cpp.llama_memory_seq_rm(mem, seq, keep if keep > 0 else -1, -1)

    def cut(self, key: str, keep: int) -> None:
        seq = self._seqs.get(key)
        if seq is not None:
            self._forget(seq, keep)

    def step(
        self, key: str, start: int, tokens: Sequence[int], states: list[Any]
    ) -> tuple[np.ndarray, Any]:
        seq = self._seq(key)
        batch = self._batch.ptr
        for at in range(0, len(tokens), self._n_batch):
            llama_cpp.llama_batch_ext_clear(batch)
            end = min(at + self._n_batch, len(tokens))
            for i in range(at, end):
                idx = llama_cpp.llama_batch_ext_add_token(batch, seq, tokens[i])
                llama_cpp.llama_batch_ext_set_pos(batch, idx, (llama_cpp.llama_pos * 1)(start + i))
                row = np.ascontiguousarray(states[i], dtype=np.float32)
                embd = llama_cpp.llama_embd(row.ctypes.data_as(_FLOATS), 1, self._width)
                llama_cpp.llama_batch_ext_set_embd_token(batch, idx, embd)
                llama_cpp.llama_batch_ext_set_output_logits(batch, idx, i == len(tokens) - 1)
            rc = llama_cpp.llama_process(self._ctx.ptr, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, batch)
            if rc != 0:
                raise RuntimeError(f"the MTP context failed to evaluate (code {rc})")
        last = len(tokens) - 1 - at
        logits = llama_cpp.llama_get_logits_ith(self._ctx.ptr, last)
        state = self._api.ith(self._ctx.ptr, last)
        return (
            np.ctypeslib.as_array(logits, shape=(self._n_vocab,)).copy(),
            np.ctypeslib.as_array(state, shape=(self._width,)).copy(),
        )

    def close(self) -> None:
        self._batch.close()
        self._ctx.close()
