"""Loading a model for the MLX engine from a path: a GGUF file or an mlx-lm folder.

The architecture picks the code that builds the model (`registry`); the weights are then
put in the form the device runs fastest, and the tokenizer and chat template come from the
model itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

from app.engine.mlx.gguf_vocab import GGUFVocab, read_vocab
from app.engine.mlx.registry import FOLDER_MODULES, GGUF_BUILDERS
from app.engine.mlx.tokenizer import GGUFTokenizer, HFTokenizer, MlxTokenizer
from app.engine.model_file import check_gguf, fingerprint
from app.engine.protocol import ModelLoadError

if TYPE_CHECKING:
    from app.engine.llamacpp.backend import Vocab

GGUFBuilder = Callable[[dict[str, mx.array], dict[str, Any]], nn.Module]


@dataclass
class LoadedModel:
    """A model ready to run, and what ModelInfo needs to know about it."""

    model: nn.Module
    tokenizer: MlxTokenizer
    name: str
    architecture: str
    fingerprint: str
    n_ctx_train: int
    n_vocab: int
    chat_template: str | None
    bos_token: str
    eos_token: str
    add_bos: bool
    bos_id: int | None
    eog_ids: frozenset[int]
    size_bytes: int


def _import(target: str) -> Any:
    module, _, attribute = target.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


def load_tokenizer(model_path: str) -> MlxTokenizer:
    """The tokenizer alone (no weights), for building prompts in the app's process."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        return HFTokenizer(_check_folder(path))
    return GGUFTokenizer(gguf_vocab(check_gguf(path)))


def gguf_vocab(path: Path) -> GGUFVocab | Vocab:
    """A GGUF's tokenizer, rebuilt without llama.cpp where gguf_vocab knows it (the
    byte-level BPE ones), else through llama.cpp's vocab-only load."""
    vocab = read_vocab(path)
    if vocab is not None:
        return vocab
    from app.engine.llamacpp.backend import load_vocab

    return load_vocab(str(path))


def load_model(model_path: str) -> LoadedModel:
    """An mlx-lm folder or a GGUF file, loaded with its tokenizer and chat template."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        return _load_folder(_check_folder(path))
    return _load_gguf(check_gguf(path))


def _fit_device(model: nn.Module, *, gguf: bool) -> nn.Module:
    """Weights in the form this device runs fastest. MLX's CPU kernels for quantized
    matmuls are slower than its dense float32 ones, so on the CPU (Linux tests) quantized
    layers are expanded to float32, exactly (scales cast first); GPUs keep them packed.
    A GGUF keeps its norms in float32 beside float16 scales: on a GPU everything computes
    in float16, as the quantized layers do."""
    if mx.default_device() == mx.cpu:
        from mlx_lm.utils import dequantize_model

        model.set_dtype(mx.float32)
        return dequantize_model(model)
    if gguf:
        model.set_dtype(mx.float16)
    return model


def _load_gguf(path: Path) -> LoadedModel:
    from app.engine.mlx.gguf_llama import meta_value

    try:
        weights, metadata = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(
            f"Could not load the model {path.name}: MLX could not read it ({exc}). The file "
            "may be truncated or damaged, or hold tensor types MLX does not read (it reads "
            "F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, Q2_K); try the llama.cpp engine."
        ) from exc
    architecture = meta_value(metadata, "general.architecture")
    if not architecture or not weights:
        raise ModelLoadError(
            f"Could not load the model {path.name}: it names no architecture or holds no "
            "tensors. The file may be truncated or damaged; download it again."
        )
    target = GGUF_BUILDERS.get(architecture)
    if target is None:
        raise ModelLoadError(
            f"Could not load the model {path.name} with MLX: it is a {architecture!r} model "
            f"and MLX runs {', '.join(sorted(GGUF_BUILDERS))}. Choose the llama.cpp engine."
        )
    builder: GGUFBuilder = _import(target)
    model = _fit_device(builder(weights, metadata), gguf=True)
    vocab = gguf_vocab(path)
    bos, eos = vocab.bos, vocab.eos
    arch_key = f"{architecture}.context_length"
    return LoadedModel(
        model=model,
        tokenizer=GGUFTokenizer(vocab),
        name=meta_value(metadata, "general.name") or path.stem,
        architecture=architecture,
        fingerprint=fingerprint(path),
        n_ctx_train=int(meta_value(metadata, arch_key, 0)),
        n_vocab=vocab.n_tokens,
        chat_template=meta_value(metadata, "tokenizer.chat_template"),
        bos_token=vocab.text(bos),
        eos_token=vocab.text(eos),
        add_bos=vocab.add_bos,
        bos_id=bos if bos >= 0 else None,
        eog_ids=vocab.eog_ids(),
        size_bytes=path.stat().st_size,
    )


def _check_folder(folder: Path) -> Path:
    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        raise ModelLoadError(
            f"{folder} is a folder but not an MLX model (config.json plus .safetensors weights)."
        )
    return folder


def _model_classes(config: dict[str, Any]) -> tuple[type, type]:
    from mlx_lm.utils import _get_classes

    target = FOLDER_MODULES.get(config.get("model_type", ""))
    if target is None:
        return _get_classes(config)
    module = _import(target)
    return module.Model, module.ModelArgs


def _load_folder(folder: Path) -> LoadedModel:
    from mlx_lm.utils import load_model as mlx_lm_load_model

    try:
        model, config = mlx_lm_load_model(folder, get_model_classes=_model_classes)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"Could not load the model {folder.name}: {exc}") from exc
    model = _fit_device(model, gguf=False)
    tokenizer = HFTokenizer(folder)
    hf = tokenizer.hf
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=folder.name,
        architecture=str(config.get("model_type", "unknown")),
        fingerprint=fingerprint(folder),
        n_ctx_train=int(config.get("max_position_embeddings") or 0),
        n_vocab=len(hf),
        chat_template=hf.chat_template if isinstance(hf.chat_template, str) else None,
        bos_token=hf.bos_token or "",
        eos_token=hf.eos_token or "",
        add_bos=hf.bos_token_id is not None and bool(getattr(hf, "add_bos_token", False)),
        bos_id=hf.bos_token_id,
        eog_ids=frozenset(tokenizer.wrapper.eos_token_ids),
        size_bytes=size,
    )
