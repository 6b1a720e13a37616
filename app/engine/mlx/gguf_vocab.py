"""A GGUF's byte-level BPE tokenizer read from its metadata, without llama.cpp.

The MLX engine tokenizes a GGUF with the file's own tokenizer, so both engines give the same
ids for the same text. It used to borrow llama.cpp's vocab-only load for that, which put
llama.cpp in the MLX engine's process: on a CUDA machine the CUDA builds of llama.cpp and MLX
(and the PyTorch an image carries) then share one process, and llama.cpp's std::regex split of
the vocabulary crashed there. Here the same tokenizer is rebuilt from what the GGUF stores
(tokens, their types, merges, the pre-tokenizer's name), read from the file's header
(app/engine/gguf_header.py: gguf-py's reader takes seconds over a vocabulary's hundred
thousand strings, this a tenth of one), and run by Hugging Face `tokenizers`, as llama.cpp
runs it:

- the text is split by the pre-tokenizer's regular expressions, each one splitting the pieces
  the last one left, in llama.cpp's order (llama-vocab.cpp, `llm_tokenizer_bpe`);
- each piece is merged by rank in the byte-level alphabet;
- control tokens are matched in the text only when asked (`special`); user-defined ones always;
- a token's bytes are its byte-level text mapped back (normal tokens) or its text as is;
- end-of-generation tokens are the ones llama.cpp names so (by their text) plus the file's
  eos, eot and eom ids.

`read_vocab` returns None for a tokenizer this does not rebuild (SentencePiece models, other
pre-tokenizers): those still go through llama.cpp. tests/unit/test_gguf_vocab.py holds every
rebuilt one to llama.cpp's ids, bytes and end-of-generation set.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from app.engine.gguf_header import HeaderError, open_header

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_DEEPSEEK3 = (
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"""| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
)
# tokenizer.ggml.pre -> llama.cpp's expressions for it (llama-vocab.cpp, llm_tokenizer_bpe)
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo"), (_GPT2,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r"), (r"\p{N}", _GPT2)),
    "deepseek-v3": _DEEPSEEK3,
}
# Tokens llama.cpp ends generation on by their text (llama_vocab::impl::load, special_eog_ids)
_EOG_TEXTS = frozenset(
    (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<｜end▁of▁sentence｜>",
        "[e~[",
        # fill-in-the-middle pad, repo and separator tokens, which llama.cpp also ends on
        "<|fim_pad|>",
        "<fim-pad>",
        "<fim_pad>",
        "<PAD>",
        "[PAD]",
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
        "<|file_sep|>",
    )
)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED = 1, 2, 3, 4
_IDS = ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")


@cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: each printable stand-in -> the byte it stands for."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _piece(text: str, kind: int) -> bytes:
    """What llama.cpp's token_to_piece gives a BPE token (special tokens rendered)."""
    alphabet = _byte_of_char()
    if kind == _NORMAL and all(c in alphabet for c in text):
        return bytes(alphabet[c] for c in text)
    if kind in (_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED):
        return text.encode("utf-8")
    return b""  # unused and byte tokens render as nothing in a BPE vocab


def _header(path: Path) -> dict[str, Any]:
    """The metadata of a GGUF, its arrays as tuples; empty for a file that is not one."""
    try:
        with open_header(path) as header:
            return header.metadata()
    except HeaderError:
        return {}


class GGUFVocab:
    """The tokenizer of a GGUF, with llama.cpp's vocab's interface (backend.Vocab)."""

    def __init__(
        self,
        tokens: Sequence[str],
        types: Sequence[int],
        merges: Sequence[str],
        expressions: Sequence[str],
        ids: dict[str, int],
        add_bos: bool,
    ) -> None:
        self._texts = list(tokens)
        eog = {t for t, text in enumerate(self._texts) if text in _EOG_TEXTS}
        eog |= {ids[name] for name in _IDS if ids.get(name, -1) >= 0}
        self._eog = frozenset(eog)
        # llama.cpp makes an end-of-generation name a control token whatever its stored type
        self._types = [_CONTROL if t in eog else kind for t, kind in enumerate(types)]
        self.bos, self.eos, self.add_bos = ids.get("bos", -1), ids.get("eos", -1), add_bos
        self._plain = self._tokenizer(merges, expressions, encode_special=True)
        self._special = self._tokenizer(merges, expressions, encode_special=False)
        self._bytes = [
            _piece(text, kind) for text, kind in zip(self._texts, self._types, strict=True)
        ]

    def _tokenizer(
        self, merges: Sequence[str], expressions: Sequence[str], *, encode_special: bool
    ) -> Tokenizer:
        vocab = {text: t for t, text in enumerate(self._texts)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        tok = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, ignore_merges=False))
        splits = [pre_tokenizers.Split(Regex(e), behavior="isolated") for e in expressions]
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        tok.decoder = decoders.ByteLevel()
        added = [
            AddedToken(text, special=kind == _CONTROL, normalized=False)
            for text, kind in zip(self._texts, self._types, strict=True)
            if kind in (_CONTROL, _USER_DEFINED)
        ]
        tok.add_tokens(added)
        tok.encode_special_tokens = encode_special
        return tok

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        tok = self._special if special else self._plain
        return tok.encode(text, add_special_tokens=False).ids

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one token; control tokens are rendered as their text."""
        return self._bytes[token]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self._bytes[t] for t in tokens).decode("utf-8", "replace")

    def text(self, token: int) -> str:
        return self._texts[token] if 0 <= token < len(self._texts) else ""

    @property
    def n_tokens(self) -> int:
        return len(self._texts)

    def eog_ids(self) -> frozenset[int]:
        return self._eog

    def control_ids(self) -> list[int]:
        """Control tokens, which a grammar's plain text must never match."""
        return [t for t, kind in enumerate(self._types) if kind == _CONTROL]


def read_vocab(path: Path) -> GGUFVocab | None:
    """The GGUF's tokenizer, or None when it is not a byte-level BPE one rebuilt here."""
    meta = _header(path)
    expressions = PRE_TOKENIZERS.get(meta.get("tokenizer.ggml.pre", ""))
    tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
    if meta.get("tokenizer.ggml.model") != "gpt2" or expressions is None or not tokens:
        return None
    ids = {
        name: int(meta[f"tokenizer.ggml.{name}_token_id"])
        for name in ("bos", *_IDS)
        if f"tokenizer.ggml.{name}_token_id" in meta
    }
    if merges is None or "bos" not in ids or "eos" not in ids:
        return None  # llama.cpp's defaults for these are its own; let it decide
    types = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    return GGUFVocab(tokens, types, merges, expressions, ids, add_bos)
