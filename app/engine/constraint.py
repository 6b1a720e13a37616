"""Constrained decoding for both local runtimes: a grammar (llguidance's Lark, with JSON
schemas inside as `%json{...}`) decides which tokens may come next, and the runtime masks
every other logit to -inf before its sampler chain draws.

One library (llguidance) serves llama.cpp and MLX alike: it needs only the vocabulary's
bytes and the end-of-turn ids, and it hands back a bitmask over the vocabulary, which each
runtime applies to the logits it already holds. When the grammar is complete the mask allows
only end-of-turn, so the reply ends there; a reply is therefore always a sentence of the
grammar, unless max_tokens cuts it first.

The tokenizer view costs about a second to build, so a runtime keeps one per loaded model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import llguidance
import numpy as np

from app.engine.protocol import EngineError


def grammar_error(grammar: str) -> str | None:
    """Why the grammar cannot be used, in llguidance's words; None when it can."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return messages[0] if is_error else None


def tokenizer_from_pieces(
    pieces: Sequence[bytes],
    special: Sequence[int],
    eog: Sequence[int],
    tokenize: Callable[[str], list[int]],
) -> llguidance.LLTokenizer:
    """The vocabulary as llguidance reads it: each token's bytes, control tokens marked (so
    plain text in a grammar never matches them), the end-of-turn ids as its stop tokens."""
    marked = list(pieces)
    for token in special:
        marked[token] = b"\xff" + marked[token]
    return llguidance.LLTokenizer(_Wrapper(marked, list(eog), tokenize), eos_token=list(eog))


def tokenizer_from_vocab(vocab: Any, eog: Sequence[int]) -> llguidance.LLTokenizer:
    """For a GGUF's tokenizer: llama.cpp's vocab, or the MLX engine's rebuild of it
    (mlx/gguf_vocab.py); both give each token's bytes and the control tokens."""
    return tokenizer_from_pieces(
        [vocab.token_bytes(t) for t in range(vocab.n_tokens)],
        vocab.control_ids(),
        sorted(eog),
        lambda text: vocab.tokenize(text, special=False),
    )


def tokenizer_from_hf(hf_tokenizer: Any, eog: Sequence[int]) -> llguidance.LLTokenizer:
    """For an mlx-lm folder's Hugging Face tokenizer."""
    from llguidance.hf import from_tokenizer

    return from_tokenizer(hf_tokenizer, eos_token=sorted(eog))


class _Wrapper:
    """The object llguidance.LLTokenizer takes: the tokens, the stop ids, the tokenizer."""

    def __init__(
        self, tokens: list[bytes], eog: list[int], tokenize: Callable[[str], list[int]]
    ) -> None:
        self.tokens = tokens
        self.eos_token_id = eog[0] if eog else 0
        self.bos_token_id = None
        self.special_token_ids = list(eog)
        self.is_tokenizer_wrapper = True
        self._tokenize = tokenize

    def __call__(self, text: str | bytes) -> list[int]:
        return self._tokenize(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)


class Constraint:
    """One reply's grammar state: the tokens allowed next, and each drawn token consumed."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str, n_vocab: int) -> None:
        self._matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self._matcher.is_error():
            raise EngineError(f"The reply's grammar cannot be used: {self._matcher.get_error()}")
        self._n_vocab = n_vocab

    def allowed(self) -> np.ndarray:
        """A bool per vocabulary id: whether it may be drawn next."""
        words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(words, bitorder="little").astype(bool)
        if bits.size < self._n_vocab:
            bits = np.concatenate([bits, np.zeros(self._n_vocab - bits.size, dtype=bool)])
        return bits[: self._n_vocab]

    def mask_in_place(self, logits: np.ndarray) -> None:
        logits[~self.allowed()] = -np.inf

    def accept(self, token: int) -> None:
        self._matcher.consume_token(token)
