"""Embeddings from the loaded model: one vector per input, pooled as the GGUF says.

A second, small context over the same weights (no second copy of them) is made on the first
request and kept until the model unloads: `embeddings` on, one sequence, a batch as long as
its context so a whole input is one forward. Pooling is the model's own (`pooling_type` in
the GGUF: mean, CLS, last); a model that names none (a chat model) is mean-pooled over its
tokens' final states, as llama-server does with `--pooling mean`. Vectors come back
L2-normalised, as OpenAI's do; an input longer than the context is refused in words.
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp
import numpy as np

from app.engine.llamacpp.handles import LlamaBatch, LlamaContext, LlamaModel
from app.engine.protocol import ContextOverflowError, EngineError

MAX_TOKENS = 2048  # the embedding context's length


class Embedder:
    """The embedding context of one loaded model; `close()` frees it."""

    def __init__(self, model: LlamaModel, n_threads: int, max_tokens: int = MAX_TOKENS) -> None:
        cparams = llama_cpp.llama_context_default_params()
        n_ctx = min(max_tokens, llama_cpp.llama_model_n_ctx_train(model.ptr) or max_tokens)
        cparams.embeddings = True
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_ctx
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.no_perf = True
        ctx = LlamaContext.create(model, cparams)
        if ctx is None:
            raise EngineError("Could not make room for the embedding context of this model.")
        self._ctx, self._batch = ctx, LlamaBatch(n_ctx)
        self.n_ctx = n_ctx
        self.dimensions = llama_cpp.llama_model_n_embd(model.ptr)
        self._pooled = llama_cpp.llama_pooling_type(ctx.ptr) != llama_cpp.LLAMA_POOLING_TYPE_NONE

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        return [self._one(tokens) for tokens in inputs]

    def _one(self, tokens: Sequence[int]) -> list[float]:
        if not tokens:
            raise EngineError("An input to embed is empty.")
        if len(tokens) > self.n_ctx:
            raise ContextOverflowError(len(tokens), self.n_ctx)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx.ptr), True)
        batch = self._batch.ptr
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        batch.n_tokens = len(tokens)
        if llama_cpp.llama_decode(self._ctx.ptr, batch) != 0:
            raise EngineError("llama.cpp could not compute the embedding of an input.")
        n = self.dimensions
        if self._pooled:
            ptr = llama_cpp.llama_get_embeddings_seq(self._ctx.ptr, 0)
            vector = np.ctypeslib.as_array(ptr, shape=(n,)).astype(np.float64)
        else:
            ptr = llama_cpp.llama_get_embeddings(self._ctx.ptr)
            vector = np.ctypeslib.as_array(ptr, shape=(len(tokens), n)).mean(0, dtype=np.float64)
        norm = float(np.linalg.norm(vector)) or 1.0
        return (vector / norm).tolist()

    def close(self) -> None:
        self._batch.close()
        self._ctx.close()
