"""Tokenizers for the MLX engine, one interface for both kinds of model.

A GGUF carries its tokenizer in its metadata, and the MLX engine tokenizes a GGUF exactly as
llama.cpp does, so both engines produce the same ids from the same file (a transcript stays
valid when the user switches engine): through `gguf_vocab`'s rebuild of it where it is a
byte-level BPE one it knows (no llama.cpp in the MLX engine's process), else through
llama.cpp's vocab-only load. An mlx-lm folder carries a Hugging Face tokenizer, read through
mlx-lm.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from llguidance import LLTokenizer

from app.engine.constraint import tokenizer_from_hf, tokenizer_from_vocab


class TextStream(Protocol):
    """Turns sampled ids into text as they arrive (a piece may end mid UTF-8 sequence)."""

    def add(self, token: int) -> str: ...


class MlxTokenizer(Protocol):
    def tokenize(self, text: str, *, special: bool = False) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def stream(self) -> TextStream: ...

    def grammar_tokenizer(self, eog: Sequence[int]) -> LLTokenizer:
        """The vocabulary as the grammar library reads it (engine/constraint.py)."""
        ...


class GGUFVocabLike(Protocol):
    """What a GGUF's vocabulary gives: llama.cpp's (llamacpp.backend.Vocab) or gguf_vocab's."""

    n_tokens: int

    def tokenize(self, text: str, *, special: bool = False) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def token_bytes(self, token: int) -> bytes: ...

    def control_ids(self) -> list[int]: ...


class _BytesStream:
    def __init__(self, vocab: GGUFVocabLike) -> None:
        self._vocab = vocab
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, token: int) -> str:
        return self._decoder.decode(self._vocab.token_bytes(token))


class GGUFTokenizer:
    """The GGUF's own tokenizer (no weights loaded)."""

    def __init__(self, vocab: GGUFVocabLike) -> None:
        self.vocab = vocab

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return self.vocab.tokenize(text, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.vocab.detokenize(tokens)

    def stream(self) -> TextStream:
        return _BytesStream(self.vocab)

    def grammar_tokenizer(self, eog: Sequence[int]) -> LLTokenizer:
        return tokenizer_from_vocab(self.vocab, eog)


class _DetokenizerStream:
    def __init__(self, detokenizer) -> None:
        self._detokenizer = detokenizer
        detokenizer.reset()

    def add(self, token: int) -> str:
        self._detokenizer.add_token(token)
        return self._detokenizer.last_segment


class HFTokenizer:
    """An mlx-lm folder's Hugging Face tokenizer."""

    def __init__(self, folder: Path) -> None:
        from mlx_lm.utils import load_tokenizer

        self.wrapper = load_tokenizer(folder)
        self.hf = self.wrapper._tokenizer

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        # Without `special`, text that looks like a control token stays plain text.
        return self.hf.encode(text, add_special_tokens=False, split_special_tokens=not special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.hf.decode(list(tokens))

    def stream(self) -> TextStream:
        return _DetokenizerStream(self.wrapper.detokenizer)

    def grammar_tokenizer(self, eog: Sequence[int]) -> LLTokenizer:
        return tokenizer_from_hf(self.hf, eog)
