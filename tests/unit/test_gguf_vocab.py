"""The MLX engine's GGUF tokenizer without llama.cpp (mlx/gguf_vocab.py) is llama.cpp's: the
same ids for the same text (plain and with control tokens parsed), the same bytes for every
token, the same end-of-generation set, on the default model (SmolLM2's "smollm" pre-tokenizer)
and on the scaled DeepSeek V4 with DeepSeek's own and GPT-2's pre-tokenizers. And the MLX
engine's process gets there without importing llama.cpp or transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.llamacpp.backend import load_vocab
from app.engine.mlx.gguf_vocab import read_vocab
from app.hardware.synthetic_gguf import write_deepseek4
from app.models.default import default_model_path

TEXTS = (
    "Hello, world! It's 2026; we'll see 12345 apples and 3.14159 pies.",
    "  spaces   and\ttabs\n\nnew lines\r\n   leading and trailing   ",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "Ünïcödé café naïve 日本語のテキスト 中文 한국어 🎉🚀 ｜full-width｜",
    "def f(x):\n    return x**2  # don't\n\nclass A(B): pass\n",
    "don't I'LL You're THEY'VE we'd 1,000,000 x=-42 a+b==c?!",
    "a" * 300,
    "",
)


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vocab")
    files = {"smollm": Path(default_model_path())}
    for pre in ("gpt-2", "deepseek-v3"):
        files[pre] = write_deepseek4(folder / f"{pre}.gguf", mode="scaled", tokenizer_pre=pre)
    return files


@pytest.mark.parametrize("pre", ["smollm", "gpt-2", "deepseek-v3"])
def test_rebuilt_tokenizer_is_llama_cpps(gguf_files: dict[str, Path], pre: str) -> None:
    path = gguf_files[pre]
    ours, theirs = read_vocab(path), load_vocab(str(path))
    assert ours is not None
    assert ours.n_tokens == theirs.n_tokens
    assert (ours.bos, ours.eos, ours.add_bos) == (theirs.bos, theirs.eos, theirs.add_bos)
    assert ours.eog_ids() == theirs.eog_ids()
    assert ours.control_ids() == theirs.control_ids()
    for token in range(theirs.n_tokens):
        assert ours.token_bytes(token) == theirs.token_bytes(token), token
        assert ours.text(token) == theirs.text(token), token
    for text in TEXTS:
        for special in (False, True):
            expected = theirs.tokenize(text, special=special)
            assert ours.tokenize(text, special=special) == expected, (text, special)
            assert ours.detokenize(expected) == theirs.detokenize(expected)


def test_control_tokens_are_text_unless_special(gguf_files: dict[str, Path]) -> None:
    vocab = read_vocab(gguf_files["smollm"])
    assert vocab is not None
    end = vocab.tokenize("<|im_end|>", special=True)
    assert len(end) == 1 and end[0] in vocab.eog_ids()
    assert len(vocab.tokenize("<|im_end|>")) > 1


def test_other_tokenizers_are_left_to_llama_cpp(tmp_path: Path) -> None:
    path = write_deepseek4(tmp_path / "qwen.gguf", mode="scaled", tokenizer_pre="qwen2")
    assert read_vocab(path) is None


def test_mlx_engine_process_never_imports_llama_cpp(gguf_files: dict[str, Path]) -> None:
    pytest.importorskip("mlx")
    script = (
        "import sys\n"
        "from app.engine.mlx.backend import MlxEngine\n"
        "from app.engine.mlx.models import load_tokenizer\n"
        f"tok = load_tokenizer({str(gguf_files['smollm'])!r})\n"
        "assert tok.tokenize('Hi') and tok.grammar_tokenizer([2])\n"
        "heavy = sorted(m for m in ('llama_cpp', 'transformers', 'torch') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
