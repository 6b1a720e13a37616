"""Owners of llama.cpp's native handles: the model, a context, a batch and a sampler chain.

Each pointer belongs to one small object whose `close()` frees it exactly once (again on
garbage collection, as llama-cpp-python's `_internals.py` does). `load()` then enters them
into an `ExitStack` instead of freeing by hand on each error path, and an unload is one
`close()` per handle in the reverse order of creation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import llama_cpp


class Owner:
    """One native pointer and the function that frees it."""

    def __init__(self, ptr: Any, free: Callable[[Any], None]) -> None:
        self.ptr = ptr
        self._free = free

    def close(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr is not None:
            self._free(ptr)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class LlamaModel(Owner):
    """A loaded model (weights, or only the vocabulary with `vocab_only`)."""

    @classmethod
    def load(cls, path: Path, params: llama_cpp.llama_model_params) -> LlamaModel | None:
        """The model in `path`, or None when llama.cpp could not load it (its log says why)."""
        ptr = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        return cls(ptr, llama_cpp.llama_model_free) if ptr else None


class LlamaContext(Owner):
    """A context over a model: the KV memory of every resident sequence and the logits."""

    def __init__(self, ptr: llama_cpp.llama_context_p, model: LlamaModel) -> None:
        super().__init__(ptr, llama_cpp.llama_free)
        self.model = model  # a context must not outlive its model, garbage collection included

    @classmethod
    def create(
        cls, model: LlamaModel, params: llama_cpp.llama_context_params
    ) -> LlamaContext | None:
        """A new context, or None when llama.cpp could not allocate it (its log says why)."""
        ptr = llama_cpp.llama_init_from_model(model.ptr, params)
        return cls(ptr, model) if ptr else None


class LlamaBatch(Owner):
    """A batch of up to `n_tokens` token positions, each in one sequence."""

    def __init__(self, n_tokens: int) -> None:
        super().__init__(llama_cpp.llama_batch_init(n_tokens, 0, 1), llama_cpp.llama_batch_free)


class LlamaSampler(Owner):
    """A sampler chain: the samplers added to it are the chain's to free."""

    def __init__(self) -> None:
        params = llama_cpp.llama_sampler_chain_default_params()
        super().__init__(llama_cpp.llama_sampler_chain_init(params), llama_cpp.llama_sampler_free)

    def add(self, sampler: llama_cpp.llama_sampler_p) -> None:
        llama_cpp.llama_sampler_chain_add(self.ptr, sampler)

    def sample(self, ctx: LlamaContext) -> int:
        """A token drawn from the context's last logits (the chain accepts it)."""
        return llama_cpp.llama_sampler_sample(self.ptr, ctx.ptr, -1)
