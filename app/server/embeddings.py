"""Embeddings: OpenAI's `POST /v1/embeddings` and Ollama's `POST /api/embed`.

Inputs: a string, a list of strings, a list of token ids or a list of such lists (OpenAI),
or a string or list of strings (Ollama). Each is tokenized as the model reads text (its BOS
where it adds one) and embedded by the engine (app/engine/llamacpp/embeddings.py: the GGUF's
pooling, L2-normalised). `encoding_format` "base64" packs each vector as little-endian
float32, as OpenAI's client asks by default; `dimensions` is taken only when it is the
model's own (these models cannot shorten their vectors). A model whose engine makes no
embeddings (MLX, a remote server) is a 400 in words.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from app.server.errors import ApiError, invalid
from app.server.requests import RequestCore

MAX_INPUTS = 256


class EmbeddingsApi:
    def __init__(self, core: RequestCore) -> None:
        self.core = core

    def add_routes(self, app: web.Application) -> None:
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/embeddings", self.openai)
        app.router.add_post("/api/embed", self.ollama)

    async def openai(self, request: web.Request) -> web.Response:
        body = await self.core.body(request)
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise invalid("encoding_format", '`encoding_format` must be "float" or "base64".')
        vectors, n_tokens = await self._embed(body.get("model"), body.get("input"), "input")
        dimensions = body.get("dimensions")
        if dimensions is not None and dimensions != len(vectors[0]):
            raise invalid(
                "dimensions",
                f"This model's vectors have {len(vectors[0])} dimensions and cannot be "
                "shortened; leave `dimensions` out.",
            )
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(v, encoding)}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
        return web.json_response(
            {"object": "list", "data": data, "model": self.core.model_id, "usage": usage}
        )

    async def ollama(self, request: web.Request) -> web.Response:
        body = await self.core.body(request)
        raw = body.get("input")
        if isinstance(raw, list) and not all(isinstance(x, str) for x in raw):
            raise invalid("input", "`input` must be text or a list of texts.")
        vectors, n_tokens = await self._embed(body.get("model"), raw, "input")
        return web.json_response(
            {
                "model": body.get("model") or self.core.model_id,
                "embeddings": vectors,
                "prompt_eval_count": n_tokens,
            }
        )

    async def _embed(self, model: Any, raw: Any, field: str) -> tuple[list[list[float]], int]:
        info = await self.core.ready(model if isinstance(model, str) else None)
        if info.backend != "llama.cpp":
            raise ApiError(
                400,
                f"This model runs on {info.backend}, which makes no embeddings here; a GGUF "
                "model on llama.cpp does.",
                param=field,
            )
        inputs = await self._token_lists(raw, field, info.n_vocab)
        if info.add_bos and info.bos_id is not None:
            inputs = [t if t[:1] == [info.bos_id] else [info.bos_id, *t] for t in inputs]
        vectors = await self.core.engine.embed(inputs)
        return vectors, sum(len(t) for t in inputs)

    async def _token_lists(self, raw: Any, field: str, n_vocab: int) -> list[list[int]]:
        words = f"`{field}` must be text, a list of texts, token ids or lists of token ids."
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not raw:
            raise invalid(field, words)
        if all(_is_id(x) for x in raw):
            raw = [raw]
        if len(raw) > MAX_INPUTS:
            raise invalid(field, f"Send at most {MAX_INPUTS} inputs per request.")
        out = []
        for item in raw:
            if isinstance(item, str) and item:
                out.append(await self.core.engine.tokenize(item))
            elif isinstance(item, list) and item and all(_is_id(t) for t in item):
                if any(not 0 <= t < n_vocab for t in item):
                    raise invalid(field, f"Token ids go from 0 to {n_vocab - 1}.")
                out.append(list(item))
            else:
                raise invalid(field, words + " None may be empty.")
        return out


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _encoded(vector: Sequence[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return list(vector)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
