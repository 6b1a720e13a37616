"""A vision model's projector on llama.cpp (libmtmd), and the images its prompts hold.

`Vision` owns the mtmd context (close() frees it). `run` turns an image into the ids a
prompt holds for it (engine/images.py): the projector's own text around the image (some wrap
it in begin/end tokens) and the image's stand-in run; it keeps the image's chunk under that
id. `decode` evaluates such a run into a sequence, encoding the image once and keeping its
embeddings for the next time a prompt reads it (a restore or another conversation).

Only projectors whose image tokens take one position each are taken: M-RoPE projectors
(Qwen2-VL and later) give an image fewer positions than tokens, which a prompt of ids cannot
express; they are refused at load in words.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from app.engine.images import ImageGoneError, Picture, image_token
from app.engine.protocol import EngineError, ModelLoadError

KEEP_IMAGES = 64  # images held for prompts (their pixels, after the projector's resize)
KEEP_ENCODED = 8  # of those, the ones whose embeddings are kept too
_TEXT_CHUNK = 0
_NO_CALLBACK = ctypes.cast(None, mtmd.mtmd_helper_post_decode_callback)  # a NULL callback


@dataclass
class _Held:
    chunk: mtmd.mtmd_input_chunk_p
    n_tokens: int
    embeddings: np.ndarray | None = field(default=None)


class Vision:
    """The projector of one loaded model, and the images registered for its prompts."""

    def __init__(
        self, projector: Path, model: llama_cpp.llama_model_p, n_threads: int, use_gpu: bool
    ) -> None:
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        params.warmup = False
        self.path = projector
        self._ctx = mtmd.mtmd_init_from_file(str(projector).encode(), model, params)
        if not self._ctx:
            raise ModelLoadError(
                f"The projector {projector.name} does not match this model or is not a "
                "projector llama.cpp reads. Use the mmproj file published with the model."
            )
        if not mtmd.mtmd_support_vision(self._ctx):
            self.close()
            raise ModelLoadError(f"{projector.name} is not a vision projector.")
        if mtmd.mtmd_decode_use_mrope(self._ctx):
            self.close()
            raise ModelLoadError(
                f"{projector.name} places image tokens in 2-D (M-RoPE, as Qwen2-VL and later "
                "do), which Stoke does not run yet. Use the model without its projector."
            )
        self._width = llama_cpp.llama_model_n_embd_inp(model)  # an image token's embedding
        self._marker = mtmd.mtmd_default_marker()
        self._held: OrderedDict[int, _Held] = OrderedDict()

    def run(self, picture: Picture) -> list[int]:
        """The ids a prompt holds for `picture` (registering it under its stand-in id)."""
        token = image_token(picture.digest)
        pixels = (ctypes.c_uint8 * len(picture.rgb)).from_buffer_copy(picture.rgb)
        bitmap = mtmd.mtmd_bitmap_init(picture.width, picture.height, pixels)
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            mtmd.mtmd_bitmap_set_id(bitmap, picture.digest.encode())
            text = mtmd.mtmd_input_text(self._marker, len(self._marker), False, True)
            bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
            if mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(text), bitmaps, 1) != 0:
                raise EngineError("The model's projector could not read this image.")
            ids: list[int] = []
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                if mtmd.mtmd_input_chunk_get_type(chunk) == _TEXT_CHUNK:
                    n = ctypes.c_size_t()
                    raw = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    ids += [raw[j] for j in range(n.value)]
                    continue
                n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
                if token not in self._held:
                    self._held[token] = _Held(mtmd.mtmd_input_chunk_copy(chunk), n_tokens)
                    self._forget()
                self._held.move_to_end(token)
                ids += [token] * n_tokens
            return ids
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)

    def _held_of(self, token: int) -> _Held:
        """The image registered under `token` (now the most recently used), or ImageGoneError:
        others took its place since its prompt was built."""
        held = self._held.get(token)
        if held is None:
            raise ImageGoneError()
        self._held.move_to_end(token)
        return held

    def n_tokens(self, token: int) -> int:
        return self._held_of(token).n_tokens

    def decode(
        self, lctx: llama_cpp.llama_context_p, token: int, pos: int, seq_id: int, n_batch: int
    ) -> None:
        """Evaluate the image registered under `token` into `seq_id` from position `pos`."""
        held = self._held_of(token)
        if held.embeddings is None:
            if mtmd.mtmd_encode_chunk(self._ctx, held.chunk) != 0:
                raise EngineError("The model's projector failed to read an image.")
            out = mtmd.mtmd_get_output_embd(self._ctx)
            held.embeddings = np.ctypeslib.as_array(out, (held.n_tokens * self._width,)).copy()
            encoded = [h for h in self._held.values() if h.embeddings is not None]
            for old in encoded[: max(0, len(encoded) - KEEP_ENCODED)]:
                old.embeddings = None
        new_pos = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_decode_image_chunk(
            self._ctx,
            lctx,
            held.chunk,
            held.embeddings.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            pos,
            seq_id,
            n_batch,
            ctypes.byref(new_pos),
            _NO_CALLBACK,
            None,
        )
        if rc != 0:
            raise EngineError(f"llama.cpp failed to evaluate an image (code {rc}).")

    def _forget(self) -> None:
        while len(self._held) > KEEP_IMAGES:
            _, old = self._held.popitem(last=False)
            mtmd.mtmd_input_chunk_free(old.chunk)

    def close(self) -> None:
        for held in self._held.values():
            mtmd.mtmd_input_chunk_free(held.chunk)
        self._held.clear()
        if self._ctx:
            mtmd.mtmd_free(self._ctx)
            self._ctx = None
