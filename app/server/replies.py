"""One reply as the server writes it: text and ids cut at the first stop sequence, the ids the
next turn can build on, and the finish reason and usage the client is told."""

from __future__ import annotations

import bisect
import contextlib
from dataclasses import dataclass, field
from typing import Any

from app.engine.protocol import FinishReason, GenerationStats


@dataclass
class Reply:
    """A reply as it streams: text and ids, cut at the first stop sequence."""

    stops: tuple[str, ...]
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # len(text) after each token
    sent: int = 0  # characters of text handed out
    stopped: bool = False  # a stop sequence ended it
    matched: str | None = None  # which one
    stats: GenerationStats | None = None  # the engine's numbers, once it has finished
    # Per token when logprobs were asked for: (logprob, top (id, logprob) pairs)
    scores: list[tuple[float | None, tuple[tuple[int, float], ...]]] = field(default_factory=list)

    def add(
        self,
        token_id: int,
        piece: str,
        logprob: float | None = None,
        top: tuple[tuple[int, float], ...] = (),
    ) -> str:
        """Take one token; returns the text now safe to send."""
        self.tokens.append(token_id)
        self.scores.append((logprob, top))
        self.text += piece
        self.ends.append(len(self.text))
        hold = 0
        if self.stops:
            longest = max(len(s) for s in self.stops)
            window = max(0, self.sent - longest)
            hits = [(i, s) for s in self.stops if (i := self.text.find(s, window)) >= 0]
            if hits:
                at, self.matched = min(hits)
                self.text, self.stopped = self.text[:at], True
            else:
                hold = longest - 1
        safe = max(self.sent, len(self.text) - hold)
        out, self.sent = self.text[self.sent : safe], safe
        return out

    def finish(self) -> str:
        out, self.sent = self.text[self.sent :], len(self.text)
        return out

    def exact_tokens(self) -> list[int] | None:
        """The ids whose text is exactly the reply's text; None when a stop sequence began
        inside a token (no ids spell the text the client saw)."""
        if not self.stopped:
            return self.tokens
        if not self.text:
            return []
        with contextlib.suppress(ValueError):
            return self.tokens[: self.ends.index(len(self.text)) + 1]
        return None

    def kept_tokens(self) -> list[int]:
        """The ids the next turn can build on: the exact ones, else those wholly before
        the stop sequence."""
        exact = self.exact_tokens()
        return (
            exact if exact is not None else self.tokens[: bisect.bisect(self.ends, len(self.text))]
        )


def finish_reason(reply: Reply) -> str:
    stats = reply.stats
    if reply.stopped or stats is None or stats.finish_reason == FinishReason.STOP:
        return "stop"
    return "length"


def usage(reply: Reply, *more: Reply) -> dict[str, Any]:
    """OpenAI's usage (of all the choices' replies: the prompt once, every reply's tokens).
    Its prediction counts answer a request's `prediction`, which this server does not take,
    so they are 0; Stoke's own drafts are in `timings`."""
    stats = reply.stats
    prompt = stats.prompt_tokens if stats else 0
    generated = len(reply.tokens) + sum(len(r.tokens) for r in more)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": generated,
        "total_tokens": prompt + generated,
        "prompt_tokens_details": {"cached_tokens": stats.reused_tokens if stats else 0},
        "completion_tokens_details": {
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def timings(reply: Reply) -> dict[str, Any]:
    """llama-server's `timings`: tokens reused from the cache, prefilled and generated, their
    milliseconds and rates, and speculative decoding's drafts and how many were kept."""
    stats = reply.stats
    if stats is None:
        return {}
    generated = len(reply.tokens)
    prompt_ms = 1000 * stats.prefilled_tokens / stats.prefill_tok_s if stats.prefill_tok_s else 0
    decode_ms = 1000 * generated / stats.decode_tok_s if stats.decode_tok_s else 0
    return {
        "cache_n": stats.reused_tokens,
        "prompt_n": stats.prefilled_tokens,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_second": round(stats.prefill_tok_s, 3),
        "predicted_n": generated,
        "predicted_ms": round(decode_ms, 3),
        "predicted_per_second": round(stats.decode_tok_s, 3),
        "draft_n": stats.drafted_tokens,
        "draft_n_accepted": stats.accepted_tokens,
    }
