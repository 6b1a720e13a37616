"""`logprobs` in OpenAI's two shapes, from the per-token scores the engine sent with each
token (app/engine/logprobs.py): chat's `{"content": [{token, logprob, bytes, top_logprobs}]}`
and completions' `{tokens, token_logprobs, top_logprobs, text_offset}`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

Score = tuple[float | None, tuple[tuple[int, float], ...]]


class Detokenizer(Protocol):
    def detokenize(self, tokens: Sequence[int]) -> str: ...


class TokenTexts:
    """Each id's text, read once through the model's tokenizer."""

    def __init__(self, tokenizer: Detokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        if token not in self._cache:
            self._cache[token] = self._tokenizer.detokenize([token])
        return self._cache[token]


def chat_logprobs(
    tokens: Sequence[int], scores: Sequence[Score], text: TokenTexts
) -> dict[str, Any]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        piece = text(token)
        return {"token": piece, "logprob": _finite(logprob), "bytes": list(piece.encode())}

    content = []
    for token, (logprob, top) in zip(tokens, scores, strict=False):
        item = entry(token, logprob if logprob is not None else 0.0)
        item["top_logprobs"] = [entry(t, lp) for t, lp in top]
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(
    tokens: Sequence[int], scores: Sequence[Score], text: TokenTexts, offset: int = 0
) -> dict[str, Any]:
    pieces = [text(t) for t in tokens]
    offsets, at = [], offset
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return {
        "tokens": pieces,
        "token_logprobs": [_finite(lp if lp is not None else 0.0) for lp, _ in scores],
        "top_logprobs": [{text(t): _finite(lp) for t, lp in top} for _, top in scores],
        "text_offset": offsets,
    }


def _finite(logprob: float) -> float:
    """JSON has no -inf: a token the grammar ruled out reads as OpenAI's floor."""
    return max(logprob, -9999.0)
